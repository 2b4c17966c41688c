"""Every finding this project publishes about another runtime has a standalone reproduction under
examples/repro/<target>/ (that library's public API, the standard library, a loopback model server
of its own, a SIGKILL); each is run here in its target's environment and must exit 1 (the defect
is still there, as published) with output naming the damage. A script that starts exiting 0 means
the library changed: the published finding must be revisited, not the test loosened."""
from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from procutil import stop_tree

REPO = Path(__file__).resolve().parents[1]
REPRO = REPO / "examples" / "repro"
STORE = REPO / "docs" / "figures" / "findings.json"  # what README.md and docs/targets.md publish (docfigures.findings)
PUBLISHED_IN = (REPO / "README.md", REPO / "docs" / "targets.md")


@dataclass(frozen=True)
class Script:
    script: str  # under examples/repro/
    module: str  # what must be importable to run it
    damage: tuple[str, ...]  # what its output says of each finding it shows, while the defect is there

    @property
    def path(self) -> Path:
        return REPRO / self.script


def _scripts() -> tuple[Script, ...]:
    """The published findings, one script each (a script may show more than one)."""
    by_script: dict[str, Script] = {}
    for f in json.loads(STORE.read_text(encoding="utf-8"))["findings"]:
        known = by_script.get(f["script"])
        phrases = (known.damage if known else ()) + (f["damage"],)
        by_script[f["script"]] = Script(f["script"], f["module"], phrases)
    return tuple(by_script.values())


SCRIPTS = _scripts()


def _marks(script: Script) -> list[pytest.MarkDecorator]:
    if script.module == "run_agent":  # scripts/test runs these in the environment with hermes-agent
        return [pytest.mark.chaos, pytest.mark.upstream]
    missing = importlib.util.find_spec(script.module) is None
    return [pytest.mark.chaos, pytest.mark.skipif(missing, reason=f"{script.module} is not installed here")]


def test_every_script_is_a_listed_finding_and_linked_where_it_is_published() -> None:
    on_disk = {p.relative_to(REPRO).as_posix() for p in REPRO.rglob("*.py")}
    assert on_disk == {s.script for s in SCRIPTS}
    published = "\n".join(p.read_text(encoding="utf-8") for p in PUBLISHED_IN)
    for script in SCRIPTS:
        assert f"examples/repro/{script.script}" in published, f"{script.script} is linked from no published text"


def test_every_script_imports_only_its_library_and_the_standard_library() -> None:
    """Standalone means standalone: nothing of this project (its packages would make a finding
    ours, not the library's)."""
    ours = {"hermes", "supervisor", "worker", "testkit", "targetkit", "examples", "bench", "tests"}
    for script in SCRIPTS:
        tree = ast.parse(script.path.read_text(encoding="utf-8"))
        imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and node.module and not node.level}
        assert not imported & ours, f"{script.script} imports this project's {sorted(imported & ours)}"


@pytest.mark.parametrize("script", [pytest.param(s, id=s.script, marks=_marks(s)) for s in SCRIPTS])
def test_the_script_still_shows_what_is_published(script: Script, tmp_path: Path) -> None:
    # Its own session, so a hung script and the children it started are stopped by recorded pid;
    # a temporary directory of its own, which it must leave as it found it (empty).
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = subprocess.Popen([sys.executable, str(script.path)], cwd=REPO, start_new_session=True,
                            env={**os.environ, "TMPDIR": str(scratch)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        stop_tree(proc)
        pytest.fail(f"{script.script} did not finish")
    assert proc.returncode == 1, f"{script.script} exited {proc.returncode} (1 = the defect is still there):\n{out}"
    for phrase in script.damage:
        assert phrase in out, f"{script.script} no longer says {phrase!r}:\n{out}"
    assert not list(scratch.iterdir()), f"{script.script} left {sorted(p.name for p in scratch.iterdir())} behind"
