"""The HTTP soak of scripts/soak_http.py, scaled to CI: clients over HTTP under worker kills and one daemon SIGKILL."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_every_client_sees_its_durable_rows_once_under_worker_and_daemon_kills(
        tmp_path: Path, load_script: Callable[[str], ModuleType]) -> None:
    soak = load_script("soak_http")
    result = soak.run_http_soak(soak.HttpSoakConfig(turns=60, clients=6, sessions=10, workers=2, window=2,
                                                    kill_min_ms=100, kill_max_ms=1000, daemon_kills=1, seed=7,
                                                    workdir=tmp_path / "soak", timeout=240))
    print(result.summary())
    assert result.ok, "\n".join(result.problems)
    assert result.done == 60 and result.failed == 0
    assert result.daemon_kills == 1 and result.reconnects >= 1
    assert result.processes_seen > 2 and result.survivors == []
