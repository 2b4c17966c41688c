"""resume: loading and reconciling a 10,000-row session whose turn was interrupted."""
from __future__ import annotations

import shutil
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.flush import message
from bench.table import Figure, Report, median
from hermes import probes
from hermes.resume import resume_interrupted_turn
from hermes.runner import AIAgent
from hermes.state import SessionDB


class _StopAtModel(Exception):
    """Raised by the bench's probe handler where the resumed turn would call the model."""


def _big_session(path: Path, rows: int) -> tuple[Any, str]:
    """A session of `rows` rows whose last row is the user row of a running turn."""
    db = SessionDB(path, synchronous="NORMAL")
    session = "bench-resume"
    db.create_session(session, source="bench", model="bench-model")
    history = [message(i, f"turn-{i // 3}") for i in range(rows - 1)]
    db.write_pending(session, history)
    db.write_pending(session, [{"role": "user", "content": "and now?", "_turn_id": "turn-last"}],
                     start_turn="turn-last")
    return db, session


def bench_resume(report: Report, bench_dir: Path, rows: int, runs: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="resume-", dir=bench_dir))
    db, session = _big_session(work / "state.db", rows)
    marks: dict[str, float] = {}

    def handler(name: str, context: dict[str, Any]) -> None:
        marks[name] = time.perf_counter()
        if name == "model.request":
            raise _StopAtModel

    reconciled, requested, cpu, raw = [], [], [], []
    previous = probes.install(handler)
    try:
        agent = AIAgent(api_key="unused", base_url="http://127.0.0.1:9/v1", model="bench-model", session_db=db,
                        session_id=session, enabled_toolsets=[])
        reader = sqlite3.connect(work / "state.db", isolation_level=None)
        for _ in range(runs + 1):  # the first run warms the page cache and is dropped
            # Reference: a bare read of the same rows, interleaved.
            t0 = time.perf_counter()
            reader.execute("SELECT * FROM messages WHERE session_id = ? AND active = 1 ORDER BY id",
                           (session,)).fetchall()
            raw.append(time.perf_counter() - t0)
            marks.clear()
            c0, t0 = time.process_time(), time.perf_counter()
            try:
                resume_interrupted_turn(agent)
            except _StopAtModel:
                pass
            cpu.append(time.process_time() - c0)
            if "resume.reconciled" not in marks or "model.request" not in marks:
                raise RuntimeError(f"resume did not reach the model request (probes seen: {sorted(marks)})")
            reconciled.append(marks["resume.reconciled"] - t0)
            requested.append(marks["model.request"] - t0)
        reader.close()
    finally:
        probes.install(previous)
        db.close()
        shutil.rmtree(work, ignore_errors=True)
    rec, req, ref = (median(x[1:]) * 1000 for x in (reconciled, requested, raw))
    report.add(Figure(f"resume: load + reconcile {rows:,}-row session", rec, "ms", ref, ratio=rec / ref,
                      target="<= 50 ms", passed=rec <= 50.0,
                      note=(f"resume_interrupted_turn until the resume.reconciled probe, wall-clock median of {runs}; "
                            f"reference: bare SELECT of the same rows")))
    report.add(Figure("resume: ... until model request built", req, "ms", ref, ratio=req / ref,
                      target="(informative)",
                      note=(f"until the model.request probe (adds sanitize_api_messages + request building); "
                            f"CPU time median {median(cpu[1:]) * 1000:.1f} ms")))
