#!/usr/bin/env python3
"""Measure the figures the docs show and rewrite their marked blocks.

README.md links to the pages that hold the blocks: docs/performance.md (figures, performance,
memory), docs/targets.md (upstream, targets) and docs/scale.md (proof).

    python scripts/readme_figures.py            # run, store the bench's output, rewrite every block in its page
    python scripts/readme_figures.py --print    # run, print the block, touch nothing
    python scripts/readme_figures.py --check    # run, exit 1 if a page's blocks differ
    ... --no-bench                               # do not run the bench: its part comes from the stored run
    python scripts/readme_figures.py --stored   # run nothing: render every stored block into its page
    python scripts/readme_figures.py --check --stored   # run nothing: exit 1 if a stored block differs
    python scripts/readme_figures.py --store-memory     # run the long memory check, store it, render
    python scripts/readme_figures.py --store-upstream   # run the campaigns against both targets
                                                        # (needs the [upstream] extra), store them
    ... --store-upstream double                          # run just the named modes, keep the others

Upstream figures: the campaigns against upstream hermes-agent take many minutes, so they are
run on demand (``--store-upstream``) and their condensed reports stored in
``docs/figures/upstream.json``. Every run of this script renders the upstream block of docs/targets.md
(between ``<!-- upstream:begin -->`` and ``<!-- upstream:end -->``) from that stored file, and
``--check`` (and ``tests/test_readme_figures.py``) compare it exactly.

Stored figures (rendered the same way, compared exactly): the full bench's table
(``docs/figures/bench.json``), the performance targets and the long memory run rendered from it
(``scripts/bench_figures.py``: ``<!-- performance:begin -->``, ``<!-- memory:begin -->``), the
campaign-at-scale proof (``scripts/proof_figures.py``, ``docs/figures/proof.json``:
``<!-- proof:begin -->``) and the targets table (``scripts/target_figures.py``).

The block sits between ``<!-- figures:begin -->`` and ``<!-- figures:end -->`` in docs/performance.md.
It holds two parts:

* chaos figures from the quick variant of the exhaustive campaign (two scenarios, run as
  ``python -m supervisor chaos`` exactly as a user would): cases, kills landed and other deaths, kill
  points covered, violations (exact counts: the scripted model makes them deterministic, and our
  runtime's commits leave no race for a kill to fall into either way),
  and cases per second and wall time (timings);
* the benchmark table printed by ``python scripts/bench.py`` (the full bench), rendered from its
  stored run (``docs/figures/bench.json``, with the date it ran), which a run of this script
  without ``--no-bench`` or ``--stored`` replaces.

The full bench also redraws the charts of docs/performance.md (``docs/figures/flush-vs-rows.svg`` and
``docs/figures/recovery-latency.svg``, next to the block) when matplotlib is installed (the
``bench`` extra); its line saying where they went, or why not, is passed on to stderr.

Every timing-dependent value of the chaos part is written with a leading ``~`` (``~5.02``),
and only those: :func:`normalize` replaces them, so a check compares every count exactly
and every timing by its shape. The bench part is compared exactly with its store.
``tests/test_readme_figures.py`` runs the campaign afresh and compares.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run as a file: `hermes` must import from this checkout
sys.path.append(str(Path(__file__).resolve().parent))  # last: `bench` stays the package, not scripts/bench.py
import bench_figures  # noqa: E402  (the bench's stored table, the performance targets, the long memory run)
import proof_figures  # noqa: E402  (the campaign-at-scale proof: its own store)
import target_figures  # noqa: E402  (the targets table: its own store, rendered into docs/targets.md)
from target_figures import condense  # noqa: E402

PAGE = REPO / "docs" / "performance.md"  # the figures block (bench_figures.PAGE holds the bench's blocks)
UPSTREAM_PAGE = REPO / "docs" / "targets.md"  # the upstream block (target_figures.PAGE holds the targets block)
BEGIN, END = "<!-- figures:begin -->", "<!-- figures:end -->"
BENCH_MARK = "<!-- figures:bench -->"
SCENARIOS = ("single-tool", "writes")
JOBS = 2
CHAOS_ARGS = ("chaos", "--mode", "exhaustive", *[a for s in SCENARIOS for a in ("--scenario", s)],
              "--jobs", str(JOBS))
BENCH_SCRIPT = REPO / "scripts" / "bench.py"
BENCH_ARGS: tuple[str, ...] = ()  # the full bench: the docs show measurements, not smoke sizes
BENCH_COMMAND = " ".join(("python scripts/bench.py", *BENCH_ARGS))
MEMORY_ARGS = ("--long", "--only", "memory", "--no-charts")
CAMPAIGN_TIMEOUT_S = 600.0
BENCH_TIMEOUT_S = 1800.0
TIMING = re.compile(r"~\d+(?:\.\d+)?")
UPSTREAM_BEGIN, UPSTREAM_END = "<!-- upstream:begin -->", "<!-- upstream:end -->"
UPSTREAM_STORE = REPO / "docs" / "figures" / "upstream.json"
# (mode, extra arguments): the campaigns the upstream tables compare, each run on both targets.
UPSTREAM_MODES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("exhaustive", ()), ("pause", ()), ("random", ("--runs", "200", "--seed", "2026")), ("double", ()))
UPSTREAM_TIMEOUT_S = 3 * 3600.0  # double mode against upstream: thousands of cases, two kills each
BENCH_ABSENT = ("Benchmarks: the bench table is produced by `scripts/bench.py` (`python scripts/bench.py`); "
                "no run of it is stored in docs/figures/bench.json.")


# ---------------------------------------------------------------------------- running
def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run a child in its own session; on timeout kill its process group by the recorded pid."""
    env = dict(os.environ, NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return subprocess.CompletedProcess(argv, -signal.SIGKILL, out, err + f"\ntimed out after {timeout:.0f}s")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def chaos_figures(report_dir: Path | None = None) -> dict[str, Any]:
    """Run the quick campaign; return its figures (raises RuntimeError if it wrote no report)."""
    from hermes.probes import POINTS

    with tempfile.TemporaryDirectory(prefix="readme-figures-") as tmp:
        directory = Path(report_dir) if report_dir else Path(tmp) / "report"
        done = _run([sys.executable, "-m", "supervisor", *CHAOS_ARGS, "--report", str(directory)], CAMPAIGN_TIMEOUT_S)
        path = directory / "report.json"
        if not path.exists():
            raise RuntimeError(f"the campaign wrote no report (exit {done.returncode})\n{done.stdout[-3000:]}\n"
                               f"{done.stderr[-3000:]}")
        report = json.loads(path.read_text(encoding="utf-8"))
    points = report["points"]
    return {"cases": report["cases"], "kills": report["kills"], "other_deaths": report.get("other_deaths") or {},
            "no_kill": report["no_kill"], "covered": sum(1 for p in POINTS if points.get(p, {}).get("hit")), "points": len(POINTS),
            "violations": len(report["violations"]), "unfired": len(report["unfired"]),
            "cycles_per_second": report.get("cycles_per_second"), "wall_seconds": report.get("wall_seconds"),
            "exit": done.returncode}


def bench_available() -> bool:
    return BENCH_SCRIPT.is_file()


def run_bench() -> bool:
    """Run the full bench and store its printed table first in docs/figures/bench.json.

    False (the store untouched) when it failed: a failed run never replaces a measured one."""
    if not bench_available():
        return False
    done = _run([sys.executable, str(BENCH_SCRIPT), *BENCH_ARGS], BENCH_TIMEOUT_S)
    for line in done.stderr.splitlines():
        if line.startswith("bench: charts:"):
            print(line, file=sys.stderr)  # the SVGs next to the block: redrawn, or why not
    if done.returncode != 0 or not done.stdout.strip():
        print(f"warning: `{BENCH_COMMAND}` exited with status {done.returncode}: the stored run is kept\n"
              f"{done.stderr[-3000:]}", file=sys.stderr)
        return False
    bench_figures.store_bench_run(done.stdout, command=BENCH_COMMAND)
    return True


def bench_part() -> str:
    """The bench table as the docs show it: the stored run's, verbatim, with its command and date."""
    if not bench_figures.BENCH_STORE.exists():
        return BENCH_ABSENT
    return bench_figures.bench_part(bench_figures.read_json(bench_figures.BENCH_STORE))


def store_memory() -> dict[str, Any]:
    """Run the long memory check (`scripts/bench.py --long --only memory`) and store its figures."""
    with tempfile.TemporaryDirectory(prefix="readme-memory-") as tmp:
        path = Path(tmp) / "bench.json"
        done = _run([sys.executable, str(BENCH_SCRIPT), *MEMORY_ARGS, "--json", str(path)], BENCH_TIMEOUT_S)
        if done.returncode != 0 or not path.exists():
            raise RuntimeError(f"the memory check failed (exit {done.returncode})\n{done.stderr[-3000:]}")
        data = json.loads(path.read_text(encoding="utf-8"))
    stored = bench_figures.memory_from_bench_json(data)
    bench_figures.write_json(bench_figures.MEMORY_STORE, stored)
    return stored


# ---------------------------------------------------------------------------- the block
def _timing(value: float | None, digits: int = 2) -> str:
    return "~?" if value is None else f"~{value:.{digits}f}"


def render_chaos(f: dict[str, Any]) -> str:
    command = "hermes-supervisor " + " ".join(CHAOS_ARGS)
    rows = [("cases (fault-free runs + one per kill)", str(f["cases"])),
            ("kills the nemesis planned that landed", str(f["kills"])),
            ("other worker deaths (by cause)", ", ".join(f"{k} {n}" for k, n in f["other_deaths"].items()) or "0"),
            ("planned kills that killed nothing (no-kill)", str(f["no_kill"])),
            ("kill points covered", f"{f['covered']} of {f['points']}"),
            ("violations", str(f["violations"])),
            ("planned kills that never fired", str(f["unfired"])),
            ("cycles per second (cases/s, wall clock)", _timing(f["cycles_per_second"])),
            ("wall time (s)", _timing(f["wall_seconds"], 1))]
    lines = ["The quick exhaustive chaos campaign, run as a user would run it:", "", "```sh", command, "```", "",
             "Counts are exact (the scripted model makes them deterministic); values marked `~` are timings",
             "on the machine that generated this block. Regenerate with `python scripts/readme_figures.py`.", "",
             "| figure | value |", "| --- | --- |", *[f"| {k} | {v} |" for k, v in rows]]
    return "\n".join(lines)


def render(chaos: dict[str, Any], bench: str) -> str:
    return "\n".join([BEGIN, "<!-- generated by scripts/readme_figures.py: do not edit by hand -->",
                      render_chaos(chaos), "", BENCH_MARK, bench, END])


def read_block(text: str) -> str:
    """The marked block of a page's text, markers included (ValueError if it has none)."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the page has no {BEGIN} ... {END} block")
    return text[start:end + len(END)]


def split_block(block: str) -> tuple[str, str]:
    """(chaos part, bench part) of a block."""
    head, mark, tail = block.partition(BENCH_MARK)
    if not mark:
        raise ValueError(f"the figures block has no {BENCH_MARK} line")
    return head, tail.removesuffix(END).strip("\n")


def with_bench_part(block: str, bench: str) -> str:
    """The figures block with its bench part replaced (its chaos part kept as it is)."""
    head, mark, _ = block.partition(BENCH_MARK)
    if not mark:
        raise ValueError(f"the figures block has no {BENCH_MARK} line")
    return f"{head}{BENCH_MARK}\n{bench}\n{END}"


def normalize(text: str) -> str:
    """The text with every timing value replaced by one placeholder: what a check compares."""
    return TIMING.sub("~N", text)


def replace_block(text: str, block: str) -> str:
    current = read_block(text)
    return text.replace(current, block, 1)


# ---------------------------------------------------------------------------- upstream
def upstream_command(mode: str, extra: tuple[str, ...]) -> list[str]:
    return ["chaos", "--mode", mode, *[a for s in SCENARIOS for a in ("--scenario", s)], *extra,
            "--jobs", str(JOBS)]


def store_upstream(modes: list[str]) -> dict[str, Any]:
    """Run the named comparison campaigns (all when none are named) on both targets; write the store.

    Modes not named keep their stored figures, so one slow mode can be measured again alone; each
    mode carries the 1-minute load at its start and end, since its wall times mean little without it.
    """
    from importlib.metadata import version

    installed = version("hermes-agent")
    stored: dict[str, Any] = {"campaigns": {}, "load_1m": {}}
    if modes:
        # Checked before the long runs, not after: the block needs every mode, and one version.
        stored = json.loads(UPSTREAM_STORE.read_text(encoding="utf-8")) if UPSTREAM_STORE.exists() else stored
        loads = stored.get("load_1m") if isinstance(stored.get("load_1m"), dict) else {}  # older stores: one pair
        missing = [m for m, _ in UPSTREAM_MODES if m not in modes and (m not in stored["campaigns"] or m not in loads)]
        if missing:
            raise RuntimeError(f"the store has no {', '.join(missing)}: name it too, or measure every mode "
                               "(--store-upstream with no mode)")
        if stored.get("hermes_agent") != installed:
            raise RuntimeError(f"the store holds hermes-agent {stored.get('hermes_agent')}, {installed} is installed: "
                               "measure every mode again (--store-upstream with no mode)")
    stored.update(hermes_agent=installed, scenarios=list(SCENARIOS), jobs=JOBS, cores=os.cpu_count())
    for mode, extra in UPSTREAM_MODES:
        if modes and mode not in modes:
            continue
        begin = round(os.getloadavg()[0], 2)
        for target in ("hermes-agent", "hermes"):
            with tempfile.TemporaryDirectory(prefix="readme-upstream-") as tmp:
                argv = upstream_command(mode, extra) + ["--target", target, "--report", tmp]
                done = _run([sys.executable, "-m", "supervisor", *argv], UPSTREAM_TIMEOUT_S)
                path = Path(tmp) / "report.json"
                if not path.exists():
                    raise RuntimeError(f"{' '.join(argv)} wrote no report (exit {done.returncode})\n"
                                       f"{done.stderr[-3000:]}")
                report = json.loads(path.read_text(encoding="utf-8"))
            stored["campaigns"].setdefault(mode, {})[target] = condense(report, report.get("wall_seconds"))
            print(f"{target} {mode}: {report['cases']} cases, {len(report['violations'])} violations", file=sys.stderr)
        stored["load_1m"][mode] = [begin, round(os.getloadavg()[0], 2)]
    UPSTREAM_STORE.parent.mkdir(parents=True, exist_ok=True)
    UPSTREAM_STORE.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return stored


def _side(c: dict[str, Any]) -> str:
    by_class = c["by_class"]
    return (f"{c['cases']:,} / {c['kills']:,} / {c['no_kill']:,} / {c['violations']:,} "
            f"({by_class['damage']:,} damage, {by_class['contract']:,} contract) / {c['wall_seconds']:,.0f} s")


def _points_table(title: str, upstream: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    from hermes.probes import POINTS

    names = [p for p in POINTS if p in ours["points"]]  # the store sorts its keys: show them in probe order
    width = max(len(n) for n in names + ["kill point"])
    head = f"{'kill point':<{width}}  hit  cases  violations  hit  cases  violations"
    lines = [title, f"{'upstream hermes-agent':<{width + 26}}ours (--target hermes)", head,
             f"{'-' * width}  ---  -----  ----------  ---  -----  ----------"]
    for name in names:
        cells = []
        for side in (upstream, ours):
            hit, cases, violations = side["points"].get(name, [False, 0, 0])
            cells.append(f"{'yes' if hit else ('-' if not cases else 'NO'):>3}  {cases:>5}  {violations:>10}")
        lines.append(f"{name:<{width}}  {cells[0]}  {cells[1]}")
    return lines


def render_upstream(stored: dict[str, Any]) -> str:
    """The upstream block (docs/targets.md), from the stored campaigns alone."""
    runs = stored["campaigns"]
    version = stored["hermes_agent"]
    lines = [UPSTREAM_BEGIN, "<!-- generated by scripts/readme_figures.py from docs/figures/upstream.json: "
             "do not edit by hand -->",
             f"Measured on hermes-agent {version} next to ours, on {' and '.join(stored['scenarios'])} "
             f"(`--jobs {stored['jobs']}`; counts are those of one stored run, not repeated: a kill that races "
             "upstream's own writes may fall differently in another; wall times are from the machine that stored them, "
             f"{stored['cores']} cores, at the 1-minute load shown as it was when the mode began and ended). "
             "Each side reads cases / landed kills / no-kill cases / violations (by class) / wall:", "",
             "| mode | command (add `--target hermes-agent` for upstream) | upstream | ours | load |",
             "| --- | --- | --- | --- | --- |"]
    for mode, extra in UPSTREAM_MODES:
        pair = runs[mode]
        command = "hermes-supervisor " + " ".join(upstream_command(mode, extra))
        begin, end = stored["load_1m"][mode]
        lines.append(f"| {mode} | `{command}` | {_side(pair['hermes-agent'])} | {_side(pair['hermes'])} "
                     f"| {begin} → {end} |")
    invariants = sorted({(inv, kind) for mode, _ in UPSTREAM_MODES
                         for inv, classes in runs[mode]["hermes-agent"]["by_invariant"].items() for kind in classes})
    lines += ["", "Upstream's violations by invariant and class (violations, in how many cases):", "",
              "| invariant | class | " + " | ".join(mode for mode, _ in UPSTREAM_MODES) + " |",
              "| --- | --- | " + " | ".join("---" for _ in UPSTREAM_MODES) + " |"]
    for inv, kind in invariants:
        cells = []
        for mode, _ in UPSTREAM_MODES:
            n, cases = runs[mode]["hermes-agent"]["by_invariant"].get(inv, {}).get(kind, [0, 0])
            cells.append(f"{n:,} in {cases:,}" if n else "0")
        lines.append(f"| `{inv}` | {kind} | " + " | ".join(cells) + " |")
    first = UPSTREAM_MODES[0][0]
    lines += ["", f"The kill-point table of the {first} campaign, upstream on the left, ours on the right:", "",
              "```text", *_points_table(f"{first} mode", runs[first]["hermes-agent"], runs[first]["hermes"]), "```",
              "", "<details><summary>The same table for the other modes</summary>", ""]
    for mode, extra in UPSTREAM_MODES[1:]:
        lines += ["```text", *_points_table(f"{mode} mode {' '.join(extra)}".strip(), runs[mode]["hermes-agent"],
                                            runs[mode]["hermes"]), "```", ""]
    lines += ["</details>", UPSTREAM_END]
    return "\n".join(lines)


def read_upstream_block(text: str) -> str:
    start, end = text.find(UPSTREAM_BEGIN), text.find(UPSTREAM_END)
    if start < 0 or end < start:
        raise ValueError(f"the page has no {UPSTREAM_BEGIN} ... {UPSTREAM_END} block")
    return text[start:end + len(UPSTREAM_END)]


def upstream_block() -> str:
    return render_upstream(json.loads(UPSTREAM_STORE.read_text(encoding="utf-8")))


def _read(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def stored_blocks() -> list[tuple[str, str, str]]:
    """(name, the block as its page holds it, the block rendered from its store) of every stored block."""
    figures = read_block(_read(PAGE))
    bench_page = _read(bench_figures.PAGE)
    return [("upstream (docs/figures/upstream.json)", read_upstream_block(_read(UPSTREAM_PAGE)), upstream_block()),
            ("targets (docs/figures/targets.json)", target_figures.read_block(_read(target_figures.PAGE)),
             target_figures.block()),
            ("bench part (docs/figures/bench.json)", figures, with_bench_part(figures, bench_part())),
            *[(f"{begin} (docs/figures/bench.json, memory.json)", bench_figures.read_marked(bench_page, begin, end),
               block) for begin, end, block in bench_figures.blocks()],
            ("proof (docs/figures/proof.json)", proof_figures.read_block(_read(proof_figures.PAGE)),
             proof_figures.block())]


def _stored_steps() -> list[tuple[Path, Any]]:
    """(page, a function rendering one of its stored blocks into its text) for every stored block."""
    return [(UPSTREAM_PAGE, lambda text: text.replace(read_upstream_block(text), upstream_block(), 1)),
            (target_figures.PAGE, lambda text: text.replace(target_figures.read_block(text), target_figures.block(), 1)),
            (PAGE, lambda text: text.replace(read_block(text), with_bench_part(read_block(text), bench_part()), 1)),
            (bench_figures.PAGE, bench_figures.with_blocks),
            (proof_figures.PAGE, proof_figures.with_block)]


def with_stored_blocks(page: Path, text: str) -> str:
    """`text`, the text of `page`, with every stored block that page holds (upstream, targets, the bench
    part, performance, memory, proof) rendered from its store."""
    for owner, step in _stored_steps():
        if owner == page:
            text = step(text)
    return text


def write_stored_blocks() -> None:
    """Render every stored block into its page, each page read just before it is written (an edit
    made meanwhile, say during a long run, is kept)."""
    for page in dict.fromkeys(owner for owner, _ in _stored_steps()):
        text = _read(page)
        rendered = with_stored_blocks(page, text)
        if rendered != text:
            page.write_text(rendered, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--print", action="store_true", help="print the block, do not touch any page")
    action.add_argument("--check", action="store_true", help="exit 1 if docs/performance.md's block differs from a fresh run")
    parser.add_argument("--no-bench", action="store_true", help="do not run the bench: render its stored run")
    parser.add_argument("--stored", action="store_true",
                        help="run nothing: render (or with --check, compare) only the blocks kept in docs/figures")
    action.add_argument("--store-memory", action="store_true",
                        help="run the long memory check (scripts/bench.py --long --only memory), store it, render")
    action.add_argument("--store-upstream", nargs="*", metavar="MODE", choices=[m for m, _ in UPSTREAM_MODES],
                        help="run the campaigns (all, or the named modes) against upstream hermes-agent and ours, "
                             "store them, render the block")
    args = parser.parse_args(argv)
    if args.store_upstream is not None:
        store_upstream(args.store_upstream)
        write_stored_blocks()  # read after the long runs: an edit made meanwhile must not be lost
        return 0
    if args.store_memory:
        store_memory()
        write_stored_blocks()
        return 0
    if args.check:
        differ = [name for name, current, rendered in stored_blocks() if current != rendered]
        if differ:
            print(f"stored blocks differ from their stores: {'; '.join(differ)}: "
                  "run `python scripts/readme_figures.py --stored`")
            return 1
        if args.stored:
            print("every stored block matches its store")
            return 0
    if args.stored:
        if args.print:
            print("\n\n".join(rendered for _, _, rendered in stored_blocks()))
        else:
            write_stored_blocks()
        return 0
    text = with_stored_blocks(PAGE, _read(PAGE))
    chaos = chaos_figures()
    if chaos["violations"] or chaos["unfired"]:
        print(f"warning: the campaign did not pass (exit {chaos['exit']})", file=sys.stderr)
    if not (args.no_bench or args.check or args.print):
        run_bench()
    block = render(chaos, bench_part())
    if args.print:
        print(block)
        return 0
    if args.check:
        current_chaos, current_bench = split_block(read_block(text))
        same = normalize(current_chaos) == normalize(split_block(block)[0]) and current_bench == bench_part()
        print("the figures are current" if same else f"the figures differ from a fresh run:\n{block}")
        return 0 if same else 1
    # Read again: the bench takes minutes, and an edit made meanwhile must not be lost.
    write_stored_blocks()
    PAGE.write_text(replace_block(_read(PAGE), block), encoding="utf-8")
    print(block)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
