"""The soak of scripts/soak.py, scaled to CI: random worker kills plus one daemon SIGKILL."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_every_turn_is_done_exactly_once_under_worker_and_daemon_kills(
        tmp_path: Path, load_script: Callable[[str], ModuleType]) -> None:
    soak = load_script("soak")
    # The full soak kills one of 4 workers every 50-500 ms; with 2 workers, 100-1000 ms keeps each
    # worker under the same kill rate (a worker needs ~0.2 s for a turn, ~0.1 s of it to start).
    result = soak.run_soak(soak.SoakConfig(workers=2, turns=40, sessions=8, kill_min_ms=100, kill_max_ms=1000,
                                           daemon_kills=1, seed=7, workdir=tmp_path / "soak", timeout=55))
    print(result.summary())
    assert result.ok, "\n".join(result.problems)
    assert result.done == 40 and result.failed == 0
    assert result.kills > 0 and result.daemon_kills == 1
    assert result.orphan_exit_seconds[0] < 5.0
    assert result.processes_seen > 2 and result.survivors == []
    assert result.violations == []
