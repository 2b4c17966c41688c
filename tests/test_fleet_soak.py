"""The fleet soak of scripts/fleet_soak.py, scaled to CI: two daemons on one PostgreSQL store, random
worker kills, one daemon SIGKILL and one crash-restart of the server."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from pgfixtures import require_psycopg


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_a_fleet_does_every_turn_exactly_once_under_worker_daemon_and_server_kills(
        tmp_path: Path, load_script: Callable[[str], ModuleType], capsys: pytest.CaptureFixture[str]) -> None:
    require_psycopg()  # without it (or the server binaries) the soak reports why, and this fails with it
    soak = load_script("fleet_soak")
    # As tests/test_soak.py: with 2 workers a daemon, 100-1000 ms between kills keeps each worker under
    # about the full soak's kill rate.
    code = soak.main(["--turns", "60", "--sessions", "10", "--daemons", "2", "--workers", "2",
                      "--daemon-kills", "1", "--server-restarts", "1", "--kill-min-ms", "100", "--kill-max-ms", "1000",
                      "--seed", "7", "--timeout", "60", "--workdir", str(tmp_path / "soak"), "--json"])
    out = capsys.readouterr().out
    assert code == 0, out[-4000:]
    summary = next(line for line in out.splitlines() if line.startswith(("OK:", "FAILED:")))
    assert summary.startswith("OK: 60/60 turns done (0 failed) by 2 daemons x 2 workers"), summary
    assert "1 daemon SIGKILL(s)" in summary and "1 server restart(s)" in summary, summary
    assert "0 left; cluster stopped" in summary, summary
    assert "problem:" not in out
    result = json.loads(out[: out.index(summary)])
    assert result["kills"] > 0 and result["daemon_kills"] == 1 and result["server_restarts"] == 1
    assert result["processes_seen"] > 2 and result["survivors"] == [] and result["cluster_stopped"] is True
