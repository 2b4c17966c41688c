"""The openai-agents target: run a turn with the OpenAI Agents SDK (PyPI `openai-agents`) inside the worker.

`python -m worker run|resume --target openai-agents ...` runs the turn with an `agents.Agent`
and `Runner.run_streamed`, its conversation kept in the SDK's own `SQLiteSession(session_id,
db_path=--db)`. Nothing of the SDK is edited or patched: the probes, the chaos tools and the
model client go in through its public extension points (`worker.targets.openai_agents_wiring`,
imported only here, once the target is chosen):

- the model is the SDK's `OpenAIChatCompletionsModel` on an `AsyncOpenAI` client pointed at
  `--base-url` (the scripted model server speaks the chat-completions API);
- the tools are the chaos tools (the same ledger and effect reports as every target) as the
  SDK's `FunctionTool`s;
- what a UI shows is what `Runner.run_streamed(...).stream_events()` delivers.

Probes. Of our 18 kill points (hermes.probes.POINTS), these fire on the SDK:

- `turn.start` before the run starts (the message is only in memory), `finalize.before` /
  `finalize.after` once the run has ended, before its outcome is reported;
- `model.request` / `model.response` around each model call, `model.chunk` after each
  streamed delta. `Runner.run_streamed` streams every model call, with or without `--stream`
  (which only decides whether text deltas are shown), so `model.chunk` fires in every scenario;
- `flush.begin` / `flush.committed` around each session write (`add_items`: one write
  transaction for a batch of items);
- `tool.dispatch.before` / `.after` around each tool run, in the tool's `on_invoke_tool`;
- `callback.interim.*` and `callback.tool_complete.*` around the projections;
- `resume.begin` / `resume.reconciled` in this module's `resume()` (the SDK has none, below).

The two that cannot fire are in the record's `unreachable`, each with its reason.

What the SDK writes, and when (the `agent_sessions` / `agent_messages` tables, one JSON item
per row): the user's input before the first model call; then, per model reply, the reply's
items (an assistant message, its `function_call` items) together with the tools' outputs
(`function_call_output` items), in one transaction, AFTER the tools have run; the final
assistant message before the run ends. So a tool runs while nothing durable asks for it.

Resume. The SDK cannot resume an interrupted run. What a restarted application does with its
session: it loads the session's items and, when the last user input has no final answer
after it, runs the agent again on that session. Whether the user message is sent again
depends on whether it is durable: it is (the turn would not have started otherwise, and the
supervisor resumes only a started turn), so it is NOT re-sent (a re-send would store the
question twice); the run gets an empty input and the SDK sends the stored history, minus any
`function_call` without an output (the SDK drops those from what it sends, and leaves them
in the store). `run` of a turn whose question is already durable does the same.

List content (``--message-format json``): the SDK's run input is a str or a list of input items,
and a user message item (``{"role": "user", "content": [...]}``) takes a list of content parts;
the SDK (0.24) accepts Chat Completions parts there as they are (`Converter`'s aliases: "text",
and "image_url" with its url), stores the item as given, and sends the model the text parts as
given and each image part as ``{"type": "image_url", "image_url": {"url": ..., "detail": "auto"}}``
(the API's default detail made explicit). So a list is passed through, as one user item
(`user_input`, `content_parts_refusal`).

Turn ids: the k-th user item of the session is turn `turn-k` (the campaign runs turn k as
the session's k-th message, and a resume never adds a user item); nothing else is stored.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
from pathlib import Path
from typing import Any, Callable

from hermes import persistence_failure, probes
from hermes.extras import install_line
from hermes.transcript import is_blank
from targetkit import ANY, REQUEST_NOT_DURABLE, Promises, Target, TargetOption
from worker.targets import Report, open_ledger, show, toolsets_of, user_app_tools

log = logging.getLogger("worker.targets.openai_agents")

NAME = "openai-agents"
DISTRIBUTION = "openai-agents>=0.24,<0.25"

# Kill points the SDK gives no place for, and why (`--list-points --target openai-agents`).
UNREACHABLE_POINTS: dict[str, str] = {
    "flush.in_txn": ("SQLiteSession.add_items opens and commits its write transaction inside private helpers "
                     "(_write_connection, _insert_items, in a helper thread); the public add_items lets a "
                     "subclass act only before or after the whole transaction"),
    "compact.in_txn": ("a SQLiteSession is never compacted here: the SDK compacts a session only when it is "
                       "wrapped in OpenAIResponsesCompactionSession, which asks the Responses API's compaction "
                       "endpoint (the scripted model speaks chat completions only); --compact-above has no SDK "
                       "counterpart, so multi-turn-compaction runs its turns uncompacted"),
}
MAX_TURNS = 30  # model calls per run, as upstream hermes-agent's max_iterations

# The documents its labels rest on (facts from them, in our words).
_SESSIONS = "https://openai.github.io/openai-agents-python/sessions/"
STORED_AFTER_RUN_DOC = (f"{_SESSIONS}#core-session-behavior: a run's new items (tool calls and outputs "
                        "included) are stored after the run, so they run and are streamed before they are stored")
HISTORY_DOC = f"{_SESSIONS}#core-session-behavior: the stored items are the history every later run starts from"
CLAIMS_DOC = (f"{_SESSIONS}: what a session stores and when; nothing records a tool call before it runs, "
              "resuming is for a run paused for approval (not one killed mid-way), streamed events are never "
              "retracted")

# The SDK records no dispatch intents and saves a tool call only together with its output, after
# the tool ran; it emits its stream events before the session write that holds them, and never
# retracts streamed text: findings on those promises are CONTRACT, not DAMAGE. What that costs on a
# kill (a tool run again) is DAMAGE under effect-semantics. Its template imports the SDK (with
# tracing off, as the adapter's wiring sets it) before its first fork.
TARGET = Target(
    NAME, "the OpenAI Agents SDK (the `openai-agents` extra)", adapter=__name__,
    schema="supervisor.chaos.schema.openai_agents",
    promises=Promises(dispatch_intents=False, durable_requests=False, stream_retraction=False,
                      durable_projections=False, promised={("no-lost-rows", ANY): HISTORY_DOC},
                      documented={("durable-before-effect", REQUEST_NOT_DURABLE): STORED_AFTER_RUN_DOC,
                                  ("durable-before-visible", ANY): STORED_AFTER_RUN_DOC},
                      claims=CLAIMS_DOC),
    unreachable=UNREACHABLE_POINTS, forkserver=True, preload=(__name__, "worker.targets.openai_agents_wiring"),
    unsupported={"compaction": "a SQLiteSession is never compacted here (the SDK's compaction session asks the "
                               "Responses API); --compact-above has no counterpart",
                 "compaction-mid-turn": "a SQLiteSession is never compacted here"},
    modules=("agents",), extra="openai-agents", package=DISTRIBUTION, app_tools=f"{__name__}:app_tools",
    # Your own agent instead of this target's (worker.targets.openai_agents_app).
    options={"agent": TargetOption.import_path("your agent: an agents.Agent (or a function returning one); its "
                                               "function tools are the campaign's"),
             "policies": TargetOption.tool_policies("with agent: each tool's effect policy "
                                                    "(undeclared: at_most_once)")},
    install_hint=(f"the {NAME} target needs the OpenAI Agents SDK ({DISTRIBUTION}, the `openai-agents` extra): "
                  f"{install_line('openai-agents')}"))


def app_tools(options: dict[str, str]) -> list[dict[str, Any]] | None:
    """With ``agent``: the function tools of the user's agent (worker.targets.openai_agents_app); else None."""
    return user_app_tools(options, "agent", "agent", "worker.targets.openai_agents_app:declared")


def content_parts_refusal(parts: list[dict[str, Any]]) -> str | None:
    """None: the SDK takes the list as a user message item's content (module docstring)."""
    del parts
    return None


def user_input(message: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """The run input of a new user message: text as the SDK's str input (stored as one user item),
    a list of content parts as one user message item holding them (a bare list would be read as a
    list of input items, not as one message's parts)."""
    return message if isinstance(message, str) else [{"role": "user", "content": message}]


# ------------------------------------------------------------------ the session's turns
def is_user_item(item: Any) -> bool:
    return isinstance(item, dict) and item.get("role") == "user" and item.get("type", "message") == "message"


def is_assistant_message(item: Any) -> bool:
    return isinstance(item, dict) and item.get("role") == "assistant" and item.get("type", "message") == "message"


def message_text(item: dict[str, Any]) -> str:
    """A stored message's text: a str content as it is, else its text parts joined (as the SDK's
    `ItemHelpers.text_message_output` joins an assistant message's `output_text` parts)."""
    content = item.get("content")
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    return "".join(str(p.get("text") or "") for p in parts
                   if isinstance(p, dict) and p.get("type") in ("output_text", "input_text", "text"))


def last_turn(items: list[Any]) -> tuple[int, bool, str | None]:
    """(index of the last user item's turn, whether it has a final answer, that answer's text).

    A final answer is an assistant message with text, not followed by a `function_call` (the SDK
    stores a reply's text and its calls as consecutive items).
    """
    index, answer = -1, None
    for i, item in enumerate(items):
        if is_user_item(item):
            index, answer = index + 1, None
        elif is_assistant_message(item):
            following = items[i + 1] if i + 1 < len(items) else None
            text = message_text(item)
            if not is_blank(text) and not (isinstance(following, dict) and following.get("type") == "function_call"):
                answer = text
    return index, answer is not None, answer


# ------------------------------------------------------------------ the target
class AgentsTarget:
    """One worker's run or resume of one turn with the SDK."""

    def __init__(self, args: Any, project: Callable[..., None]) -> None:
        os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # before the SDK is first imported
        from worker.targets import openai_agents_wiring as wiring

        self.args = args
        self.wiring = wiring
        self.turn_id: str | None = None
        self.project = project  # project(kind, turn=..., **fields)
        self.session = wiring.ProbedSession(args.session, str(args.db), self._context)
        self.tools = wiring.function_tools(toolsets_of(args), args.session, lambda: self.turn_id)
        self.model = wiring.ProbedModel(args.model, self._client(), self._context)

    def _context(self) -> dict[str, Any]:
        return {"session": self.args.session, "turn": self.turn_id}

    def _agent(self) -> Any:
        """The agent a run drives: this target's own (a user's agent: worker.targets.openai_agents_app)."""
        from agents import Agent

        return Agent(name="hermes-chaos", instructions=self.args.system_prompt, model=self.model, tools=self.tools)

    def _client(self) -> Any:
        from openai import AsyncOpenAI

        a = self.args
        return AsyncOpenAI(base_url=a.base_url, api_key=a.api_key or os.environ.get("OPENAI_API_KEY") or "scripted",
                           timeout=a.timeout, max_retries=a.max_retries)

    # -------------------------------------------------------------- running
    async def _drive(self, message: str | list[Any], turn_id: str) -> dict[str, Any]:
        """One `Runner.run_streamed` on the session, every stream event projected; its outcome."""
        from agents import RunConfig, Runner

        self.turn_id = turn_id
        agent = self._agent()
        projector = self.wiring.Projector(lambda kind, **fields: self.project(kind, turn=turn_id, **fields),
                                          self._context, stream=bool(self.args.stream))
        probes.fire("turn.start", session=self.args.session, turn=turn_id)
        try:
            result = Runner.run_streamed(agent, message, session=self.session, max_turns=MAX_TURNS,
                                         run_config=RunConfig(tracing_disabled=True))
            async for event in result.stream_events():
                projector.on_event(event)
        except Exception as exc:  # the run failed: the SDK raises it out of the event stream
            return self._failed(turn_id, exc)
        probes.fire("finalize.before", session=self.args.session, turn=turn_id)
        probes.fire("finalize.after", session=self.args.session, turn=turn_id)
        final = result.final_output
        text = final if isinstance(final, str) or final is None else json.dumps(final, default=str)
        out = {"outcome": "completed" if text else "failed", "session": self.args.session, "turn_id": turn_id,
               "final_response": text, "turn_exit_reason": "final_output" if text else "no_final_output",
               "api_calls": len(getattr(result, "raw_responses", []) or []), "target": NAME}
        if not text:
            out.update(failure_reason="no_final_output", error="the run ended without a final output")
        return out

    def _failed(self, turn_id: str | None, exc: BaseException) -> dict[str, Any]:
        if isinstance(exc, sqlite3.Error):
            cause = persistence_failure.classify(exc, self.args.db)
            reason = f"session_persistence_failed:{cause}"
            error = persistence_failure.describe(cause, None if cause == "locked" else str(exc), self.args.db)
        else:
            reason, error = f"sdk_error:{type(exc).__name__}", f"{type(exc).__name__}: {exc}"
        log.warning("the run failed: %s", reason)
        return {"outcome": "failed", "session": self.args.session, "turn_id": turn_id, "final_response": None,
                "turn_exit_reason": "error", "failure_reason": reason, "error": error, "target": NAME}

    async def run(self) -> dict[str, Any]:
        items = await self.session.get_items()
        index, answered, answer = last_turn(items)
        wanted = self.args.turn_id or f"turn-{index + 1}"
        if wanted == f"turn-{index}":
            if answered:  # this turn already finished: a no-op, not a duplicate
                return {"outcome": "completed", "session": self.args.session, "turn_id": wanted,
                        "final_response": answer, "turn_exit_reason": "already_finished", "api_calls": 0,
                        "target": NAME}
            return await self._drive([], wanted)  # its question is durable: never stored twice (module docstring)
        return await self._drive(user_input(self.args.message), wanted)

    async def resume(self) -> dict[str, Any]:
        """What a restarted application does (module docstring): continue the session's unanswered
        last input, without sending it again."""
        session = self.args.session
        probes.fire("resume.begin", session=session)
        items = await self.session.get_items()
        index, answered, _answer = last_turn(items)
        if index < 0 or answered:
            return {"outcome": "nothing to resume", "target": NAME}
        turn_id = f"turn-{index}"
        self.turn_id = turn_id
        probes.fire("resume.reconciled", session=session, turn=turn_id, action="continue", resend=False,
                    stored_items=len(items))
        return await self._drive([], turn_id)

    def close(self) -> None:
        try:
            self.session.close()
        except Exception:
            pass


def _open(args: Any, link: Any) -> AgentsTarget:
    return AgentsTarget(args, lambda kind, turn=None, **fields: show(link, args.session, turn, kind, **fields))


def execute(args: Any, link: Any, report: Report) -> int:
    """Run or resume one turn with the OpenAI Agents SDK (this target's agent, or the user's: option
    ``agent``), then report its outcome."""
    if (getattr(args, "target_options", None) or {}).get("agent"):
        return _execute_app(args, link, report)
    ledger = open_ledger(args, link)
    try:
        try:
            target = _open(args, link)
        except sqlite3.Error as exc:  # the session store cannot even be opened
            return report(target_failure(args, exc))
        return report(_turn(args, target))
    finally:
        ledger.close()


def _turn(args: Any, target: AgentsTarget) -> dict[str, Any]:
    """Run or resume the turn on `target` (closed after); its outcome."""
    try:
        return asyncio.run(target.resume() if args.command == "resume" else target.run())
    except sqlite3.Error as exc:  # reading the session's items failed
        return target._failed(getattr(args, "turn_id", None), exc)
    finally:
        target.close()


def _execute_app(args: Any, link: Any, report: Report) -> int:
    """`execute` on the user's agent (worker.targets.openai_agents_app)."""
    from worker.targets import UsageError
    from worker.targets.openai_agents_app import open_app

    try:
        target, ledger = open_app(args, link, lambda kind, turn=None, **fields: show(link, args.session, turn, kind,
                                                                                     **fields))
    except sqlite3.Error as exc:
        return report(target_failure(args, exc))
    except ValueError as exc:  # the agent cannot be used (worker.targets.langgraph_app.AppUnusable, a policy)
        raise UsageError(str(exc)) from None
    try:
        return report(_turn(args, target))
    finally:
        ledger.close()


def target_failure(args: Any, exc: sqlite3.Error) -> dict[str, Any]:
    """The outcome of a session store that cannot even be opened."""
    cause = persistence_failure.classify(exc, args.db)
    return {"outcome": "failed", "session": args.session, "turn_id": getattr(args, "turn_id", None),
            "final_response": None, "turn_exit_reason": "error",
            "failure_reason": f"session_persistence_failed:{cause}",
            "error": persistence_failure.describe(cause, str(exc), Path(args.db)), "target": NAME}
