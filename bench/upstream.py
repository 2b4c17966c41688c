"""upstream: upstream hermes-agent's flush on the same workload as ours, when it is installed."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.charts import collected
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


class _UpstreamPointSide(_UpstreamSide):
    """Upstream's flush appending one message to exactly `prior` rows every sample, as FlushSide does for ours.

    Its prior rows are written in one setup transaction (its own SessionDB.replace_messages) and marked
    persisted the way its flush marks them; after each sample the message leaves the list and its row the
    file, untimed, so every sample of a point sees the same transcript (the table's figures grow instead).
    """

    def __init__(self, path: Path, prior: int) -> None:
        import run_agent  # type: ignore[import-not-found]

        super().__init__(path, 0)
        marker = getattr(run_agent, "_DB_PERSISTED_MARKER", "_db_persisted")
        self.messages = [{k: v for k, v in message(i, "t").items() if not k.startswith("_")} for i in range(prior)]
        if self.messages:
            self.db.replace_messages(FlushSide.SESSION, self.messages)
        for m in self.messages:
            m[marker] = True
        agent = self.agent
        agent._last_flushed_db_idx, agent._flushed_db_message_session_id = len(self.messages), FlushSide.SESSION
        conn = self.db._conn
        level = conn.execute("PRAGMA synchronous").fetchone()[0]
        self.synchronous = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(level, str(level))
        self.floor = conn.execute("SELECT coalesce(max(id), 0) FROM messages").fetchone()[0]
        self.count = conn.execute("SELECT message_count FROM sessions WHERE id = ?", (FlushSide.SESSION,)).fetchone()[0]

    def reset(self) -> None:
        self.messages.pop()
        # Straight on its connection under its lock, not through its write helper: that one counts writes
        # to time its checkpoints, which must stay paced by the flushes alone.
        with self.db._lock:
            conn = self.db._conn
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("DELETE FROM messages WHERE id > ?", (self.floor,))
            conn.execute("UPDATE sessions SET message_count = ? WHERE id = ?", (self.count, FlushSide.SESSION))
            conn.execute("COMMIT")


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
        _collect_series(report, bench_dir, max(20, samples // 2), version, upstream=False)
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
    _collect_series(report, bench_dir, max(20, samples // 2), version, upstream=True)


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


SERIES_ROWS = (10, 30, 100, 300, 1_000, 3_000, 10_000)
OURS_LABEL = "ours (hermes-supervisor, synchronous=FULL)"


def flush_series(bench_dir: Path, samples: int, rows: tuple[int, ...] = SERIES_ROWS,
                 upstream: bool = True) -> tuple[dict[str, dict[int, list[float]]], str | None]:
    """Flush cost at each transcript length: ({"ours"/"upstream": {prior rows: [microseconds, ...]}},
    upstream's synchronous setting as it ran, or None without upstream).

    Ours at FULL (as in the upstream figure) and upstream at its own setting, each side appending one
    message to exactly `n` prior rows in every sample. Every side of every point is sampled in turn,
    round after round (interleave), so drift and other load hit every point alike: the shape of each
    line is measured as carefully as the gap between them.
    """
    work = Path(tempfile.mkdtemp(prefix="flush-series-", dir=bench_dir))
    sides: dict[str, Any] = {}
    upstream_sync = None
    try:
        for n in rows:
            sides[f"ours {n}"] = FlushSide(work / f"ours-{n}.db", "FULL", n)
            if upstream:
                side = sides[f"upstream {n}"] = _UpstreamPointSide(work / f"upstream-{n}.db", n)
                upstream_sync = side.synchronous
        times = interleave(sides, samples, warmup=10)
    finally:
        _close_sides(sides, work)
    out: dict[str, dict[int, list[float]]] = {}
    for key, ts in times.items():
        side, n = key.split(" ")
        out.setdefault(side, {})[int(n)] = [t * 1e6 for t in ts]
    return out, upstream_sync


def _collect_series(report: Report, bench_dir: Path, samples: int, version: str | None, upstream: bool) -> None:
    """The flush-vs-rows chart's series, only when the run draws charts."""
    data = collected(report)
    if not data.wanted:
        return
    missing = "" if upstream else "; upstream hermes-agent is not installed here"
    try:
        try:
            series, upstream_sync = flush_series(bench_dir, samples, upstream=upstream)
        except Exception as exc:  # noqa: BLE001  (its API is not ours to rely on: ours alone, then)
            if not upstream:
                raise
            series, upstream_sync = flush_series(bench_dir, samples, upstream=False)
            missing = f"; upstream's side could not be driven ({type(exc).__name__}: {exc})"
    except Exception as exc:  # noqa: BLE001  (the table's figures stand; the charts line says why)
        data.flush_note = f"the series could not be measured ({type(exc).__name__}: {exc})"
        return
    data.flush = {OURS_LABEL: series["ours"]}
    if "upstream" in series:
        data.flush[f"upstream hermes-agent {version or '(version unknown)'}, synchronous={upstream_sync} "
                   "(its own setting)"] = series["upstream"]
    data.flush_note = (f"median (line) and interquartile range (band) of {samples} samples per point; every point "
                       "of both sides sampled in turn, round after round; each sample appends one tool result to "
                       f"exactly that many prior rows (put back after each, untimed){missing}")
