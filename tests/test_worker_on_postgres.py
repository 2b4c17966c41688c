"""Our runtime's worker on the PostgreSQL store (`--store URL`): a turn killed at a named point, as
real processes, resumes to its answer with every call answered once and the at-most-once tool run
at most once, exactly as on SQLite. The cluster is a private one (tests/pgfixtures.py)."""
from __future__ import annotations

import signal
from pathlib import Path

import pytest
from pgfixtures import pg_cluster, pg_url  # noqa: F401  (pytest finds fixtures by name)
from workerutil import MODEL, run_worker, worker_env

from testkit.modelserver import Reply, ScriptedModelServer, ToolCallSpec, turn_script
from worker.ledger_reader import read_executions

SESSION = "s-pg"
MESSAGE = "note it, store it, then answer"
CALLS = (ToolCallSpec("append_note", {"text": "remember \x00 this"}), ToolCallSpec("set_value", {"key": "k", "value": "v"}))
ANSWER = "noted and stored"


def _argv(command: str, url: str, base_url: str, tmp_path: Path, *extra: str) -> list[str]:
    return [command, "--store", url, "--session", SESSION, "--base-url", base_url, "--model", MODEL,
            "--ledger", str(tmp_path / "effects.db"), "--home", str(tmp_path / "home"), *extra]


@pytest.mark.parametrize("point", ["model.request:1", "flush.in_txn:2", "tool.dispatch.after:1", "flush.committed:3",
                                   "finalize.before:1"])
def test_a_turn_on_postgresql_killed_at_a_point_resumes_to_its_answer(pg_url: str, tmp_path: Path,  # noqa: F811
                                                                      point: str) -> None:
    script = turn_script({MESSAGE: [Reply(content=None, tool_calls=CALLS), Reply(ANSWER)]})
    env = worker_env(tmp_path / "home")
    with ScriptedModelServer(script, model=MODEL) as server:
        killed = run_worker(_argv("run", pg_url, server.base_url, tmp_path, "--message", MESSAGE, "--kill-at", point),
                            workdir=tmp_path, env=env)
        assert killed.returncode == -signal.SIGKILL, killed.describe()
        resumed = run_worker(_argv("resume", pg_url, server.base_url, tmp_path), workdir=tmp_path, env=env)
    assert resumed.returncode == 0, resumed.describe()

    from hermes.store.pg import PgSessionDB  # here: a checkout without the postgres extra still collects this file

    store = PgSessionDB(pg_url, readonly=True)
    try:
        turns = store.get_turns(SESSION)
        rows = store.load_live_messages(SESSION)
    finally:
        store.close()
    assert [t["state"] for t in turns] == ["done"], turns
    assert [r["role"] for r in rows] == ["user", "assistant", "tool", "tool", "assistant"], rows
    assert rows[0]["content"] == MESSAGE and rows[-1]["content"] == ANSWER
    calls = [c["id"] for c in rows[1]["tool_calls"]]
    assert sorted(r["tool_call_id"] for r in rows[2:4]) == sorted(calls)  # each call answered, once
    notes = [e for e in read_executions(tmp_path / "effects.db", SESSION) if e["tool"] == "append_note"]
    assert len(notes) <= 1, notes  # at most once, even across the kill


def test_the_worker_refuses_a_store_it_cannot_use(tmp_path: Path) -> None:
    env = worker_env(tmp_path / "home")
    base = ["--session", SESSION, "--base-url", "http://127.0.0.1:9/v1", "--model", MODEL, "--message", "x"]
    cases = {
        ("--store", "sqlite:///x.db", "--ledger", "l", "--home", "h"): "postgresql:// URL",
        ("--store", "postgresql:///x", "--home", "h"): "--ledger PATH and --home DIR",
        ("--store", "postgresql:///x", "--ledger", "l", "--home", "h", "--target", "langgraph"): "our runtime",
        ("--store", "postgresql:///x", "--db", "x.db"): "not allowed with argument",
    }
    for extra, said in cases.items():
        done = run_worker(["run", *base, *extra], workdir=tmp_path, env=env)
        assert done.returncode == 2 and said in done.stderr, done.describe()
