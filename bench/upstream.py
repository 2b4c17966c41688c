"""upstream: upstream hermes-agent's flush on the same workload as ours, when it is installed."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.flush import FlushSide, appended, interleave, message
from bench.table import Figure, Report, median


class _UpstreamSide:
    """Upstream hermes-agent's AIAgent._flush_messages_to_session_db on its own SessionDB (as its tests set it up)."""

    def __init__(self, path: Path, prior: int) -> None:
        from unittest.mock import patch

        import hermes_state  # type: ignore[import-not-found]
        import run_agent  # type: ignore[import-not-found]

        # One home for every upstream side of the run: upstream installs its log file handler
        # once per process, so the home must outlive each side's own directory.
        home = path.parent.parent / "upstream-home"
        (home / "logs").mkdir(parents=True, exist_ok=True)
        with patch("run_agent.OpenAI"), patch("run_agent._hermes_home", home), \
                patch("run_agent.check_toolset_requirements", return_value={}), \
                patch("run_agent.get_tool_definitions", return_value=[]):
            self.agent = run_agent.AIAgent(api_key="unused", base_url="http://127.0.0.1:9/v1", quiet_mode=True,
                                           skip_context_files=True, skip_memory=True)
        self.db = hermes_state.SessionDB(db_path=path)
        self.db.create_session(session_id=FlushSide.SESSION, source="bench", model="bench-model")
        agent = self.agent
        agent._session_db, agent._session_db_created, agent.session_id = self.db, True, FlushSide.SESSION
        agent._last_flushed_db_idx, agent._flushed_db_message_ids = 0, set()
        agent._flushed_db_message_session_id, agent._persist_disabled = None, False
        self.messages = [{k: v for k, v in message(i, "t").items() if not k.startswith("_")} for i in range(prior)]
        agent._flush_messages_to_session_db(self.messages)

    def sample(self) -> float:
        msg = {k: v for k, v in appended("t").items() if not k.startswith("_")}
        self.messages.append(msg)
        t0 = time.perf_counter()
        self.agent._flush_messages_to_session_db(self.messages)
        return time.perf_counter() - t0

    def reset(self) -> None:
        pass  # its rows are its own business: both sides grow alike (see bench_upstream)

    def close(self) -> None:
        close = getattr(self.db, "close", None)
        if close is not None:
            close()


class _GrowingFlushSide(FlushSide):
    def reset(self) -> None:
        pass


def _close_sides(sides: dict[str, Any], work: Path) -> None:
    """Close every upstream side, whatever its API does, then remove its files."""
    for side in sides.values():
        try:
            side.close()
        except Exception:  # noqa: BLE001  (its API is not ours to rely on)
            pass
    shutil.rmtree(work, ignore_errors=True)


def bench_upstream(report: Report, bench_dir: Path, samples: int) -> None:
    name = "upstream hermes-agent flush vs ours (same workload)"
    version = None
    try:
        version = importlib.metadata.version("hermes-agent")
    except importlib.metadata.PackageNotFoundError:
        pass
    if importlib.util.find_spec("hermes_state") is None or importlib.util.find_spec("run_agent") is None:
        why = ("hermes-agent is not installed (no importable hermes_state / run_agent module"
               + (f"; distribution hermes-agent {version} found" if version else ", no hermes-agent distribution")
               + "); install it in this environment to compare")
        report.add(Figure(name, None, "us", note=f"skipped: {why}"))
        return
    work = Path(tempfile.mkdtemp(prefix="upstream-", dir=bench_dir))
    sides: dict[str, Any] = {}
    try:
        sides = {"upstream": _UpstreamSide(work / "upstream.db", 10),
                 "ours": _GrowingFlushSide(work / "ours.db", "FULL", 10)}
        times = interleave(sides, samples)
    except Exception as exc:  # noqa: BLE001  (its API is not ours to rely on)
        report.add(Figure(name, None, "us", note=f"skipped: upstream's flush could not be driven "
                                                  f"({type(exc).__name__}: {exc})"))
        return
    finally:
        _close_sides(sides, work)
    up, ours = median(times["upstream"]) * 1e6, median(times["ours"]) * 1e6
    report.add(Figure(name, up, "us", ours, ratio=up / ours, target="(informative)",
                      note=(f"hermes-agent {version}, its own synchronous setting; ours at FULL; 10 prior rows growing "
                            f"by one per sample on both sides; median of {len(times['ours'])} interleaved samples")))
    _bench_upstream_growth(report, bench_dir, max(20, samples // 4), version)


def _bench_upstream_growth(report: Report, bench_dir: Path, samples: int, version: str | None) -> None:
    """Upstream's flush at 10,000 prior rows against 10, the same question as our growth figure."""
    name = "upstream hermes-agent flush, 10,000 rows vs 10 rows"
    work = Path(tempfile.mkdtemp(prefix="upstream-growth-", dir=bench_dir))
    sides: dict[str, Any] = {}
    try:
        sides = {"big": _UpstreamSide(work / "big.db", 10_000), "small": _UpstreamSide(work / "small.db", 10)}
        times = interleave(sides, samples, warmup=5)
    except Exception as exc:  # noqa: BLE001  (its API is not ours to rely on)
        report.add(Figure(name, None, "us", note=f"skipped: {type(exc).__name__}: {exc}"))
        return
    finally:
        _close_sides(sides, work)
    big, small = median(times["big"]) * 1e6, median(times["small"]) * 1e6
    report.add(Figure(name, big, "us", small, ratio=big / small, target="(informative)",
                      note=f"hermes-agent {version}; median of {samples} interleaved samples; compare with our "
                           "'flush 1 msg, 10,000 rows vs 10 rows'"))
