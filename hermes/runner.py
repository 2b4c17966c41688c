"""AIAgent: one conversation turn at a time, durable at every boundary a UI or a tool can see.

The turn loop, in the order the contract fixes it:

1. the user message and the turn's row are committed before the first model call;
2. an assistant tool-call block is committed before the interim UI callback and
   before any tool runs (the executors then keep "result durable before the next
   tool or UI callback");
3. the final answer is committed before the turn reports completion.

With ``compact_above`` set, the loop may compact the session between a tool block whose results
are all durable and the next model call (``hermes.compaction.compact_in_turn``): older turns
become one summary row, the turn's own rows are kept as clones, and the loop goes on with the
reloaded live transcript.

Any failed write ends the turn closed: nothing more is shown, run or requested,
and the result names the cause (``hermes.persistence_failure``).

Streamed text is provisional. Each streamed reply whose deltas reached
``stream_delta_callback`` ends in exactly one ``stream_end_callback(outcome, text)``:
"commit" with the reply's committed content once its row is durable (before the interim
callback, or in ``finalize_turn`` before the turn reports completion), or "retract"
(text None) when the reply is abandoned (a cut stream or other model error, a blank
reply asked again, a failed flush); and resuming an interrupted turn first retracts,
unconditionally, whatever a killed process may have streamed for it.

Each turn's state lives in a ``hermes.turn.Turn`` (``agent.turn``), which the tool
executors, the finalizer and recovery share with this loop. Names the tests patch
(``handle_function_call``, ``get_tool_definitions``, ``check_toolset_requirements``,
``OpenAI``, ``_hermes_home``) are module globals, looked up when used; so are the
agent's replaceable steps (``_flush_messages_to_session_db``, ``_execute_tool_calls*``,
``_invoke_tool``, ``_persist_session``, ``_save_trajectory``, ``_cleanup_task_resources``),
looked up on the agent each time.
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

from hermes import chat_request, compaction, executor, finalizer, probes
from hermes.content import UserContent
from hermes.ids import validate_session_id
from hermes.private_files import make_private_dirs, open_private
from hermes.state import SessionDB
from hermes.tools import check_toolset_requirements, get_tool_definitions, handle_function_call, registry
from hermes.transcript import (
    fill_or_append_answer,
    is_blank,
    normalize_tool_calls,
    public_copy,
    sanitize_api_messages,
    scrub_content,
    turn_unique_calls,
)
from hermes.turn import PERSISTENCE_FAILED, Turn

__all__ = ["AIAgent", "PERSISTENCE_FAILED", "ModelCallError", "check_toolset_requirements", "get_tool_definitions",
           "handle_function_call"]

log = logging.getLogger("hermes.runner")

_hermes_home = Path(os.environ.get("HERMES_HOME") or Path.home() / ".hermes")


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
        max_model_calls: int | None = None,
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
        compact_above: int = 0,
    ) -> None:
        # This runtime prints nothing, reads no context files and keeps no long-term memory; the
        # flags are accepted so callers written for fuller agents (the seed contract) construct it.
        del quiet_mode, skip_context_files, skip_memory
        # Checked first (hermes.ids): a bad id is refused before anything is built.
        self.session_id = f"session-{uuid.uuid4().hex[:12]}" if session_id is None else session_id
        self.model = model
        self.hermes_home = Path(_hermes_home)
        self.tools = get_tool_definitions(enabled_toolsets=enabled_toolsets)
        self.valid_tool_names = {t["function"]["name"] for t in self.tools}
        for toolset, missing in check_toolset_requirements(enabled_toolsets=enabled_toolsets).items():
            log.warning("toolset %s is not usable yet: missing %s", toolset, ", ".join(missing))
        # `http_client`: an HTTP client for the SDK to use instead of building its own (a worker
        # forked from a warm template passes one whose TLS context the template already built).
        self.client = OpenAI(api_key=api_key or os.environ.get("OPENAI_API_KEY") or "no-key-configured",
                             base_url=base_url, timeout=request_timeout, max_retries=max_retries,
                             **({"http_client": http_client} if http_client is not None else {}))
        self.stream = stream
        self.max_iterations = max_iterations
        # Model calls per turn over all its attempts, counted on the turn's row (None: no limit beyond
        # max_iterations, which counts the calls of one attempt only).
        self.max_model_calls = max_model_calls
        self.max_concurrent_tools = max_concurrent_tools
        self.system_prompt = system_prompt
        self._cached_system_prompt: str | None = None
        self.save_trajectories = False
        self.interim_assistant_callback = interim_assistant_callback
        self.tool_complete_callback = tool_complete_callback
        self.stream_delta_callback = stream_delta_callback
        self.stream_end_callback = stream_end_callback
        # Compaction inside a turn (hermes.compaction.compact_in_turn): once a tool block's results
        # are all durable and before the next model call, a session holding more than this many
        # active rows has its older turns summarized, the current turn kept verbatim. 0: never. A
        # long tool loop would otherwise grow the request without bound until the next turn.
        self.compact_above = compact_above

        self._session_db = session_db
        self._session_db_created = False
        self.session_source = "cli"
        self.turn = Turn(self)

    # ----------------------------------------------------------- the turn
    @property
    def session_db(self) -> SessionDB | None:
        return self._session_db

    @property
    def session_id(self) -> str:
        return self._session_id

    @session_id.setter
    def session_id(self, value: str) -> None:
        """Checked whenever it is set (``hermes.ids``): the id names a directory of spilled results."""
        self._session_id = validate_session_id(value)

    def start_turn(self, turn_id: str | None = None, *, resumed: bool = False) -> Turn:
        """Make `turn_id` (default: a new id) the current turn; `resumed`: one a killed process began."""
        self.turn.end_stream("retract")  # settled under the turn it belongs to, before the turn changes
        self.turn = Turn(self, turn_id or f"turn-{uuid.uuid4().hex[:16]}")
        if resumed:
            # Its rows are durable, so its session row is too; and whatever a killed process
            # streamed for it and never committed is void now.
            self._session_db_created = True
            self.turn.retract_stream()
        return self.turn

    # Read (and, for the streamed text, set) by callers written against fuller agents.
    @property
    def _incremental_persistence_failed(self) -> bool:
        return self.turn.persistence_failed

    @property
    def _current_streamed_assistant_text(self) -> str:
        return self.turn.streamed_text

    @_current_streamed_assistant_text.setter
    def _current_streamed_assistant_text(self, text: str) -> None:
        self.turn.streamed_text = text

    # ------------------------------------------------- replaceable steps
    def _flush_messages_to_session_db(self, messages: list[dict[str, Any]],
                                      conversation_history: list[dict[str, Any]] | None = None) -> bool | None:
        """Commit every message not yet durable in one transaction (see ``Turn.commit``)."""
        return self.turn.commit(messages, conversation_history)

    def _ensure_session_row(self) -> None:
        if not self._session_db_created:
            assert self._session_db is not None
            self._session_db.create_session(self.session_id, source=self.session_source, model=self.model,
                                            system_prompt=self.system_prompt)
            self._session_db_created = True

    def _persist_session(self, messages: list[dict[str, Any]],
                         conversation_history: list[dict[str, Any]] | None = None) -> bool | None:
        """Record durably that the current turn completed (its answer is already committed)."""
        return self.turn.finish("done")

    def _save_trajectory(self, messages: list[dict[str, Any]], user_message: UserContent, completed: bool) -> None:
        """Append the turn to trajectories.jsonl under the home directory, when asked to. The turn is
        durably done by then: a log that cannot be written (a full disk, a read-only home) costs a
        warning, never the turn its answer."""
        if not self.save_trajectories:
            return
        line = json.dumps({"session": self.session_id, "turn": self.turn.id, "user": scrub_content(user_message),
                           "completed": completed, "messages": [public_copy(m) for m in messages]},
                          ensure_ascii=False) + "\n"
        try:
            make_private_dirs(self.hermes_home)
            with open_private(self.hermes_home / "trajectories.jsonl", "a", encoding="utf-8") as fh:
                fh.write(line)
        except OSError as exc:
            log.warning("turn %s: its trajectory was not saved: %s", self.turn.id, exc.strerror or exc)

    def _cleanup_task_resources(self, task_id: str) -> None:
        registry.cleanup_task(task_id)

    def _call_tool(self, function_name: str, function_args: dict[str, Any], task_id: str | None,
                   tool_call_id: str) -> Any:
        """Run one tool through `handle_function_call`, telling it the turn's ids."""
        return handle_function_call(function_name, function_args, task_id, tool_call_id=tool_call_id,
                                    idempotency_key=self.turn.idempotency_key(tool_call_id),
                                    session_id=self.session_id, turn_id=self.turn.id)

    def _invoke_tool(self, function_name: str, function_args: dict[str, Any], effective_task_id: str | None,
                     tool_call_id: str) -> Any:
        """Run one tool on a pool thread (the concurrent path)."""
        return self._call_tool(function_name, function_args, effective_task_id, tool_call_id)

    def _execute_tool_calls(self, assistant_message: Any, messages: list[dict[str, Any]],
                            effective_task_id: str | None, api_call_count: int = 0) -> None:
        segments = executor.plan_segments(list(assistant_message.tool_calls or ()))
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
        turn = self.turn
        turn.streamed_text = ""
        turn.end_stream("retract")  # a reply left unsettled is abandoned now
        probes.fire("model.request", **turn.probe_ids())
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
            turn.end_stream("retract")
            raise
        probes.fire("model.response", **turn.probe_ids())
        return reply

    def _plain_reply(self, request: dict[str, Any]) -> ModelReply:
        response = chat_request.create(self.client, request)
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
        turn = self.turn
        for chunk in chat_request.stream(self.client, request):
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            delta = choice.delta
            if delta is not None and delta.content:
                content.append(delta.content)
                turn.show_delta(delta.content)
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
            probes.fire("model.chunk", **turn.probe_ids())
        if finish_reason is None:
            turn.streamed_text = ""
            raise ModelCallError("truncated_stream", "the model's stream ended before it said it was finished "
                                                     "(no finish_reason); the partial reply was discarded")
        return ModelReply(content="".join(content) or None, tool_calls=[calls[i] for i in sorted(calls)],
                          finish_reason=finish_reason, streamed=True)

    # ------------------------------------------------------------------ turns
    def run_conversation(self, user_message: UserContent, system_message: str | None = None,
                         conversation_history: list[dict[str, Any]] | None = None,
                         task_id: str | None = None, *, turn_id: str | None = None) -> dict[str, Any]:
        """Run one user turn to its final answer, a recorded failure, or a closed persistence failure.

        `user_message` is text, or a list of OpenAI content parts (``hermes.content``): a list is
        stored as JSON and read back as a list, and the model is sent it as given.
        """
        turn = self.start_turn(turn_id)
        effective_task_id = task_id or f"task-{uuid.uuid4().hex[:12]}"
        # History came from the database (or the caller vouches for it): it is durable already.
        messages = [dict(m) if "_row_id" in m else dict(m, _db_persisted=True) for m in conversation_history or ()]
        messages.append({"role": "user", "content": user_message, "_turn_id": turn.id})
        probes.fire("turn.start", **turn.probe_ids())
        if not turn.begin(messages):
            return turn.persistence_failed_result(messages, 0)
        return self.continue_turn(messages, system_message=system_message, task_id=effective_task_id,
                                  user_message=user_message, conversation_history=conversation_history)

    def continue_turn(self, messages: list[dict[str, Any]], *, system_message: str | None, task_id: str,
                      user_message: UserContent, conversation_history: list[dict[str, Any]] | None = None,
                      api_call_count: int = 0) -> dict[str, Any]:
        """Drive the current turn from `messages` (whose tail is durable) to its end."""
        turn = self.turn
        empty_replies = 0
        while api_call_count < self.max_iterations:
            # Between a finished tool block and the next model call (a resumed turn's first model
            # call included), the session may be compacted. It replaces `messages` in place with
            # the reloaded live transcript; a failed write or read there ends the turn closed.
            if self.compact_above > 0 and not compaction.compact_in_turn(self, messages, self.compact_above):
                return turn.persistence_failed_result(messages, api_call_count)
            api_call_count += 1
            counted = turn.count_model_call()
            if counted == "failed":
                return turn.persistence_failed_result(messages, api_call_count - 1)
            if counted == "limit":
                return turn.failed_result(
                    messages, api_call_count - 1, "model_call_limit", "model-call limit",
                    f"this turn has made {self.max_model_calls} model calls, its limit over all its attempts, "
                    "without reaching an answer. The transcript so far is kept and well-formed; submit a "
                    "narrower request, or raise the limit (--max-model-calls).")
            try:
                reply = self._call_model(messages, system_message)
            except ModelCallError as exc:
                return turn.failed_result(messages, api_call_count, "model_error", f"model_error:{exc.kind}",
                                          f"The model call failed: {exc}. The transcript is saved and "
                                          "well-formed; retry the turn once the endpoint works.")
            if reply.tool_calls:
                if not self._run_tool_block(reply, messages, task_id, api_call_count):
                    return turn.persistence_failed_result(messages, api_call_count)
                continue
            if is_blank(reply.content) and is_blank(turn.streamed_text):
                # A blank answer is not an answer; ask once more before giving up.
                turn.end_stream("retract")
                empty_replies += 1
                if empty_replies < 2:
                    continue
                return turn.failed_result(messages, api_call_count, "model_error", "model_error:empty_response",
                                          "The model answered with neither text nor tool calls, twice. "
                                          "The transcript is saved; retry the turn.")
            fill_or_append_answer(messages, reply.content or "", turn.id)
            return finalizer.finalize_turn(
                self, final_response=reply.content or "", api_call_count=api_call_count, interrupted=False,
                failed=False, messages=messages, conversation_history=conversation_history,
                effective_task_id=task_id, turn_id=turn.id, user_message=user_message,
                original_user_message=user_message, _should_review_memory=False,
                _turn_exit_reason="text_response(final)")
        return turn.failed_result(messages, api_call_count, "max_iterations", "max_iterations",
                                  f"The turn used all {self.max_iterations} model calls it is allowed without "
                                  "reaching an answer. The transcript is saved; raise max_iterations or "
                                  "simplify the request.")

    def _run_tool_block(self, reply: ModelReply, messages: list[dict[str, Any]], task_id: str,
                        api_call_count: int) -> bool:
        """Commit the reply's tool-call block, show its text, run its calls. False: the turn ended closed."""
        turn = self.turn
        calls = turn_unique_calls(reply.tool_calls, messages, turn.id)
        block = {"role": "assistant", "content": reply.content, "tool_calls": calls, "_turn_id": turn.id}
        messages.append(block)
        if not turn.flush(messages):
            turn.end_stream("retract")
            return False
        turn.end_stream("commit", block["content"])
        turn.show_interim(reply.content, already_streamed=reply.streamed)
        self._execute_tool_calls(SimpleNamespace(content=reply.content, tool_calls=calls),
                                 messages, task_id, api_call_count)
        return not turn.persistence_failed
