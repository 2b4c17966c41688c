"""The findings this project publishes about other runtimes, each with its standalone reproduction.

The store, docs/figures/findings.json, is written by hand: one entry per published finding, with
its target, what it is, its class and promise with the argument from the target's own documents,
the script under examples/repro/ that shows it (run by tests/test_repro_scripts.py in the target's
environment: exit 1 while the defect is there), and what that script printed when the entry was
written. README.md's block lists the upstream hermes-agent findings, docs/targets.md's block every
target's; both render each finding with the same function, so the two pages say the same words of
it. A finding without a script is not published: the store refuses one (`load`).
"""
from __future__ import annotations

from typing import Any

from docfigures.common import FIGURES, REPO, read_json

STORE = FIGURES / "findings.json"
REPRO = REPO / "examples" / "repro"
CLASSES = ("damage", "contract")
PROMISES = ("broken-promise", "documented-behaviour", "beyond-promise")  # supervisor.chaos.checker.verdict
# page -> (how it links to the repository root, which targets its block lists)
PAGES = {"README.md": ("", ("hermes-agent",)), "docs/targets.md": ("../", None)}


def load() -> dict[str, Any]:
    store = read_json(STORE)
    for f in store["findings"]:
        if f["class"] not in CLASSES or f["promise"] not in PROMISES:
            raise ValueError(f"{f['script']}: class {f['class']!r} / promise {f['promise']!r} is not one of ours")
        if not (REPRO / f["script"]).is_file():
            raise ValueError(f"{f['script']}: no such script under examples/repro (no script, no finding)")
    return store


def finding_line(f: dict[str, Any], root: str) -> str:
    """One finding, in the words both pages use."""
    path = f"examples/repro/{f['script']}"
    return (f"- **{f['title']}** (`{f['class']}`, `{f['promise']}`). {f['what']} Why `{f['promise']}`: "
            f"{f['argument']} Reproduction: [`{path}`]({root}{path}) ({f['runs_with']}); {f['observed']}")


def render(store: dict[str, Any], root: str, targets: tuple[str, ...] | None) -> str:
    lines = [""]
    labels = store["targets"]
    for target in labels:
        if targets is not None and target not in targets:
            continue
        found = [f for f in store["findings"] if f["target"] == target]
        if targets is None:
            lines += [f"{labels[target]}:", ""]
        lines += [finding_line(f, root) for f in found] + [""]
    return "\n".join(lines)


def block(page: str) -> str:
    """The findings block of `page` (a path from the repository root)."""
    root, targets = PAGES[page]
    return render(load(), root, targets)
