"""Tool executors driven directly on a real SessionDB: per-call ordering, concurrency, segment
plans, what a failed flush or an interrupt leaves behind, result spilling and dispatch intents."""
from __future__ import annotations

import json
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hermes import executor
from hermes.outcomes import UNKNOWN_OUTCOME
from hermes.runner import AIAgent
from hermes.state import SessionDB
from hermes.tools import Tool, ToolContext, registry

TOOLSET = "executor_tests"
SERIAL, PARALLEL = "ex_serial", "ex_parallel"
SID = "exec-session"
TURN = "exec-turn"


class Workbench:
    """One handler for both test tools; each call's arguments say how it behaves."""

    def __init__(self, reader: SessionDB) -> None:
        self.reader = reader
        self.events: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.barrier: threading.Barrier | None = None
        self.dispatch_views: dict[str, list[dict[str, Any]]] = {}
        self.keys: dict[str, str | None] = {}
        self.args: dict[str, dict[str, Any]] = {}
        # Named events a call may set ("signal") or wait for ("wait"), to order tool threads exactly.
        self.gates: dict[str, threading.Event] = {}

    def gate(self, name: str) -> threading.Event:
        with self.lock:
            return self.gates.setdefault(name, threading.Event())

    def note(self, kind: str, call_id: str) -> None:
        with self.lock:
            self.events.append((kind, call_id))

    def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        call_id = ctx.tool_call_id or ""
        self.note("run", call_id)
        self.dispatch_views[call_id] = self.reader.get_dispatches(SID)
        self.keys[call_id] = ctx.idempotency_key
        self.args[call_id] = args
        if args.get("barrier"):
            assert self.barrier is not None
            self.barrier.wait(timeout=3)
        if "signal" in args:
            self.gate(args["signal"]).set()
        if "wait" in args:
            assert self.gate(args["wait"]).wait(timeout=30), f"gate {args['wait']} never opened"
        time.sleep(args.get("sleep", 0))
        if args.get("interrupt"):
            raise KeyboardInterrupt
        if "size" in args:
            return "z" * args["size"]
        self.note("done", call_id)
        return f"result of {call_id}"


@pytest.fixture
def reader(db_path: Path, db: SessionDB) -> Iterator[SessionDB]:
    other = SessionDB(db_path)
    yield other
    other.close()


@pytest.fixture
def bench(reader: SessionDB) -> Workbench:
    wb = Workbench(reader)
    registry.register(Tool(SERIAL, "serial test tool", wb.run, policy="at_most_once"), TOOLSET)
    registry.register(Tool(PARALLEL, "parallel-safe test tool", wb.run, policy="idempotent",
                           parallel_safe=True), TOOLSET)
    return wb


@pytest.fixture
def agent(db: SessionDB, agent_home: Path, bench: Workbench, recorder, reader: SessionDB) -> AIAgent:
    """An agent mid-turn: session created, turn id set, and the probes feed the workbench log."""
    db.create_session(SID)
    built = AIAgent(api_key="k", base_url="http://127.0.0.1:9/v1", model="scripted-model", session_db=db,
                    session_id=SID, enabled_toolsets=[TOOLSET],
                    tool_complete_callback=lambda call_id, *_: bench.note("shown", call_id))
    built.start_turn(TURN)
    recorder.on("tool.dispatch.before", lambda ctx: bench.note("dispatch.before", ctx["tool_call_id"]))
    recorder.on("tool.dispatch.after", lambda ctx: bench.note("dispatch.after", ctx["tool_call_id"]))
    recorder.on("flush.committed", lambda _ctx: bench.note(
        "flushed", reader.get_messages(SID)[-1]["tool_call_id"] or "(no tool row)"))
    return built


def _call(call_id: str, name: str, **behaviour: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(behaviour)}}


def _open_batch(agent: AIAgent, bench: Workbench, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Durable user + assistant(tool_calls) messages, as the turn loop leaves them before tools run."""
    messages = [{"role": "user", "content": "go", "_turn_id": TURN},
                {"role": "assistant", "content": None, "tool_calls": calls, "_turn_id": TURN}]
    assert agent._flush_messages_to_session_db(messages) is True
    bench.events.clear()
    return messages


def _block(calls: list[dict[str, Any]]) -> SimpleNamespace:
    return SimpleNamespace(content=None, tool_calls=calls)


def _results(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(m["tool_call_id"], m["content"]) for m in messages if m["role"] == "tool"]


# ---------------------------------------------------------------- ordering
def test_sequential_runs_flushes_then_shows_each_call(agent: AIAgent, bench: Workbench, durable) -> None:
    calls = [_call("s1", SERIAL), _call("s2", SERIAL), _call("s3", SERIAL)]
    messages = _open_batch(agent, bench, calls)

    executor.execute_tool_calls_sequential(agent, _block(calls), messages, "task")

    expected = []
    for cid in ("s1", "s2", "s3"):
        expected += [("dispatch.before", cid), ("run", cid), ("done", cid), ("dispatch.after", cid),
                     ("flushed", cid), ("shown", cid)]
    assert bench.events == expected
    assert _results(messages) == [(c, f"result of {c}") for c in ("s1", "s2", "s3")]
    assert durable(SID)[2:] == [{"role": "tool", "name": SERIAL, "tool_call_id": c, "content": f"result of {c}"}
                                for c in ("s1", "s2", "s3")]


def test_concurrent_results_keep_emission_order_while_tools_overlap(agent: AIAgent, bench: Workbench,
                                                                     durable) -> None:
    bench.barrier = threading.Barrier(3)  # nobody passes until all three are running at once
    calls = [_call("p1", PARALLEL, barrier=True, sleep=0.3),
             _call("p2", PARALLEL, barrier=True, sleep=0.1),
             _call("p3", PARALLEL, barrier=True)]
    messages = _open_batch(agent, bench, calls)

    executor.execute_tool_calls_concurrent(agent, _block(calls), messages, "task")

    assert _results(messages) == [(c, f"result of {c}") for c in ("p1", "p2", "p3")]
    assert [m["tool_call_id"] for m in durable(SID) if m["role"] == "tool"] == ["p1", "p2", "p3"]
    events = bench.events
    finished = [cid for kind, cid in events if kind == "done"]
    assert finished == ["p3", "p2", "p1"]  # the slowest was first in the batch
    assert [cid for kind, cid in events if kind == "flushed"] == ["p1", "p2", "p3"]
    assert [cid for kind, cid in events if kind == "shown"] == ["p1", "p2", "p3"]
    # Nothing was flushed or shown until the first call (the slowest) had its result.
    assert events.index(("done", "p1")) < events.index(("flushed", "p1"))
    for cid in ("p1", "p2", "p3"):
        assert events.index(("flushed", cid)) < events.index(("shown", cid))


def test_plan_segments_groups_consecutive_parallel_calls(agent: AIAgent, bench: Workbench, durable) -> None:
    kinds = [PARALLEL, PARALLEL, SERIAL, PARALLEL, SERIAL, SERIAL]
    calls = [_call(f"m{i}", name) for i, name in enumerate(kinds)]

    plan = executor.plan_segments(calls)

    assert [(kind, [c["id"] for c in part]) for kind, part in plan] == [
        ("parallel", ["m0", "m1"]), ("sequential", ["m2"]), ("parallel", ["m3"]),
        ("sequential", ["m4", "m5"])]

    messages = _open_batch(agent, bench, calls)
    executor.execute_tool_calls_segmented(agent, _block(calls), messages, "task", segments=plan)
    ids = [f"m{i}" for i in range(6)]
    assert [cid for cid, _ in _results(messages)] == ids
    assert [m["tool_call_id"] for m in durable(SID) if m["role"] == "tool"] == ids
    assert [cid for kind, cid in bench.events if kind == "shown"] == ids


# ---------------------------------------------------------------- failures
def _fail_flush_of(monkeypatch: pytest.MonkeyPatch, call_id: str) -> None:
    real = SessionDB.write_pending

    def failing(self, session_id, pending, **kwargs):
        if any(m.get("tool_call_id") == call_id for m in pending):
            raise sqlite3.OperationalError("database or disk is full")
        return real(self, session_id, pending, **kwargs)

    monkeypatch.setattr(SessionDB, "write_pending", failing)


def test_sequential_failed_flush_stops_the_batch(agent: AIAgent, bench: Workbench, durable,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    calls = [_call("f1", SERIAL), _call("f2", SERIAL), _call("f3", SERIAL)]
    messages = _open_batch(agent, bench, calls)
    _fail_flush_of(monkeypatch, "f2")

    executor.execute_tool_calls_sequential(agent, _block(calls), messages, "task")

    assert agent._incremental_persistence_failed is True
    assert agent.turn.failure_cause == "disk"
    assert [cid for kind, cid in bench.events if kind == "run"] == ["f1", "f2"]
    assert [cid for kind, cid in bench.events if kind == "shown"] == ["f1"]
    assert [m["tool_call_id"] for m in durable(SID) if m["role"] == "tool"] == ["f1"]


def test_concurrent_failed_flush_shows_nothing_more(agent: AIAgent, bench: Workbench, durable,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    calls = [_call("g1", PARALLEL), _call("g2", PARALLEL, sleep=0.05), _call("g3", PARALLEL)]
    messages = _open_batch(agent, bench, calls)
    _fail_flush_of(monkeypatch, "g1")

    executor.execute_tool_calls_concurrent(agent, _block(calls), messages, "task")

    assert agent._incremental_persistence_failed is True
    assert [kind for kind, _ in bench.events if kind in ("shown", "flushed")] == []
    assert [m["role"] for m in durable(SID)] == ["user", "assistant"]


def test_failed_dispatch_intent_means_the_tool_never_runs(agent: AIAgent, bench: Workbench,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self, *args, **kwargs):
        raise sqlite3.OperationalError("attempt to write a readonly database")

    calls = [_call("d1", SERIAL), _call("d2", PARALLEL)]
    messages = _open_batch(agent, bench, calls)
    monkeypatch.setattr(SessionDB, "record_dispatches", refuse)

    executor.execute_tool_calls_sequential(agent, _block(calls), messages, "task")

    assert bench.events == [] and _results(messages) == []
    assert agent.turn.failure_cause == "readonly"


class _RecordingPool(ThreadPoolExecutor):
    """The executor's pool, kept so a test can join its threads after the batch abandoned them."""

    made: list[ThreadPoolExecutor] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _RecordingPool.made.append(self)


@pytest.fixture
def pools(monkeypatch: pytest.MonkeyPatch, bench: Workbench) -> Iterator[list[ThreadPoolExecutor]]:
    made: list[ThreadPoolExecutor] = []
    monkeypatch.setattr(_RecordingPool, "made", made)
    monkeypatch.setattr(executor, "ThreadPoolExecutor", _RecordingPool)
    yield made
    bench.gate("release").set()  # a failed test must not leave tools blocked
    for pool in made:
        pool.shutdown(wait=True)


def _stored_results(durable: Any) -> list[tuple[str, str]]:
    return [(m["tool_call_id"], m["content"]) for m in durable(SID) if m["role"] == "tool"]


def test_sequential_interrupt_marks_the_running_call_unknown_and_cancels_the_rest(
        agent: AIAgent, bench: Workbench, db: SessionDB, durable) -> None:
    calls = [_call("k1", SERIAL), _call("k2", SERIAL, interrupt=True), _call("k3", SERIAL)]
    messages = _open_batch(agent, bench, calls)

    with pytest.raises(KeyboardInterrupt):
        executor.execute_tool_calls_sequential(agent, _block(calls), messages, "task")

    assert [cid for kind, cid in bench.events if kind == "run"] == ["k1", "k2"]
    # k2's intent was committed and it was running: its effect may have happened, so it is
    # never called cancelled. k3 never started (no intent): cancelled is the truth.
    assert _results(messages) == [("k1", "result of k1"), ("k2", UNKNOWN_OUTCOME), ("k3", executor.CANCELLED_RESULT)]
    assert _stored_results(durable) == _results(messages)
    assert sorted(d["tool_call_id"] for d in db.get_dispatches(SID)) == ["k1", "k2"]
    assert [cid for kind, cid in bench.events if kind == "shown"] == ["k1"]


def test_sequential_interrupt_after_the_tool_returned_is_still_unknown(agent: AIAgent, bench: Workbench,
                                                                       recorder, durable) -> None:
    """Interrupted between the tool's return and its result's flush: the result never reached the
    transcript, so whether the effect happened is not something this process can vouch for."""
    calls = [_call("a1", SERIAL), _call("a2", SERIAL)]
    messages = _open_batch(agent, bench, calls)

    def interrupt(ctx: dict[str, Any]) -> None:
        if ctx["tool_call_id"] == "a1":
            raise KeyboardInterrupt

    recorder.on("tool.dispatch.after", interrupt)
    with pytest.raises(KeyboardInterrupt):
        executor.execute_tool_calls_sequential(agent, _block(calls), messages, "task")

    assert _results(messages) == [("a1", UNKNOWN_OUTCOME), ("a2", executor.CANCELLED_RESULT)]
    assert _stored_results(durable) == _results(messages)
    assert [cid for kind, cid in bench.events if kind == "run"] == ["a1"]


def test_concurrent_interrupt_in_a_tool_answers_each_call_by_what_happened(agent: AIAgent, bench: Workbench,
                                                                           pools, durable) -> None:
    # j2 raises only once j3 is running, so j3 is certainly started and still running.
    calls = [_call("j1", PARALLEL), _call("j2", PARALLEL, wait="j3 running", interrupt=True),
             _call("j3", PARALLEL, signal="j3 running", wait="release")]
    messages = _open_batch(agent, bench, calls)

    with pytest.raises(KeyboardInterrupt):
        executor.execute_tool_calls_concurrent(agent, _block(calls), messages, "task")

    assert _results(messages) == [("j1", "result of j1"), ("j2", UNKNOWN_OUTCOME), ("j3", UNKNOWN_OUTCOME)]
    assert _stored_results(durable) == _results(messages)
    assert [cid for kind, cid in bench.events if kind == "shown"] == ["j1"]
    # The executor did not wait for j3: it is still running now, and finishes on its own.
    assert ("done", "j3") not in bench.events
    bench.gate("release").set()
    pools[0].shutdown(wait=True)
    assert ("done", "j3") in bench.events


def test_concurrent_interrupt_keeps_finished_results_and_never_says_cancelled_after_an_intent(
        agent: AIAgent, bench: Workbench, recorder, pools, durable) -> None:
    """Three pool threads. c1 and c3 finish at once; c2, c4 and c5 hold a thread each until released,
    so c6 never gets a thread. The turn is interrupted as c1's result comes back, before it is saved."""
    agent.max_concurrent_tools = 3
    calls = [_call("c1", PARALLEL), _call("c2", PARALLEL, wait="release"), _call("c3", PARALLEL),
             _call("c4", PARALLEL, signal="c4 running", wait="release"),
             _call("c5", PARALLEL, signal="c5 running", wait="release"), _call("c6", PARALLEL)]
    messages = _open_batch(agent, bench, calls)

    def interrupt(ctx: dict[str, Any]) -> None:
        if ctx["tool_call_id"] == "c1":
            # c4 and c5 run on the threads c1 and c3 used, so both of those have finished.
            assert bench.gate("c4 running").wait(timeout=30) and bench.gate("c5 running").wait(timeout=30)
            raise KeyboardInterrupt

    recorder.on("tool.dispatch.after", interrupt)
    with pytest.raises(KeyboardInterrupt):
        executor.execute_tool_calls_concurrent(agent, _block(calls), messages, "task")

    assert _results(messages) == [("c1", "result of c1"), ("c2", UNKNOWN_OUTCOME), ("c3", "result of c3"),
                                  ("c4", UNKNOWN_OUTCOME), ("c5", UNKNOWN_OUTCOME),
                                  ("c6", UNKNOWN_OUTCOME)]
    assert _stored_results(durable) == _results(messages)
    assert [kind for kind, _ in bench.events if kind == "shown"] == []  # an interrupted turn shows nothing more
    bench.gate("release").set()
    pools[0].shutdown(wait=True)
    # c6 was cancelled before any thread took it, so it never ran; its intent was committed, though, and
    # only the ledger could prove that, so its result says the outcome is unknown, never "cancelled".
    assert sorted(cid for kind, cid in bench.events if kind == "run") == ["c1", "c2", "c3", "c4", "c5"]


def test_segmented_interrupt_cancels_the_segments_that_never_started(agent: AIAgent, bench: Workbench,
                                                                     db: SessionDB, durable) -> None:
    calls = [_call("m0", PARALLEL), _call("m1", SERIAL, interrupt=True), _call("m2", PARALLEL),
             _call("m3", SERIAL)]
    messages = _open_batch(agent, bench, calls)

    with pytest.raises(KeyboardInterrupt):
        executor.execute_tool_calls_segmented(agent, _block(calls), messages, "task")

    assert _results(messages) == [("m0", "result of m0"), ("m1", UNKNOWN_OUTCOME),
                                  ("m2", executor.CANCELLED_RESULT), ("m3", executor.CANCELLED_RESULT)]
    assert _stored_results(durable) == _results(messages)
    assert sorted(d["tool_call_id"] for d in db.get_dispatches(SID)) == ["m0", "m1"]


def test_null_arguments_run_the_tool_with_no_arguments(agent: AIAgent, bench: Workbench) -> None:
    """A no-parameter call whose arguments arrive as JSON null is the same as empty arguments.

    `executor._parse_arguments` treats missing/None arguments as `{}`; the call must not be
    refused as malformed just because `normalize_tool_call` serialised None to the text "null".
    """
    calls = [{"id": "n0", "type": "function", "function": {"name": SERIAL, "arguments": None}},
             {"id": "n1", "type": "function", "function": {"name": SERIAL}}]
    messages = _open_batch(agent, bench, calls)

    executor.execute_tool_calls_sequential(agent, _block(calls), messages, "task")

    assert _results(messages) == [("n0", "result of n0"), ("n1", "result of n1")]
    assert bench.args == {"n0": {}, "n1": {}}


# ---------------------------------------------------------------- spilling large results
def test_large_result_spills_to_a_private_file(tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    big = "line of output ✓\n" * 20

    preview = executor.maybe_persist_tool_result(content=big, tool_name="dump", tool_call_id="c/../7",
                                                 spill_dir=spill, threshold=64)

    (saved,) = list(spill.iterdir())
    assert saved.parent == spill and "/" not in saved.name
    assert saved.read_text(encoding="utf-8") == big
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert stat.S_IMODE(spill.stat().st_mode) == 0o700
    assert str(saved) in preview and "dump" in preview and str(len(big)) in preview
    assert preview.startswith(big[:executor.SPILL_PREVIEW_CHARS]) and preview != big


def test_distinct_call_ids_never_share_a_spill_file(tmp_path: Path) -> None:
    """Two calls whose ids differ only in non-ASCII characters must keep separate files.

    Each durable preview names a file; that file must hold that call's output, not a
    later call's output that happened to map to the same file name.
    """
    spill = tmp_path / "spill"
    previews = {call_id: executor.maybe_persist_tool_result(content=f"output of {call_id} " * 10,
                                                            tool_name="t", tool_call_id=call_id,
                                                            spill_dir=spill, threshold=16)
                for call_id in ("调用-2", "呼叫-2")}

    for call_id, preview in previews.items():
        named = Path(preview.rsplit("saved in ", 1)[1].rstrip("]"))
        assert named.read_text(encoding="utf-8") == f"output of {call_id} " * 10


def test_small_result_and_no_spill_dir_are_unchanged(tmp_path: Path) -> None:
    assert executor.maybe_persist_tool_result(content="short", tool_name="t", tool_call_id="c",
                                              spill_dir=tmp_path, threshold=64) == "short"
    assert executor.maybe_persist_tool_result(content="x" * 100, tool_name="t", tool_call_id="c",
                                              spill_dir=None, threshold=64) == "x" * 100
    assert list(tmp_path.iterdir()) == []


def test_executor_stores_the_preview_not_the_full_result(agent: AIAgent, bench: Workbench,
                                                         agent_home: Path, durable) -> None:
    size = executor.SPILL_THRESHOLD_CHARS + 10
    calls = [_call("huge", SERIAL, size=size)]
    messages = _open_batch(agent, bench, calls)

    executor.execute_tool_calls_sequential(agent, _block(calls), messages, "task")

    stored = durable(SID)[-1]["content"]
    [spilled] = (agent_home / "tool_results" / SID).glob("huge*.txt")
    assert spilled.read_text() == "z" * size
    assert str(spilled) in stored and len(stored) < size


# ---------------------------------------------------------------- dispatch intents
@pytest.mark.parametrize("tool", [SERIAL, PARALLEL])
def test_dispatch_intent_is_durable_before_the_tool_runs(agent: AIAgent, bench: Workbench, tool: str) -> None:
    calls = [_call("i1", tool), _call("i2", tool)]
    messages = _open_batch(agent, bench, calls)
    run = executor.execute_tool_calls_sequential if tool == SERIAL else executor.execute_tool_calls_concurrent

    run(agent, _block(calls), messages, "task")

    policy = "at_most_once" if tool == SERIAL else "idempotent"
    for call_id in ("i1", "i2"):
        mine = [d for d in bench.dispatch_views[call_id] if d["tool_call_id"] == call_id]
        assert len(mine) == 1
        assert (mine[0]["turn_id"], mine[0]["tool_name"], mine[0]["policy"], mine[0]["attempt"]) == (
            TURN, tool, policy, 1)
        assert mine[0]["idempotency_key"] == bench.keys[call_id] == f"{SID}:{TURN}:{call_id}"
    if tool == PARALLEL:
        # The concurrent batch records every intent before the first tool starts.
        assert {d["tool_call_id"] for d in bench.dispatch_views["i1"]} == {"i1", "i2"}
