"""Tool executors: sequential, concurrent and segmented batches.

The ordering each executor keeps, per tool call, is the contract:

    dispatch intent durable -> tool runs -> result appended -> result flushed -> UI callback

and a failed flush stops the batch: no later tool runs, nothing more is shown.
Results are always appended, flushed and projected on the calling thread, in the
order the model emitted the calls, so the transcript's order never depends on
which thread finished first.

An interrupted batch (KeyboardInterrupt) still answers every call, truthfully, before
the interrupt propagates: a call whose dispatch intent may be committed and which may
have started gets the unknown-outcome result (its effect may have happened); a call
that certainly never started gets ``CANCELLED_RESULT``; a call that finished keeps its
real result. The only calls with a committed intent that are answered "cancelled" are
concurrent ones whose future was cancelled before a pool thread picked it up (or was
never submitted): those provably never ran.

The executors work on the agent's current turn (``agent.turn``, a ``hermes.turn.Turn``):
it records the dispatch intents, dispatches (on the calling thread for the sequential path,
through ``agent._invoke_tool`` on a pool thread for the concurrent one), flushes and shows.
``maybe_persist_tool_result`` is looked up in this module at call time.
"""
from __future__ import annotations

import hashlib
import json
import re
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from hermes import probes
from hermes.outcomes import CANCELLED_RESULT, INTERRUPTED, UNKNOWN_OUTCOME, dangling_result
from hermes.private_files import make_private_dirs, write_file_durably
from hermes.tools import registry, tool_error, tool_failure_message
from hermes.transcript import make_tool_result_message, normalize_tool_calls

if TYPE_CHECKING:
    from hermes.runner import AIAgent
    from hermes.turn import Turn

SPILL_THRESHOLD_CHARS = 100_000
SPILL_PREVIEW_CHARS = 4_000
# The note a spilled result's preview ends with (written by `maybe_persist_tool_result`, read back
# by `parse_spilled`): the one place its wording lives.
_SPILL_NOTE = "\n\n[output of {tool} was {chars} characters; the full text is saved in {path}]"
_SPILL_NOTE_RE = re.compile(r"\n\n\[output of (?P<tool>.+?) was (?P<chars>\d+) characters; "
                            r"the full text is saved in (?P<path>[^\n]+)\]\Z")


def maybe_persist_tool_result(*, content: str, tool_name: str, tool_call_id: str,
                              spill_dir: Path | None = None,
                              threshold: int = SPILL_THRESHOLD_CHARS) -> str:
    """Keep a large result out of the transcript: save it to a file, return a preview.

    The file and its directory entry are fsynced before the preview (which names it) can be
    flushed, so a durable preview never points at a file that a crash or power cut lost.
    """
    if not isinstance(content, str):
        content = str(content)
    if len(content) <= threshold or spill_dir is None:
        return content
    # A readable stem plus a digest of the raw id: two ids that clean to the same stem
    # must never share (and overwrite) one file.
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", tool_call_id)[:64] or "call"
    digest = hashlib.sha256(tool_call_id.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    path = Path(spill_dir) / f"{stem}-{digest}.txt"
    preview = content[:SPILL_PREVIEW_CHARS]
    try:
        make_private_dirs(spill_dir)
        write_file_durably(path, content, errors="surrogatepass")
    except OSError as exc:
        return (f"{preview}\n\n[output of {tool_name} was {len(content)} characters; only this preview "
                f"was kept because saving the rest failed: {exc}]")
    return preview + _SPILL_NOTE.format(tool=tool_name, chars=len(content), path=path)


def parse_spilled(content: Any) -> tuple[str, int, Path] | None:
    """(preview, characters, file) of a result `maybe_persist_tool_result` spilled to a file, or
    None for any other content."""
    if not isinstance(content, str):
        return None
    note = _SPILL_NOTE_RE.search(content)
    if note is None:
        return None
    return content[:note.start()], int(note["chars"]), Path(note["path"])


def _parse_arguments(call: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    raw = call["function"]["arguments"]
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}, None
    try:
        args = json.loads(raw)
    except (TypeError, ValueError) as exc:
        return None, tool_error(f"the arguments for {call['function']['name']!r} are not valid JSON "
                                f"({exc}); the tool was not run. Send a JSON object.")
    if args is None:  # some models send `null` for a call that takes no arguments
        return {}, None
    if not isinstance(args, dict):
        return None, tool_error(f"the arguments for {call['function']['name']!r} must be a JSON object, "
                                f"not {type(args).__name__}; the tool was not run.")
    return args, None


def _prepare(agent: "AIAgent", call: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """(arguments, None) for a call that may run, or (None, error result) for one that may not."""
    name = call["function"]["name"]
    if agent.valid_tool_names and name not in agent.valid_tool_names:
        return None, tool_error(f"unknown tool {name!r}; the tools offered are "
                                f"{', '.join(sorted(agent.valid_tool_names))}. The call was not run.")
    return _parse_arguments(call)


def _finish_call(turn: "Turn", call: dict[str, Any], args: dict[str, Any] | None,
                 raw_result: Any, messages: list[dict[str, Any]]) -> bool:
    """Append, flush, then project one tool result. False when the flush failed (batch must stop)."""
    name, call_id = call["function"]["name"], call["id"]
    content = maybe_persist_tool_result(content=raw_result, tool_name=name, tool_call_id=call_id,
                                        spill_dir=turn.spill_dir())
    message = make_tool_result_message(name, content, call_id)
    message["_turn_id"] = turn.id
    messages.append(message)
    if not turn.flush(messages):
        return False
    turn.show_tool_complete(call_id, name, args, content)
    return True


def _answered_since(messages: list[dict[str, Any]], start: int) -> set[str]:
    """Ids of the tool calls answered by messages appended at or after index `start`."""
    return {m.get("tool_call_id") for m in messages[start:] if m.get("role") == "tool"}


def _answer_interrupted(turn: "Turn", answers: list[tuple[dict[str, Any], str]],
                        messages: list[dict[str, Any]]) -> None:
    """Append one result per (call, content), in the order given, then save them in one flush.

    The flush also saves a result the interrupt caught between its append and its commit.
    Nothing is shown: the turn is being interrupted. A result big enough to spill is
    spilled like any other, so the transcript never holds an oversized row.
    """
    for call, content in answers:
        name, call_id = call["function"]["name"], call["id"]
        if content not in (UNKNOWN_OUTCOME, CANCELLED_RESULT):
            content = maybe_persist_tool_result(content=content, tool_name=name, tool_call_id=call_id,
                                                spill_dir=turn.spill_dir())
        message = make_tool_result_message(name, content, call_id)
        message["_turn_id"] = turn.id
        messages.append(message)
    turn.flush(messages)


def execute_tool_calls_sequential(agent: "AIAgent", assistant_message: Any,
                                  messages: list[dict[str, Any]], task_id: str | None) -> None:
    turn = agent.turn
    calls = normalize_tool_calls(getattr(assistant_message, "tool_calls", None))
    start = len(messages)
    # Calls whose intent may be committed: from the moment recording starts, since an interrupt
    # inside the write cannot tell whether its COMMIT happened.
    intended: set[str] = set()
    try:
        for call in calls:
            if turn.persistence_failed:
                return
            args, error = _prepare(agent, call)
            if error is not None:
                if not _finish_call(turn, call, None, error, messages):
                    return
                continue
            intended.add(call["id"])
            if not turn.record_intents([call]):
                return
            result = turn.dispatch(call, args, task_id)
            if not _finish_call(turn, call, args, result, messages):
                return
    except KeyboardInterrupt:
        answered = _answered_since(messages, start)
        # The interrupted call may have had its effect; the calls after it never started.
        _answer_interrupted(turn, [(call, dangling_result(call["id"] in intended, INTERRUPTED))
                                    for call in calls if call["id"] not in answered], messages)
        raise


def _settled_result(call: dict[str, Any], future: Future[Any]) -> str:
    """What a finished future's call returned (or the error result the batch would have recorded)."""
    try:
        return future.result(timeout=0)
    except Exception as exc:
        return tool_error(tool_failure_message(call["function"]["name"], exc))
    except BaseException:
        # The tool itself was interrupted part way: whatever it did before is unknown.
        return dangling_result(True, INTERRUPTED)


def _interrupted_answer(call: dict[str, Any], error: str | None, future: Future[Any] | None) -> str:
    """The truthful result of one call of an interrupted concurrent batch; never waits on a tool."""
    if error is not None:
        return error  # refused before dispatch: its real result
    if future is not None and not future.cancel() and future.done():
        return _settled_result(call, future)
    # Still running, or never started although its dispatch intent is (or may be) committed:
    # a call with an intent is never answered "cancelled", since only its ledger could prove
    # that it never ran. Recovery and the model treat it as a call whose effect is unknown.
    return dangling_result(True, INTERRUPTED)


def execute_tool_calls_concurrent(agent: "AIAgent", assistant_message: Any,
                                  messages: list[dict[str, Any]], task_id: str | None) -> None:
    turn = agent.turn
    calls = normalize_tool_calls(getattr(assistant_message, "tool_calls", None))
    if not calls or turn.persistence_failed:
        return
    prepared = [_prepare(agent, call) for call in calls]
    runnable = [call for call, (_, error) in zip(calls, prepared) if error is None]
    pool: ThreadPoolExecutor | None = None
    futures: dict[int, Future[Any]] = {}
    start = len(messages)
    try:
        if runnable and not turn.record_intents(runnable):
            return
        pool = ThreadPoolExecutor(max_workers=max(1, min(len(runnable), agent.max_concurrent_tools)),
                                  thread_name_prefix="hermes-tool")
        for index, (call, (args, error)) in enumerate(zip(calls, prepared)):
            if error is None:
                probes.fire("tool.dispatch.before", **turn.probe_ids(tool_call_id=call["id"]))
                futures[index] = pool.submit(turn.invoke, call["function"]["name"], args, task_id, call["id"])
        for index, (call, (args, error)) in enumerate(zip(calls, prepared)):
            if error is not None:
                result: Any = error
            else:
                try:
                    result = futures[index].result()
                except Exception as exc:
                    result = tool_error(tool_failure_message(call["function"]["name"], exc))
                probes.fire("tool.dispatch.after", **turn.probe_ids(tool_call_id=call["id"]))
            if not _finish_call(turn, call, args, result, messages):
                return
    except KeyboardInterrupt:
        answered = _answered_since(messages, start)
        _answer_interrupted(turn, [(call, _interrupted_answer(call, error, futures.get(index)))
                                    for index, (call, (_, error)) in enumerate(zip(calls, prepared))
                                    if call["id"] not in answered], messages)
        raise
    finally:
        # Every future is settled or answered by now; a tool still running cannot be stopped
        # from here, and waiting on it would hold the interrupt hostage.
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


def plan_segments(tool_calls: list[Any]) -> list[tuple[str, list[Any]]]:
    """Split a batch into runs: consecutive parallel-safe calls run together, others one by one."""
    segments: list[tuple[str, list[Any]]] = []
    for raw in tool_calls:
        name = normalize_tool_calls([raw])[0]["function"]["name"]
        kind = "parallel" if registry.parallel_safe(name) else "sequential"
        if segments and segments[-1][0] == kind:
            segments[-1][1].append(raw)
        else:
            segments.append((kind, [raw]))
    return segments


def execute_tool_calls_segmented(agent: "AIAgent", assistant_message: Any, messages: list[dict[str, Any]],
                                 task_id: str | None,
                                 segments: list[tuple[str, list[Any]]] | None = None) -> None:
    """Run each segment with its executor; stop at the first persistence failure."""
    if segments is None:
        segments = plan_segments(list(getattr(assistant_message, "tool_calls", None) or ()))
    turn = agent.turn
    start = len(messages)
    try:
        for kind, calls in segments:
            if turn.persistence_failed:
                return
            part = SimpleNamespace(content=getattr(assistant_message, "content", None), tool_calls=calls)
            if kind == "parallel":
                execute_tool_calls_concurrent(agent, part, messages, task_id)
            else:
                execute_tool_calls_sequential(agent, part, messages, task_id)
    except KeyboardInterrupt:
        # The interrupted segment answered its own calls; later segments never started.
        answered = _answered_since(messages, start)
        _answer_interrupted(turn, [(call, dangling_result(False, INTERRUPTED))
                                    for call in normalize_tool_calls([c for _, part in segments for c in part])
                                    if call["id"] not in answered], messages)
        raise
