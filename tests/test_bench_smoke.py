"""`scripts/bench.py --quick` runs to its end and prints its table. Nothing here is about speed:
the figures depend on the machine and its load, and PASS/FAIL is the bench's own report.

The README's performance block and long memory run are rendered from the bench's printed table and
its `--json` file (docfigures.bench): the rows they read must keep their names, and the
memory figure its data."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sampling import NIGHTLY

REPO = Path(__file__).resolve().parent.parent
TIMEOUT_S = 900


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
@NIGHTLY  # the quick bench takes a minute of both cores; tests/test_bench_*.py check its parts in CI
def test_quick_bench_runs_and_prints_its_table(tmp_path: Path) -> None:
    env = dict(os.environ, NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost",
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    proc = subprocess.Popen([sys.executable, str(REPO / "scripts" / "bench.py"), "--quick", "--dir", str(tmp_path),
                             "--json", str(tmp_path / "bench.json")],
                            cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    pid = proc.pid  # its own session and process group, so the group id is this pid
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(pid, signal.SIGKILL)  # by the recorded pid: the bench and its daemon
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        pytest.fail(f"bench --quick did not finish in {TIMEOUT_S}s; stderr tail: {err[-2000:]}")
    assert proc.returncode == 0, f"exit {proc.returncode}; stderr tail: {err[-3000:]}"
    lines = out.splitlines()
    assert any(line.startswith("machine: ") and "sqlite" in line and "fs " in line for line in lines), out
    header = next((line for line in lines if line.startswith("figure")), None)
    assert header is not None and header.split() == ["figure", "value", "reference", "ratio", "target", "result"], out
    rows = lines[lines.index(header) + 2:]
    for name in ("flush 1 msg", "resume:", "recovery:", "recovery stage: kill -> reaped",
                 "recovery stage: request built -> at the server", "pool floor:", "campaign single-tool",
                 "campaign single-tool: CPU per case, workers", "campaign demo", "supervisor RSS"):
        assert any(row.startswith(name) for row in rows), f"no {name!r} row in:\n{out}"
    # The machine's floor, measured in the same run by both sections it judges, and the peers.
    for name in ("floor (recovery): bare fork", "floor (recovery): fsynced commit",
                 "floor (recovery): loopback HTTP round trip, kept connection", "floor (recovery): warm-template fork",
                 "floor (campaign): warm-template fork cycles/s", "recovery: kill -> resumed model request vs the "
                 "machine's floor", "pool floor vs the warm-template fork floor", "campaign single-tool vs the "
                 "warm-template fork floor", "peers: ours", "peers: LangGraph", "peers: Agents SDK",
                 "campaign single-tool, user target example-loop-fixed vs ours: cost per case"):
        assert any(row.startswith(name) for row in rows), f"no {name!r} row in:\n{out}"
    assert any(row.startswith(("daemon:", "upstream")) for row in rows), out
    assert "error" not in " ".join(row.split("  ")[0] for row in rows), out  # no section crashed
    # What the docs' stored blocks read of a bench run (docfigures.bench).
    from docfigures import bench as readers

    table = readers.parse_table(out)
    for name in (readers.RECOVERY, readers.FRESH, readers.FLOOR, readers.SINGLE,
                 *[readers.CPU + part for part in readers.CPU_PARTS]):
        table.row(name)
    assert table.matching(readers.DEMO) and table.matching(readers.RSS), out
    assert [n for n in table.rows if n.startswith(readers.STAGE)], out
    memory = readers.memory_from_bench_json(json.loads((tmp_path / "bench.json").read_text()))
    assert memory["cases"] > 0 and set(memory["rss_mib"]) == {"10%", "50%", "100%"}, memory
