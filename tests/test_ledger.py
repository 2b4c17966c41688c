"""The effects ledger under concurrency: every record written by many threads of one process,
or by several processes at once, is durable and intact; apply_once applies once per key; a
read-only ledger reads a snapshot and never touches the original's files. And the chaos
tools that write it: `clean_results` predicts exactly what each returns when it runs cleanly."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import hermes.tools
from hermes.outcomes import CANCELLED_RESULT, UNKNOWN_OUTCOME
from hermes.tools import ToolRegistry, handle_function_call
from worker import chaos_tools
from worker.chaos_tools import clean_results
from worker.ledger import Ledger
from worker.ledger_reader import LedgerReader, read_executions

PROJECT = Path(__file__).resolve().parents[1]
THREADS = 8
PER_THREAD = 500


def _fields(thread: int, n: int) -> dict[str, str]:
    return {"session_id": f"s{thread % 3}", "turn_id": f"t{thread}", "tool_call_id": f"call-{thread}-{n}",
            "tool": f"tool{thread}", "policy": "idempotent" if n % 2 else "at_most_once",
            "idempotency_key": f"key-{thread}-{n}"}


def _run_threads(count: int, target, *args) -> list[BaseException]:
    """Start `count` threads running target(index, *args) together; the errors they raised."""
    errors: list[BaseException] = []
    lock = threading.Lock()

    def body(index: int) -> None:
        try:
            target(index, *args)
        except BaseException as exc:  # collected and asserted by the test's own thread
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def test_many_threads_lose_no_record(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "effects.db", incarnation=4)
    start = threading.Barrier(THREADS)

    def write(thread: int) -> None:
        start.wait()  # everyone writes at once, so the connection really is contended
        for n in range(PER_THREAD):
            ledger.record_execution(**_fields(thread, n))

    try:
        assert _run_threads(THREADS, write) == []
        # Read while the writer is still open: every record was committed, not just buffered.
        rows = read_executions(tmp_path / "effects.db")
    finally:
        ledger.close()

    assert len(rows) == THREADS * PER_THREAD
    by_call = {row["tool_call_id"]: row for row in rows}
    assert len(by_call) == THREADS * PER_THREAD
    for thread in range(THREADS):
        for n in range(PER_THREAD):
            row = by_call[f"call-{thread}-{n}"]
            assert {k: row[k] for k in _fields(thread, n)} == _fields(thread, n)
            assert (row["pid"], row["incarnation"]) == (os.getpid(), 4)
    # Each thread's records keep the order that thread wrote them in.
    for thread in range(THREADS):
        mine = [row["tool_call_id"] for row in rows if row["turn_id"] == f"t{thread}"]
        assert mine == [f"call-{thread}-{n}" for n in range(PER_THREAD)]


def test_apply_once_under_threads_applies_exactly_once_per_key(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "effects.db")
    keys = [f"idem-{k}" for k in range(50)]
    start = threading.Barrier(THREADS)
    applied: Counter[str] = Counter()
    lock = threading.Lock()

    def contend(thread: int) -> None:
        start.wait()
        for key in keys:
            if ledger.apply_once(key, f"k-{key}", f"from thread {thread}"):
                with lock:
                    applied[key] += 1

    try:
        assert _run_threads(THREADS, contend) == []
        stored = ledger._conn.execute("SELECT idempotency_key, key FROM kv ORDER BY idempotency_key").fetchall()
    finally:
        ledger.close()
    assert applied == Counter({key: 1 for key in keys})
    assert sorted(stored) == sorted((key, f"k-{key}") for key in keys)


# A separate interpreter per writer: the processes share nothing but the ledger file. Each says
# "ready" once its ledger is open and writes only after the test answers "go", so both write at once.
_WRITER = """
import sys
from worker.ledger import Ledger

path, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
ledger = Ledger(path, incarnation=int(sys.argv[4]))
print("ready", flush=True)
assert sys.stdin.readline().strip() == "go"
for n in range(count):
    ledger.record_execution(session_id=name, turn_id="t", tool_call_id=f"{name}-{n}", tool="lookup",
                            policy="idempotent", idempotency_key=f"{name}-key-{n}")
ledger.close()
print("done", flush=True)
"""


def test_two_processes_writing_one_ledger_lose_no_record(tmp_path: Path) -> None:
    path = tmp_path / "effects.db"
    per_process = 400
    env = dict(os.environ, PYTHONPATH=str(PROJECT))
    writers = [subprocess.Popen([sys.executable, "-c", _WRITER, str(path), name, str(per_process), str(inc)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=PROJECT, env=env)
               for inc, name in enumerate(("alpha", "beta"))]
    try:
        for proc in writers:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for proc in writers:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        for proc in writers:
            out, _ = proc.communicate(timeout=120)
            assert proc.returncode == 0 and out.strip() == "done"
    finally:
        for proc in writers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    rows = read_executions(path)
    assert len(rows) == 2 * per_process
    for inc, name in enumerate(("alpha", "beta")):
        mine = [row for row in rows if row["session_id"] == name]
        assert [row["tool_call_id"] for row in mine] == [f"{name}-{n}" for n in range(per_process)]
        assert {row["incarnation"] for row in mine} == {inc}
        assert len({row["pid"] for row in mine}) == 1
    assert len({row["pid"] for row in rows}) == 2


def test_busy_write_is_retried_until_the_lock_is_released(tmp_path: Path) -> None:
    path = tmp_path / "effects.db"
    ledger = Ledger(path)
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    attempts: list[int] = []
    real = ledger._conn

    class CountingConnection:
        """Lets the test release the other connection's lock once the ledger has been refused."""

        def execute(self, sql: str, *params):
            try:
                return real.execute(sql, *params)
            except sqlite3.OperationalError:
                attempts.append(1)
                if len(attempts) == 2 and holder.in_transaction:
                    holder.execute("ROLLBACK")
                raise

        def __getattr__(self, name: str):
            return getattr(real, name)

    ledger._conn = CountingConnection()  # type: ignore[assignment]
    real.execute("PRAGMA busy_timeout = 0")  # refuse at once, so the ledger's own retry does the waiting
    try:
        ledger.record_execution(session_id="s", turn_id="t", tool_call_id="c", tool="lookup",
                                policy="idempotent", idempotency_key="k")
    finally:
        ledger._conn = real
        holder.close()
    try:
        assert len(attempts) >= 2
        assert [row["tool_call_id"] for row in read_executions(path)] == ["c"]
    finally:
        ledger.close()


def test_busy_write_fails_once_the_budget_is_spent(tmp_path: Path) -> None:
    path = tmp_path / "effects.db"
    ledger = Ledger(path, busy_budget_s=0.05)
    ledger._conn.execute("PRAGMA busy_timeout = 0")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            ledger.record_execution(session_id="s", turn_id="t", tool_call_id="c", tool="lookup",
                                    policy="idempotent", idempotency_key="k")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    try:
        assert read_executions(path) == []
        assert not ledger._conn.in_transaction
    finally:
        ledger.close()


# ---------------------------------------------------------------- read-only (a snapshot)
def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_readonly_ledger_reads_a_snapshot_and_touches_nothing(tmp_path: Path) -> None:
    path = tmp_path / "effects.db"
    writer = Ledger(path)
    for n in range(3):
        writer.record_execution(session_id="s", turn_id="t", tool_call_id=f"c{n}", tool="lookup",
                                policy="idempotent", idempotency_key=f"k{n}")
    writer.close()
    before = _files(tmp_path)

    with LedgerReader(path) as reader:
        assert [row["tool_call_id"] for row in reader.executions()] == ["c0", "c1", "c2"]
        assert not hasattr(reader, "record_execution")  # a judge's view has no way to write
    assert _files(tmp_path) == before


def test_readonly_ledger_sees_what_a_live_writer_left_in_its_wal(tmp_path: Path) -> None:
    path = tmp_path / "effects.db"
    writer = Ledger(path)  # left open, like a writer that was killed: its records sit in the WAL
    try:
        for n in range(3):
            writer.record_execution(session_id="s", turn_id="t", tool_call_id=f"w{n}", tool="lookup",
                                    policy="idempotent", idempotency_key=None)
        before = _files(tmp_path)
        assert "effects.db-wal" in before
        assert [row["tool_call_id"] for row in read_executions(path)] == ["w0", "w1", "w2"]
        assert _files(tmp_path) == before
    finally:
        writer.close()


def test_readonly_ledger_never_creates_a_file(tmp_path: Path) -> None:
    missing = tmp_path / "no-such.effects"
    with pytest.raises(sqlite3.DatabaseError):
        LedgerReader(missing)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- the chaos tools' clean results
@pytest.fixture
def chaos(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ledger]:
    """The chaos tools in a registry of their own (the process-wide one stays as it was)."""
    private = ToolRegistry()
    monkeypatch.setattr(chaos_tools, "registry", private)
    monkeypatch.setattr(hermes.tools, "registry", private)
    ledger = Ledger(tmp_path / "effects.db")
    chaos_tools.install(ledger)
    yield ledger
    ledger.close()


def _run(tool: str, arguments: dict, call_id: str = "call-1", key: str | None = "s:t:call-1") -> str:
    return handle_function_call(tool, arguments, "task", tool_call_id=call_id, idempotency_key=key,
                                session_id="s", turn_id="t")


ARGUMENTS = [{"key": "alpha"}, {"key": "ключ ✓ \"quoted\""}, {}, {"key": 7}]


@pytest.mark.parametrize("arguments", ARGUMENTS, ids=["plain", "unicode", "missing", "number"])
@pytest.mark.parametrize("tool", ["lookup", "slow_lookup"])
def test_read_tools_return_exactly_their_clean_result(chaos: Ledger, tool: str, arguments: dict) -> None:
    arguments = dict(arguments, seconds=0) if tool == "slow_lookup" else arguments
    result = _run(tool, arguments)
    assert clean_results(tool, arguments) == frozenset({result})


def test_clean_results_tell_arguments_apart() -> None:
    assert clean_results("lookup", {"key": "a"}) != clean_results("lookup", {"key": "b"})
    assert clean_results("lookup", {"key": "a"}) != clean_results("slow_lookup", {"key": "a"})


def test_set_value_is_clean_whether_or_not_it_applied_now(chaos: Ledger) -> None:
    arguments = {"key": "flag", "value": "on"}
    first = _run("set_value", arguments)
    rerun = _run("set_value", arguments)  # same idempotency key: stored already, applied only once
    assert first != rerun
    assert clean_results("set_value", arguments) == frozenset({first, rerun})
    assert len(read_executions(chaos.path)) == 2


def test_append_note_returns_its_clean_result(chaos: Ledger) -> None:
    arguments = {"text": "remember the flag ✓"}
    assert clean_results("append_note", arguments) == frozenset({_run("append_note", arguments)})


@pytest.mark.parametrize("arguments", [{"reason": "disk on fire"}, {}], ids=["reason", "default"])
def test_broken_tool_clean_result_is_the_dispatchers_error_text(chaos: Ledger, arguments: dict) -> None:
    result = _run("broken_tool", arguments)
    reason = arguments.get("reason", "this tool always fails")
    # Ours names the tool; upstream hermes-agent reports the exception alone: both are the failure, faithfully.
    assert clean_results("broken_tool", arguments) == frozenset({result, json.dumps({"error": f"RuntimeError: {reason}"})})
    assert "RuntimeError" in result and "broken_tool" in result
    assert len(read_executions(chaos.path)) == 1  # it did run: failing is what it does


def test_restart_agent_and_unknown_tools() -> None:
    assert clean_results("restart_agent", {}) == frozenset()
    assert clean_results("read_file", {"path": "x"}) is None
    assert clean_results("no_such_tool", {}) is None


def test_unknown_outcome_and_cancelled_are_never_clean() -> None:
    for tool, arguments in [("lookup", {"key": "a"}), ("slow_lookup", {"key": "a"}),
                            ("set_value", {"key": "a", "value": "b"}), ("append_note", {"text": "a"}),
                            ("broken_tool", {}), ("restart_agent", {})]:
        clean = clean_results(tool, arguments)
        assert clean is not None and UNKNOWN_OUTCOME not in clean and CANCELLED_RESULT not in clean


def test_quiescent_holds_every_writing_ledger_between_its_writes(tmp_path: Path) -> None:
    """What a worker paused at a probe holds (worker.ledger.quiescent): no other thread can be inside
    a ledger write, or start one, until the pause ends."""
    from worker.ledger import quiescent

    first, second = Ledger(tmp_path / "a.effects"), Ledger(tmp_path / "b.effects")
    others: list[bool] = []

    def try_each() -> None:
        for ledger in (first, second):
            got = ledger._lock.acquire(blocking=False)
            others.append(got)
            if got:
                ledger._lock.release()

    with quiescent():
        thread = threading.Thread(target=try_each)
        thread.start()
        thread.join()
    assert others == [False, False]
    others.clear()
    try_each()
    assert others == [True, True]
    for ledger in (first, second):
        ledger.close()
