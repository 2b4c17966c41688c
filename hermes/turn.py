"""Turn: one user turn of an AIAgent, as the turn loop's helpers see it.

The loop (``hermes.runner``) starts one per user message (``AIAgent.start_turn``); the tool
executors (``hermes.executor``), the finalizer (``hermes.finalizer``) and recovery
(``hermes.resume``) reach it as ``agent.turn``. It owns what belongs to the turn:

- its ids, and what a probe or a tool is told (``probe_ids``, ``idempotency_key``);
- durability: committing its messages (``begin``, ``flush``), its dispatch intents
  (``record_intents``), and the first failed write (or recovery's failed read), which closes
  the turn (``persistence_failed``, ``failure_cause``);
- UI projection: interim text, tool completions, streamed text and how a stream ends;
- tool dispatch, on the calling thread (``dispatch``) or a pool thread (``invoke``);
- the turn's result.

The agent keeps the session (id, database, callbacks, settings) and the steps callers replace
on a live agent (the seed contract among them): ``_flush_messages_to_session_db``,
``_invoke_tool``, ``_persist_session``, ``_save_trajectory``, ``_cleanup_task_resources``. A Turn
reads the former and calls the latter through its agent each time it needs them, so a
replacement made at any moment takes effect.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermes import interrupts, persistence_failure, probes
from hermes.ids import validate_session_id
from hermes.tools import registry

if TYPE_CHECKING:
    from hermes.runner import AIAgent
    from hermes.state import SessionDB

log = logging.getLogger("hermes.runner")  # the turn loop's log

PERSISTENCE_FAILED = "session_persistence_failed"


def pending_messages(messages: list[dict[str, Any]],
                     conversation_history: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The tail of `messages` that is not yet durable, oldest first.

    Scans back from the end to the newest durable message, so a flush costs the
    number of new messages, not the length of the transcript. Messages of
    `conversation_history` (by identity) count as durable unless they carry a
    `_row_id` that asks for a rewrite.
    """
    if not conversation_history and messages:
        # The usual flush: only the newest message is new (the loop below would say the same).
        last = messages[-1]
        if not last.get("_db_persisted") and (len(messages) == 1 or messages[-2].get("_db_persisted")):
            return [last]
    history_ids: set[int] | None = None
    pending = []
    for msg in reversed(messages):
        if msg.get("_db_persisted"):
            break
        if conversation_history and "_row_id" not in msg:
            if history_ids is None:
                history_ids = {id(m) for m in conversation_history}
            if id(msg) in history_ids:
                break
        pending.append(msg)
    pending.reverse()
    return pending


class Turn:
    """The current turn of `agent` (`turn_id` None: no turn started yet)."""

    def __init__(self, agent: "AIAgent", turn_id: str | None = None) -> None:
        self.agent = agent
        self.id = turn_id
        self.persistence_failed = False
        self.failure_cause: str | None = None
        self.failure_detail: str | None = None
        self.streamed_text = ""  # what the reply being received has streamed so far
        self.stream_open = False  # deltas were shown that no stream end has settled yet

    # ------------------------------------------------------------------ ids
    @property
    def db(self) -> "SessionDB | None":
        """The agent's database, read each time (a caller may attach one to a live agent)."""
        return self.agent._session_db

    def probe_ids(self, **extra: Any) -> dict[str, Any]:
        return {"session": self.agent.session_id, "turn": self.id, **extra}

    def idempotency_key(self, tool_call_id: str) -> str:
        # Stable across attempts: a rerun after a crash presents the same key to the tool.
        return f"{self.agent.session_id}:{self.id}:{tool_call_id}"

    def spill_dir(self) -> Path:
        """Where a tool result too big for the transcript is saved: one directory per session
        under ``<hermes_home>/tool_results``, never outside it (ValueError for an id that would be)."""
        root = self.agent.hermes_home / "tool_results"
        folder = root / validate_session_id(self.agent.session_id)
        if os.path.dirname(os.path.normpath(folder)) != os.path.normpath(root):  # defence in depth
            raise ValueError(f"session id {self.agent.session_id!r} does not name one directory under {root}")
        return folder

    # ---------------------------------------------------------- durability
    def note_failure(self, exc: BaseException) -> None:
        self.persistence_failed = True
        self.failure_cause = persistence_failure.classify(exc)
        self.failure_detail = str(exc)
        log.error("session persistence failed (%s): %s", self.failure_cause, exc)

    def write(self, pending: list[dict[str, Any]], start_turn: str | None = None) -> bool:
        """Commit `pending` in one transaction, then (only then) mark the live dicts durable."""
        db = self.db
        assert db is not None
        with interrupts.held():  # a Ctrl-C after COMMIT must not leave the rows looking unsaved
            results = db.write_pending(self.agent.session_id, pending, start_turn=start_turn,
                                       probe_context={"turn": self.id})
            for msg, (row_id, adopted) in zip(pending, results):
                if adopted is not None:
                    msg["content"] = adopted
                msg["_row_id"] = row_id
                msg["_db_persisted"] = True
        return True

    def commit(self, messages: list[dict[str, Any]],
               conversation_history: list[dict[str, Any]] | None = None) -> bool | None:
        """Commit every message not yet durable in one transaction (the body of the agent's flush).

        True on success, False on failure (the cause is kept for the turn's result),
        None when the agent has no database. Never raises into the turn.
        """
        if self.db is None:
            return None
        pending = pending_messages(messages, conversation_history)
        if not pending:
            return True
        try:
            return self.write(pending)
        except Exception as exc:
            self.note_failure(exc)
            return False

    def begin(self, messages: list[dict[str, Any]]) -> bool:
        """Commit the new user message together with the turn's 'running' row."""
        if self.db is None:
            return True
        try:
            self.agent._ensure_session_row()
            return self.write(pending_messages(messages), start_turn=self.id)
        except Exception as exc:
            self.note_failure(exc)
            return False

    def flush(self, messages: list[dict[str, Any]]) -> bool:
        """Flush during the turn, through the agent's flush; a failure (False or raised) closes the turn."""
        try:
            saved = self.agent._flush_messages_to_session_db(messages)
        except Exception as exc:  # a replaced flush may raise; it still ends the turn closed
            self.note_failure(exc)
            return False
        if saved is False:
            self.persistence_failed = True
            return False
        return True

    def record_intents(self, calls: list[dict[str, Any]]) -> bool:
        """Durably note that `calls` are about to run; False (and nothing runs) if that fails."""
        db = self.db
        if db is None:
            return True
        intents = [{"tool_call_id": c["id"], "tool_name": c["function"]["name"],
                    "policy": registry.policy(c["function"]["name"]),
                    "idempotency_key": self.idempotency_key(c["id"])} for c in calls]
        try:
            db.record_dispatches(self.agent.session_id, self.id or "", intents)
        except Exception as exc:
            self.note_failure(exc)
            return False
        return True

    def count_model_call(self) -> str:
        """Durably count the model call about to be made, so the agent's `max_model_calls` holds
        across restarts: "counted"; "limit" when the turn has made all the calls it may (nothing
        is counted, no call is made); "failed" when the write failed (no call is made)."""
        db = self.db
        if db is None or self.id is None:
            return "counted"
        try:
            counted = db.count_model_call(self.agent.session_id, self.id, self.agent.max_model_calls)
        except Exception as exc:
            self.note_failure(exc)
            return "failed"
        return "limit" if counted is None else "counted"

    def finish(self, state: str, error: str | None = None) -> bool | None:
        """Record the turn 'done' or 'failed'; None without a database. Only logs a failure: the
        answer (or the failure) is already durable, and recovery derives the rest from it."""
        db = self.db
        if db is None or self.id is None:
            return None
        try:
            db.finish_turn(self.id, state, error=error)
        except Exception as exc:
            log.warning("could not record turn %s as %s: %s", self.id, state, exc)
            return False
        return True

    # -------------------------------------------------------- UI projection
    def show_interim(self, content: str | None, already_streamed: bool) -> None:
        callback = self.agent.interim_assistant_callback
        if not content or callback is None:
            return
        probes.fire("callback.interim.before", **self.probe_ids())
        callback(content, already_streamed=already_streamed)
        probes.fire("callback.interim.after", **self.probe_ids())

    def show_tool_complete(self, tool_call_id: str, name: str, args: dict[str, Any] | None, content: str) -> None:
        callback = self.agent.tool_complete_callback
        if callback is None:
            return
        probes.fire("callback.tool_complete.before", **self.probe_ids(tool_call_id=tool_call_id))
        callback(tool_call_id, name, args, content)
        probes.fire("callback.tool_complete.after", **self.probe_ids(tool_call_id=tool_call_id))

    def show_delta(self, text: str) -> None:
        """One streamed piece of the reply being received: kept, and shown if anyone listens."""
        self.streamed_text += text
        callback = self.agent.stream_delta_callback
        if callback is not None:
            self.stream_open = True
            callback(text)

    def end_stream(self, outcome: str, text: str | None = None) -> None:
        """Settle the streamed reply shown since the last end ("commit" or "retract"); a no-op
        when nothing was streamed, so a reply nobody saw being streamed is never committed."""
        if not self.stream_open:
            return
        self.stream_open = False
        callback = self.agent.stream_end_callback
        if callback is not None:
            callback(outcome, None if outcome == "retract" else text)

    def retract_stream(self) -> None:
        """Void whatever any process streamed for this turn and never committed.

        Unconditional: the process that streamed it may have been killed, so this one cannot
        know whether anything is open. The durable transcript is authoritative.
        """
        self.stream_open = False
        callback = self.agent.stream_end_callback
        if callback is not None:
            callback("retract", None)

    # ---------------------------------------------------------------- tools
    def dispatch(self, call: dict[str, Any], args: dict[str, Any], task_id: str | None) -> Any:
        """Run one tool on the calling thread (the sequential path)."""
        call_id = call["id"]
        probes.fire("tool.dispatch.before", **self.probe_ids(tool_call_id=call_id))
        result = self.agent._call_tool(call["function"]["name"], args, task_id, call_id)
        probes.fire("tool.dispatch.after", **self.probe_ids(tool_call_id=call_id))
        return result

    def invoke(self, function_name: str, function_args: dict[str, Any], task_id: str | None,
               tool_call_id: str) -> Any:
        """Run one tool on a pool thread (the concurrent path), through the agent's `_invoke_tool`."""
        return self.agent._invoke_tool(function_name, function_args, task_id, tool_call_id)

    # --------------------------------------------------------------- result
    def result(self, messages: list[dict[str, Any]], *, final_response: str | None, completed: bool,
               exit_reason: str, api_calls: int, failure_reason: str | None = None,
               error: str | None = None) -> dict[str, Any]:
        result = {"final_response": final_response, "messages": messages, "completed": completed,
                  "failed": failure_reason is not None, "turn_exit_reason": exit_reason, "api_calls": api_calls,
                  "session_id": self.agent.session_id, "turn_id": self.id}
        if failure_reason is not None:
            result["failure_reason"] = failure_reason
            result["error"] = error
        return result

    def persistence_failed_result(self, messages: list[dict[str, Any]], api_calls: int) -> dict[str, Any]:
        """The turn ended closed by a failed write: the cause, and what a person should do."""
        cause = self.failure_cause or "unknown"
        db_path = getattr(self.db, "db_path", None)
        detail = None if cause == "locked" else self.failure_detail
        return self.result(messages, final_response=None, completed=False, exit_reason=PERSISTENCE_FAILED,
                           api_calls=api_calls, failure_reason=f"{PERSISTENCE_FAILED}:{cause}",
                           error=persistence_failure.describe(cause, detail, db_path))

    def read_failed_result(self, exc: BaseException) -> dict[str, Any]:
        """Recovery could not read the durable state (it reads before it acts): the turn ends closed
        exactly as after a failed write. Nothing was shown, run or written after the read, and no
        failure is recorded now (storage that just failed is not asked to write): the turn stays as
        it is durably, for a recovery on working storage to finish."""
        self.note_failure(exc)
        return self.persistence_failed_result([], 0)

    def failed_result(self, messages: list[dict[str, Any]], api_calls: int, exit_reason: str,
                      failure_reason: str, error: str) -> dict[str, Any]:
        """End the turn with a recorded failure (storage works; the model or the loop gave up)."""
        self.finish("failed", error=f"{failure_reason}: {error}")
        return self.result(messages, final_response=None, completed=False, exit_reason=exit_reason,
                           api_calls=api_calls, failure_reason=failure_reason, error=error)
