"""flush and growth: one message flushed by our runtime, against a bare insert of the same row."""
from __future__ import annotations

import gc
import json
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.table import Figure, Report, median
from hermes.runner import AIAgent
from hermes.state import SessionDB

TOOL_TEXT = ("lookup result: the key was found and its value is value-of-alpha; "
             "fetched from the local store in 0.2 ms.")


def message(i: int, turn: str) -> dict[str, Any]:
    """A transcript message shaped like a real turn's (user, assistant tool call, tool result)."""
    kind = i % 3
    if kind == 0:
        return {"role": "user", "content": f"question {i}: what is alpha?", "_turn_id": turn}
    if kind == 1:
        return {"role": "assistant", "content": None, "_turn_id": turn,
                "tool_calls": [{"id": f"call_{i}", "type": "function",
                                "function": {"name": "lookup", "arguments": "{\"key\": \"alpha\"}"}}]}
    return {"role": "tool", "name": "lookup", "tool_call_id": f"call_{i - 1}", "content": TOOL_TEXT,
            "_turn_id": turn}


def appended(turn: str) -> dict[str, Any]:
    """The message each flush sample appends: one tool result."""
    return {"role": "tool", "name": "lookup", "tool_call_id": "call_bench", "content": TOOL_TEXT, "_turn_id": turn}


class FlushSide:
    """A leased session with `prior` rows and an agent holding them, ready to flush one more."""

    SESSION = "bench-session"
    TURN = "bench-turn"

    def __init__(self, path: Path, synchronous: str, prior: int) -> None:
        self.db = SessionDB(path, synchronous=synchronous)
        self.db.create_session(self.SESSION, source="bench", model="bench-model")
        self.db.acquire_lease(self.SESSION, owner="bench")
        self.agent = AIAgent(api_key="unused", base_url="http://127.0.0.1:9/v1", model="bench-model",
                             session_db=self.db, session_id=self.SESSION, enabled_toolsets=[])
        self.agent.start_turn(self.TURN)
        self.agent._session_db_created = True
        self.messages = [message(i, self.TURN) for i in range(prior)]
        # The prior rows are written in one setup transaction (untimed).
        self.db.write_pending(self.SESSION, self.messages)
        for m in self.messages:
            m["_db_persisted"] = True
        self.floor = self.db._conn.execute("SELECT max(id) FROM messages").fetchone()[0] or 0

    def sample(self) -> float:
        msg = appended(self.TURN)
        self.messages.append(msg)
        flush = self.agent._flush_messages_to_session_db
        t0 = time.perf_counter()
        ok = flush(self.messages)
        t1 = time.perf_counter()
        if ok is not True:
            raise RuntimeError(f"bench flush failed: {self.agent.turn.failure_detail}")
        return t1 - t0

    def reset(self) -> None:
        """Back to exactly the prior rows (untimed): drop the appended message and its row."""
        self.messages.pop()
        conn = self.db._conn
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("DELETE FROM messages WHERE id > ?", (self.floor,))
        conn.execute("COMMIT")

    def close(self) -> None:
        self.db.close()


class _BareSide:
    """Raw sqlite3: BEGIN IMMEDIATE; INSERT one row; COMMIT, on a file of its own."""

    def __init__(self, path: Path, synchronous: str, prior: int, minimal: bool) -> None:
        from hermes.store.schema import STATEMENTS as _SCHEMA  # the store's DDL: same tables on both sides

        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute(f"PRAGMA synchronous = {synchronous}")
        self.conn.execute("PRAGMA foreign_keys = ON")
        self.minimal = minimal
        session, turn = FlushSide.SESSION, FlushSide.TURN
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        if minimal:
            c.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
            self.sql, self.table = "INSERT INTO t (v) VALUES (?)", "t"
            for i in range(prior):
                c.execute(self.sql, (f"prior {i}",))
            self.params: tuple[Any, ...] = (TOOL_TEXT,)
        else:
            for statement in _SCHEMA:
                c.execute(statement)
            c.execute("INSERT INTO sessions (id, source, model, created_at, lease_epoch, lease_owner) "
                      "VALUES (?, 'bench', 'bench-model', ?, 1, 'bench')", (session, time.time()))
            self.sql = ("INSERT INTO messages (session_id, turn_id, role, content, content_kind, tool_calls, "
                        "tool_call_id, name, extra, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
            self.table = "messages"
            for i in range(prior):
                m = message(i, turn)
                c.execute(self.sql, (session, turn, m["role"], m.get("content"), "text",
                                     json.dumps(m["tool_calls"]) if m.get("tool_calls") else None,
                                     m.get("tool_call_id"), m.get("name"), None, time.time()))
            msg = appended(turn)
            self.params = (session, turn, msg["role"], msg["content"], "text", None, msg["tool_call_id"],
                           msg["name"], None)
        c.execute("COMMIT")
        self.floor = c.execute(f"SELECT max(id) FROM {self.table}").fetchone()[0] or 0

    def sample(self) -> float:
        c, sql = self.conn, self.sql
        params = self.params if self.minimal else (*self.params, time.time())
        t0 = time.perf_counter()
        c.execute("BEGIN IMMEDIATE")
        c.execute(sql, params)
        c.execute("COMMIT")
        return time.perf_counter() - t0

    def reset(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.execute(f"DELETE FROM {self.table} WHERE id > ?", (self.floor,))
        self.conn.execute("COMMIT")

    def close(self) -> None:
        self.conn.close()


def interleave(sides: dict[str, Any], samples: int, warmup: int = 20) -> dict[str, list[float]]:
    """Sample each side in turn (A B C A B C ...), resetting each after its sample; medians later."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    gc_was = gc.isenabled()
    gc.disable()  # a collection landing inside one side's sample would be noise, not cost
    try:
        for n in range(warmup + samples):
            for name, side in sides.items():
                t = side.sample()
                side.reset()
                if n >= warmup:
                    times[name].append(t)
            if n % 64 == 63:
                gc.collect()
    finally:
        if gc_was:
            gc.enable()
    return times


def bench_flush(report: Report, bench_dir: Path, samples: dict[str, int], growth_samples: int) -> None:
    for sync in ("NORMAL", "FULL"):
        work = Path(tempfile.mkdtemp(prefix=f"flush-{sync.lower()}-", dir=bench_dir))
        sides: dict[str, Any] = {}
        try:
            sides = {"flush": FlushSide(work / "state.db", sync, 10),
                     "bare": _BareSide(work / "bare.db", sync, 10, minimal=False),
                     "minimal": _BareSide(work / "minimal.db", sync, 10, minimal=True)}
            # Two strict A/B alternations, so each reference is measured next to our flush alone.
            vs_bare = interleave({"flush": sides["flush"], "bare": sides["bare"]}, samples[sync])
            vs_minimal = interleave({"flush": sides["flush"], "minimal": sides["minimal"]}, samples[sync])
        finally:
            for side in sides.values():
                side.close()
            shutil.rmtree(work, ignore_errors=True)
        ours, bare = median(vs_bare["flush"]) * 1e6, median(vs_bare["bare"]) * 1e6
        ours2, minimal = median(vs_minimal["flush"]) * 1e6, median(vs_minimal["minimal"]) * 1e6
        n = len(vs_bare["flush"])
        report.add(Figure(f"flush 1 msg, 10 rows, {sync} vs bare same-schema insert", ours, "us", bare,
                          ratio=ours / bare, target="<= 1.30x", passed=ours / bare <= 1.30,
                          note=(f"median of {n} samples each, A/B alternated; flush = AIAgent._flush_messages_to_session_db"
                                f" on a leased session; bare = BEGIN IMMEDIATE; INSERT the same row into the same "
                                f"schema (same indexes, same pragmas); COMMIT, with sqlite3 Connection.execute")))
        report.add(Figure(f"flush 1 msg, 10 rows, {sync} vs minimal 2-column insert", ours2, "us", minimal,
                          ratio=ours2 / minimal, target="(informative)",
                          note=f"a separate A/B run of {n} samples each; minimal = INSERT INTO t (v) VALUES (?)"))

    work = Path(tempfile.mkdtemp(prefix="flush-growth-", dir=bench_dir))
    sides = {}
    try:
        sides = {"10k": FlushSide(work / "big.db", "NORMAL", 10_000),
                 "10": FlushSide(work / "small.db", "NORMAL", 10)}
        times = interleave(sides, growth_samples)
    finally:
        for side in sides.values():
            side.close()
        shutil.rmtree(work, ignore_errors=True)
    big, small = median(times["10k"]) * 1e6, median(times["10"]) * 1e6
    report.add(Figure("flush 1 msg, 10,000 rows vs 10 rows, NORMAL", big, "us", small, ratio=big / small,
                      target="<= 1.10x", passed=big / small <= 1.10,
                      note=f"median of {len(times['10k'])} interleaved samples each"))
