"""AIAgent: one conversation turn at a time, durable at every boundary a UI or a tool can see.

The turn loop, in the order the contract fixes it:

1. the user message and the turn's row are committed before the first model call;
2. an assistant tool-call block is committed before the interim UI callback and
   before any tool runs (the executors then keep "result durable before the next
   tool or UI callback");
3. the final answer is committed before the turn reports completion.

Any failed write ends the turn closed: nothing more is shown, run or requested,
and the result names the cause (``hermes.persistence_failure``).

Streamed text is provisional. Each streamed reply whose deltas reached
``stream_delta_callback`` ends in exactly one ``stream_end_callback(outcome, text)``:
"commit" with the reply's committed content once its row is durable (before the interim
callback, or in ``finalize_turn`` before the turn reports completion), or "retract"
(text None) when the reply is abandoned (a cut stream or other model error, a blank
reply asked again, a failed flush); and resuming an interrupted turn first retracts,
unconditionally, whatever a killed process may have streamed for it.

Names the tests patch (``handle_function_call``, ``get_tool_definitions``,
``check_toolset_requirements``, ``OpenAI``, ``_hermes_home``) are module globals,
looked up when used.
"""
from __future__ import annotations

import json
import logging
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

from openai import OpenAI

from hermes import executor, finalizer, persistence_failure, probes
from hermes.state import SessionDB
from hermes.tools import check_toolset_requirements, get_tool_definitions, handle_function_call, registry
from hermes.transcript import (
    fill_or_append_answer,
    normalize_tool_calls,
    public_copy,
    sanitize_api_messages,
    scrub_text,
)

log = logging.getLogger("hermes.runner")

_hermes_home = Path(os.environ.get("HERMES_HOME") or Path.home() / ".hermes")

PERSISTENCE_FAILED = "session_persistence_failed"


class ModelCallError(Exception):
    """The model endpoint gave no usable reply; `kind` is the machine-readable reason."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class ModelReply:
    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    streamed: bool = False


def _classify_model_error(exc: Exception) -> ModelCallError:
    import openai  # the SDK's exception types; imported here to keep the mapping in one place

    if isinstance(exc, openai.APITimeoutError):
        return ModelCallError("timeout", f"the model endpoint did not answer in time ({exc})")
    if isinstance(exc, openai.APIConnectionError):
        return ModelCallError("connection", f"could not reach the model endpoint ({exc})")
    if isinstance(exc, openai.RateLimitError):
        return ModelCallError("rate_limited", f"the model endpoint kept refusing with 429 ({exc})")
    if isinstance(exc, openai.APIStatusError):
        return ModelCallError(f"http_{exc.status_code}", f"the model endpoint answered HTTP "
                                                         f"{exc.status_code} ({exc})")
    return ModelCallError("bad_response", f"the model endpoint's reply could not be read "
                                          f"({type(exc).__name__}: {exc})")


class AIAgent:
    """An agent over any OpenAI-compatible endpoint, persisting to an optional SessionDB."""

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        model: str = "",
        *,
        session_db: SessionDB | None = None,
        session_id: str | None = None,
        enabled_toolsets: list[str] | None = None,
        system_prompt: str | None = None,
        stream: bool = False,
        max_iterations: int = 24,
        max_concurrent_tools: int = 8,
        request_timeout: float = 120.0,
        max_retries: int = 2,
        quiet_mode: bool = False,
        skip_context_files: bool = False,
        skip_memory: bool = False,
        interim_assistant_callback: Callable[..., Any] | None = None,
        tool_complete_callback: Callable[..., Any] | None = None,
        stream_delta_callback: Callable[[str], Any] | None = None,
        stream_end_callback: Callable[[str, str | None], Any] | None = None,
        http_client: Any = None,
    ) -> None:
        # This runtime reads no context files and keeps no long-term memory; the flags are
        # accepted so callers written for fuller agents construct it unchanged.
        del skip_context_files, skip_memory
        self.model = model
        self.quiet_mode = quiet_mode
        self.hermes_home = Path(_hermes_home)
        self.enabled_toolsets = enabled_toolsets
        self.tools = get_tool_definitions(enabled_toolsets=enabled_toolsets)
        self.valid_tool_names = {t["function"]["name"] for t in self.tools}
        self.toolset_problems = check_toolset_requirements(enabled_toolsets=enabled_toolsets)
        for toolset, missing in self.toolset_problems.items():
            log.warning("toolset %s is not usable yet: missing %s", toolset, ", ".join(missing))
        # `http_client`: an HTTP client for the SDK to use instead of building its own (a worker
        # forked from a warm template passes one whose TLS context the template already built).
        self.client = OpenAI(api_key=api_key or os.environ.get("OPENAI_API_KEY") or "no-key-configured",
                             base_url=base_url, timeout=request_timeout, max_retries=max_retries,
                             **({"http_client": http_client} if http_client is not None else {}))
        self.stream = stream
        self.max_iterations = max_iterations
        self.max_concurrent_tools = max_concurrent_tools
        self.system_prompt = system_prompt
        self._cached_system_prompt: str | None = None
        self._use_prompt_caching = False
        self.compression_enabled = False
        self.save_trajectories = False
        self.interim_assistant_callback = interim_assistant_callback
        self.tool_complete_callback = tool_complete_callback
        self.stream_delta_callback = stream_delta_callback
        self.stream_end_callback = stream_end_callback
        # True while deltas were shown that no stream_end has settled yet.
        self._stream_open = False

        self._session_db = session_db
        self._session_db_created = False
        self.session_id = session_id or f"session-{uuid.uuid4().hex[:12]}"
        self._persist_disabled = False
        self.session_source = "cli"

        self._current_turn_id: str | None = None
        self._current_streamed_assistant_text = ""
        self._incremental_persistence_failed = False
        self._persistence_failure_cause: str | None = None
        self._persistence_failure_detail: str | None = None

    # ------------------------------------------------------------------ ids
    def _probe_ids(self, **extra: Any) -> dict[str, Any]:
        return {"session": self.session_id, "turn": self._current_turn_id, **extra}

    def _idempotency_key(self, tool_call_id: str) -> str:
        # Stable across attempts: a rerun after a crash presents the same key to the tool.
        return f"{self.session_id}:{self._current_turn_id}:{tool_call_id}"

    def _spill_dir(self) -> Path:
        return self.hermes_home / "tool_results" / self.session_id

    # ---------------------------------------------------------- persistence
    def _reset_turn_state(self) -> None:
        self._incremental_persistence_failed = False
        self._persistence_failure_cause = None
        self._persistence_failure_detail = None
        self._current_streamed_assistant_text = ""

    def _note_persistence_failure(self, exc: BaseException) -> None:
        self._incremental_persistence_failed = True
        self._persistence_failure_cause = persistence_failure.classify(exc)
        self._persistence_failure_detail = str(exc)
        log.error("session persistence failed (%s): %s", self._persistence_failure_cause, exc)

    def _persistence_on(self) -> bool:
        return self._session_db is not None and not self._persist_disabled

    @staticmethod
    def _pending_messages(messages: list[dict[str, Any]],
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

    def _write(self, pending: list[dict[str, Any]], start_turn: str | None = None) -> bool:
        assert self._session_db is not None
        results = self._session_db.write_pending(self.session_id, pending, start_turn=start_turn,
                                                 probe_context={"turn": self._current_turn_id})
        # Only now, after COMMIT, do the live dicts learn they are durable.
        for msg, (row_id, adopted) in zip(pending, results):
            if adopted is not None:
                msg["content"] = adopted
            msg["_row_id"] = row_id
            msg["_db_persisted"] = True
        return True

    def _flush_messages_to_session_db(self, messages: list[dict[str, Any]],
                                      conversation_history: list[dict[str, Any]] | None = None) -> bool | None:
        """Commit every message not yet durable in one transaction.

        True on success, False on failure (the cause is kept for the turn's result),
        None when persistence is off. Never raises into the turn.
        """
        if self._session_db is None or self._persist_disabled:  # i.e. not self._persistence_on()
            return None
        pending = self._pending_messages(messages, conversation_history)
        if not pending:
            return True
        try:
            return self._write(pending)
        except Exception as exc:
            self._note_persistence_failure(exc)
            return False

    def _ensure_session_row(self) -> None:
        if not self._session_db_created:
            assert self._session_db is not None
            self._session_db.create_session(self.session_id, source=self.session_source, model=self.model,
                                            system_prompt=self.system_prompt)
            self._session_db_created = True

    def _begin_turn(self, messages: list[dict[str, Any]], turn_id: str) -> bool:
        """Commit the new user message together with the turn's 'running' row."""
        if not self._persistence_on():
            return True
        try:
            self._ensure_session_row()
            return self._write(self._pending_messages(messages), start_turn=turn_id)
        except Exception as exc:
            self._note_persistence_failure(exc)
            return False

    def _flush_incremental(self, messages: list[dict[str, Any]]) -> bool:
        """Flush during a turn; a failure (False or raised) marks the turn's persistence failed."""
        try:
            saved = self._flush_messages_to_session_db(messages)
        except Exception as exc:  # a replaced flush may raise; it still ends the turn closed
            self._note_persistence_failure(exc)
            return False
        if saved is False:
            self._incremental_persistence_failed = True
            return False
        return True

    def _record_dispatch_intents(self, calls: list[dict[str, Any]]) -> bool:
        """Durably note that `calls` are about to run; False (and nothing runs) if that fails."""
        if not self._persistence_on():
            return True
        intents = [{"tool_call_id": c["id"], "tool_name": c["function"]["name"],
                    "policy": registry.policy(c["function"]["name"]),
                    "idempotency_key": self._idempotency_key(c["id"])} for c in calls]
        try:
            assert self._session_db is not None
            self._session_db.record_dispatches(self.session_id, self._current_turn_id or "", intents)
        except Exception as exc:
            self._note_persistence_failure(exc)
            return False
        return True

    def _persist_session(self, messages: list[dict[str, Any]],
                         conversation_history: list[dict[str, Any]] | None = None) -> bool | None:
        """Record durably that the current turn completed (its answer is already committed)."""
        if not self._persistence_on() or self._current_turn_id is None:
            return None
        try:
            assert self._session_db is not None
            self._session_db.finish_turn(self._current_turn_id, "done")
        except Exception as exc:
            # The answer is durable; recovery derives completion from it, so this only logs.
            log.warning("could not mark turn %s done: %s", self._current_turn_id, exc)
            return False
        return True

    def _save_trajectory(self, messages: list[dict[str, Any]], user_message: str, completed: bool) -> None:
        """Append the turn to trajectories.jsonl under the home directory, when asked to."""
        if not self.save_trajectories:
            return
        self.hermes_home.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self.hermes_home / "trajectories.jsonl"
        fd = os.open(path, os.O_CREAT | os.O_APPEND | os.O_WRONLY, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"session": self.session_id, "turn": self._current_turn_id,
                                 "user": scrub_text(user_message), "completed": completed,
                                 "messages": [public_copy(m) for m in messages]}, ensure_ascii=False) + "\n")

    def _cleanup_task_resources(self, task_id: str) -> None:
        registry.cleanup_task(task_id)

    # ----------------------------------------------------------- UI callbacks
    def _project_interim(self, content: str | None, already_streamed: bool) -> None:
        if not content or self.interim_assistant_callback is None:
            return
        probes.fire("callback.interim.before", **self._probe_ids())
        self.interim_assistant_callback(content, already_streamed=already_streamed)
        probes.fire("callback.interim.after", **self._probe_ids())

    def _project_tool_complete(self, tool_call_id: str, name: str, args: dict[str, Any] | None,
                               content: str) -> None:
        if self.tool_complete_callback is None:
            return
        probes.fire("callback.tool_complete.before", **self._probe_ids(tool_call_id=tool_call_id))
        self.tool_complete_callback(tool_call_id, name, args, content)
        probes.fire("callback.tool_complete.after", **self._probe_ids(tool_call_id=tool_call_id))

    def _end_stream(self, outcome: str, text: str | None = None) -> None:
        """Settle the streamed reply shown since the last end ("commit" or "retract"); a no-op
        when nothing was streamed, so a reply nobody saw being streamed is never committed."""
        if not self._stream_open:
            return
        self._stream_open = False
        if self.stream_end_callback is not None:
            self.stream_end_callback(outcome, None if outcome == "retract" else text)

    def _retract_turn_stream(self) -> None:
        """Void whatever any process streamed for the current turn and never committed.

        Unconditional: the process that streamed it may have been killed, so this one cannot
        know whether anything is open. The durable transcript is authoritative.
        """
        self._stream_open = False
        if self.stream_end_callback is not None:
            self.stream_end_callback("retract", None)

    # ------------------------------------------------------------------ tools
    def _is_parallel_safe(self, name: str) -> bool:
        return registry.parallel_safe(name)

    def _dispatch_tool(self, call: dict[str, Any], args: dict[str, Any], task_id: str | None) -> Any:
        """Run one tool on the calling thread (the sequential path)."""
        call_id = call["id"]
        probes.fire("tool.dispatch.before", **self._probe_ids(tool_call_id=call_id))
        result = handle_function_call(call["function"]["name"], args, task_id, tool_call_id=call_id,
                                      idempotency_key=self._idempotency_key(call_id),
                                      session_id=self.session_id, turn_id=self._current_turn_id)
        probes.fire("tool.dispatch.after", **self._probe_ids(tool_call_id=call_id))
        return result

    def _invoke_tool(self, function_name: str, function_args: dict[str, Any], effective_task_id: str | None,
                     tool_call_id: str) -> Any:
        """Run one tool on a pool thread (the concurrent path)."""
        return handle_function_call(function_name, function_args, effective_task_id, tool_call_id=tool_call_id,
                                    idempotency_key=self._idempotency_key(tool_call_id),
                                    session_id=self.session_id, turn_id=self._current_turn_id)

    def _execute_tool_calls(self, assistant_message: Any, messages: list[dict[str, Any]],
                            effective_task_id: str | None, api_call_count: int = 0) -> None:
        segments = executor.plan_segments(self, list(assistant_message.tool_calls or ()))
        if len(segments) == 1 and segments[0][0] == "parallel":
            self._execute_tool_calls_concurrent(assistant_message, messages, effective_task_id)
        elif len(segments) == 1:
            self._execute_tool_calls_sequential(assistant_message, messages, effective_task_id)
        else:
            executor.execute_tool_calls_segmented(self, assistant_message, messages, effective_task_id,
                                                  segments=segments)

    def _execute_tool_calls_sequential(self, assistant_message: Any, messages: list[dict[str, Any]],
                                       effective_task_id: str | None) -> None:
        executor.execute_tool_calls_sequential(self, assistant_message, messages, effective_task_id)

    def _execute_tool_calls_concurrent(self, assistant_message: Any, messages: list[dict[str, Any]],
                                       effective_task_id: str | None) -> None:
        executor.execute_tool_calls_concurrent(self, assistant_message, messages, effective_task_id)

    # ------------------------------------------------------------------ model
    def _api_messages(self, messages: list[dict[str, Any]], system_message: str | None) -> list[dict[str, Any]]:
        system = system_message or self._cached_system_prompt or self.system_prompt
        head = [{"role": "system", "content": system}] if system else []
        return head + sanitize_api_messages(messages)

    def _call_model(self, messages: list[dict[str, Any]], system_message: str | None) -> ModelReply:
        request: dict[str, Any] = {"model": self.model, "messages": self._api_messages(messages, system_message)}
        if self.tools:
            request["tools"] = self.tools
        self._current_streamed_assistant_text = ""
        self._end_stream("retract")  # a reply left unsettled is abandoned now
        probes.fire("model.request", **self._probe_ids())
        try:
            try:
                reply = self._stream_reply(request) if self.stream else self._plain_reply(request)
            except ModelCallError:
                raise
            except Exception as exc:
                raise _classify_model_error(exc) from exc
        except BaseException:
            # Whatever was streamed of a reply that failed (a cut stream, a bad chunk, an
            # interrupt) will never be committed.
            self._end_stream("retract")
            raise
        probes.fire("model.response", **self._probe_ids())
        return reply

    def _plain_reply(self, request: dict[str, Any]) -> ModelReply:
        response = self.client.chat.completions.create(**request)
        choices = getattr(response, "choices", None)
        if not choices:
            raise ModelCallError("empty_choices", "the model endpoint returned a reply with no choices")
        choice = choices[0]
        message = choice.message
        return ModelReply(content=getattr(message, "content", None),
                          tool_calls=normalize_tool_calls(getattr(message, "tool_calls", None)),
                          finish_reason=getattr(choice, "finish_reason", None))

    def _stream_reply(self, request: dict[str, Any]) -> ModelReply:
        content: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        finish_reason = None
        for chunk in self.client.chat.completions.create(stream=True, **request):
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            delta = choice.delta
            if delta is not None and delta.content:
                content.append(delta.content)
                self._current_streamed_assistant_text += delta.content
                if self.stream_delta_callback is not None:
                    self._stream_open = True
                    self.stream_delta_callback(delta.content)
            for part in (delta.tool_calls or []) if delta is not None else []:
                slot = calls.setdefault(part.index, {"id": "", "type": "function",
                                                     "function": {"name": "", "arguments": ""}})
                if part.id:
                    slot["id"] = part.id
                if part.function is not None:
                    slot["function"]["name"] += part.function.name or ""
                    slot["function"]["arguments"] += part.function.arguments or ""
            if choice.finish_reason:
                finish_reason = choice.finish_reason
            probes.fire("model.chunk", **self._probe_ids())
        if finish_reason is None:
            self._current_streamed_assistant_text = ""
            raise ModelCallError("truncated_stream", "the model's stream ended before it said it was finished "
                                                     "(no finish_reason); the partial reply was discarded")
        return ModelReply(content="".join(content) or None, tool_calls=[calls[i] for i in sorted(calls)],
                          finish_reason=finish_reason, streamed=True)

    # ------------------------------------------------------------------ turns
    def _result(self, messages: list[dict[str, Any]], *, final_response: str | None, completed: bool,
                exit_reason: str, api_calls: int, failure_reason: str | None = None,
                error: str | None = None) -> dict[str, Any]:
        result = {"final_response": final_response, "messages": messages, "completed": completed,
                  "failed": failure_reason is not None, "interrupted": False,
                  "turn_exit_reason": exit_reason, "api_calls": api_calls,
                  "session_id": self.session_id, "turn_id": self._current_turn_id}
        if failure_reason is not None:
            result["failure_reason"] = failure_reason
            result["error"] = error
        return result

    def _persistence_failed_result(self, messages: list[dict[str, Any]], api_calls: int) -> dict[str, Any]:
        cause = self._persistence_failure_cause or "unknown"
        db_path = getattr(self._session_db, "db_path", None)
        detail = None if cause == "locked" else self._persistence_failure_detail
        return self._result(messages, final_response=None, completed=False, exit_reason=PERSISTENCE_FAILED,
                            api_calls=api_calls, failure_reason=f"{PERSISTENCE_FAILED}:{cause}",
                            error=persistence_failure.describe(cause, detail, db_path))

    def _failed_result(self, messages: list[dict[str, Any]], api_calls: int, exit_reason: str,
                       failure_reason: str, error: str) -> dict[str, Any]:
        """End the turn with a recorded failure (storage works; the model or the loop gave up)."""
        if self._persistence_on() and self._current_turn_id is not None:
            try:
                assert self._session_db is not None
                self._session_db.finish_turn(self._current_turn_id, "failed", error=f"{failure_reason}: {error}")
            except Exception as exc:
                log.warning("could not record the failure of turn %s: %s", self._current_turn_id, exc)
        return self._result(messages, final_response=None, completed=False, exit_reason=exit_reason,
                            api_calls=api_calls, failure_reason=failure_reason, error=error)

    def run_conversation(self, user_message: str, system_message: str | None = None,
                         conversation_history: list[dict[str, Any]] | None = None,
                         task_id: str | None = None, *, turn_id: str | None = None) -> dict[str, Any]:
        """Run one user turn to its final answer, a recorded failure, or a closed persistence failure."""
        self._end_stream("retract")  # settled under the turn it belongs to, before the id changes
        self._reset_turn_state()
        self._current_turn_id = turn_id or f"turn-{uuid.uuid4().hex[:16]}"
        effective_task_id = task_id or f"task-{uuid.uuid4().hex[:12]}"
        # History came from the database (or the caller vouches for it): it is durable already.
        messages = [dict(m) if "_row_id" in m else dict(m, _db_persisted=True) for m in conversation_history or ()]
        messages.append({"role": "user", "content": user_message, "_turn_id": self._current_turn_id})
        probes.fire("turn.start", **self._probe_ids())
        if not self._begin_turn(messages, self._current_turn_id):
            return self._persistence_failed_result(messages, 0)
        return self.continue_turn(messages, system_message=system_message, task_id=effective_task_id,
                                  user_message=user_message, conversation_history=conversation_history)

    def continue_turn(self, messages: list[dict[str, Any]], *, system_message: str | None, task_id: str,
                      user_message: str, conversation_history: list[dict[str, Any]] | None = None,
                      api_call_count: int = 0) -> dict[str, Any]:
        """Drive the current turn from `messages` (whose tail is durable) to its end."""
        turn_id = self._current_turn_id
        empty_replies = 0
        while api_call_count < self.max_iterations:
            api_call_count += 1
            try:
                reply = self._call_model(messages, system_message)
            except ModelCallError as exc:
                return self._failed_result(messages, api_call_count, "model_error", f"model_error:{exc.kind}",
                                           f"The model call failed: {exc}. The transcript is saved and "
                                           "well-formed; retry the turn once the endpoint works.")
            if reply.tool_calls:
                block = {"role": "assistant", "content": reply.content, "tool_calls": reply.tool_calls,
                         "_turn_id": turn_id}
                messages.append(block)
                if not self._flush_incremental(messages):
                    self._end_stream("retract")
                    return self._persistence_failed_result(messages, api_call_count)
                self._end_stream("commit", block["content"])
                self._project_interim(reply.content, already_streamed=reply.streamed)
                self._execute_tool_calls(SimpleNamespace(content=reply.content, tool_calls=reply.tool_calls),
                                         messages, task_id, api_call_count)
                if self._incremental_persistence_failed:
                    return self._persistence_failed_result(messages, api_call_count)
                continue
            if not (reply.content or "").strip() and not self._current_streamed_assistant_text.strip():
                # A blank answer is not an answer; ask once more before giving up.
                self._end_stream("retract")
                empty_replies += 1
                if empty_replies < 2:
                    continue
                return self._failed_result(messages, api_call_count, "model_error", "model_error:empty_response",
                                           "The model answered with neither text nor tool calls, twice. "
                                           "The transcript is saved; retry the turn.")
            fill_or_append_answer(messages, reply.content or "", turn_id)
            return finalizer.finalize_turn(
                self, final_response=reply.content or "", api_call_count=api_call_count, interrupted=False,
                failed=False, messages=messages, conversation_history=conversation_history,
                effective_task_id=task_id, turn_id=turn_id, user_message=user_message,
                original_user_message=user_message, _should_review_memory=False,
                _turn_exit_reason="text_response(final)")
        return self._failed_result(messages, api_call_count, "max_iterations", "max_iterations",
                                   f"The turn used all {self.max_iterations} model calls it is allowed without "
                                   "reaching an answer. The transcript is saved; raise max_iterations or "
                                   "simplify the request.")
