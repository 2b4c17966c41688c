"""Writing a target's adapter as a plain function: `run_turn(turn)` (and `resume_turn(turn)`).

A target whose adapter module defines

    def run_turn(turn: TurnContext) -> dict: ...      # a new turn: `turn.message` is the user's message
    def resume_turn(turn: TurnContext) -> dict: ...   # after a kill: finish what the store says is unfinished

is run by the worker with a `TurnContext`: the turn's session, ids and message, the model endpoint
and the tools to offer it, and the named kill points to fire around what the loop does. The
supervisor kills the worker at those points, restarts it with `resume_turn`, and judges the store
through the target's schema reader. A function returns the turn's outcome (`turn.completed`,
`turn.failed`, `turn.nothing_to_resume`).

The kill points (hermes.probes.POINTS) a loop fires through its TurnContext:

- `turn.start` (`turn.start()`), `finalize.before` / `finalize.after` (`with turn.finalizing():`);
- `model.request` / `model.response` (`with turn.model_call():`);
- `flush.begin` / `flush.in_txn` / `flush.committed` (`with turn.commit(conn):`, a write
  transaction on a sqlite3 connection; or `turn.probe(...)` around any other store's write);
- `tool.dispatch.before` / `.after` (`turn.run_tool(...)`, which also runs the tool: its effect
  goes to the supervisor's ledger);
- `callback.interim.*` / `callback.tool_complete.*` (`turn.show_interim`, `turn.show_tool_result`:
  what a user is shown, which the supervisor checks against the store at that instant);
- `resume.begin` / `resume.reconciled` (`turn.resume_begin()`, `turn.resume_reconciled()`).
"""
from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hermes import probes
from hermes.outcomes import UNKNOWN_OUTCOME
from hermes.tools import AT_MOST_ONCE, IDEMPOTENT, get_tool_definitions, handle_function_call, registry

__all__ = ["AT_MOST_ONCE", "IDEMPOTENT", "UNKNOWN_OUTCOME", "TurnContext"]

# show(turn_id, kind, **fields): hand a projection to the supervisor (kind: "interim", "tool_complete")
Show = Callable[..., None]


@dataclass
class TurnContext:
    """One command (`run` or `resume`) of one session's turn, in a worker."""

    command: str                     # "run" or "resume"
    session: str
    turn_id: str | None              # run: the id the campaign gives the new turn; resume: set by the loop
    # run: the user's message; resume: None. A list of content parts (hermes.content) only reaches an
    # adapter that defines content_parts_refusal (worker.targets.check_message); any other gets text.
    message: str | list[dict[str, Any]] | None
    db: Path                         # where the target keeps its store (`--db`)
    base_url: str                    # the model endpoint (OpenAI-compatible)
    model: str
    api_key: str = field(repr=False)  # never in a repr, a log line or an artefact
    timeout: float
    system_prompt: str | None
    toolsets: list[str]              # what `--tools` chose; `tools` are their definitions
    options: dict[str, str] = field(default_factory=dict)  # the target's options, checked
    show: Show = field(default=lambda turn, kind, **fields: None, repr=False)
    model_calls: int = 0

    # ------------------------------------------------------------ what to offer the model
    @property
    def tools(self) -> list[dict[str, Any]]:
        """The tools in the OpenAI `tools=` format."""
        return get_tool_definitions(self.toolsets)

    @staticmethod
    def policy(tool: str) -> str:
        """IDEMPOTENT (may run again after a kill) or AT_MOST_ONCE (must never run twice)."""
        return registry.policy(tool)

    # ------------------------------------------------------------ kill points
    def probe(self, point: str, **fields: Any) -> None:
        """Fire the named kill point (one of hermes.probes.POINTS) with this turn's ids."""
        probes.fire(point, session=self.session, turn=self.turn_id, **fields)

    def start(self) -> None:
        self.probe("turn.start")

    def resume_begin(self) -> None:
        probes.fire("resume.begin", session=self.session)

    def resume_reconciled(self, **fields: Any) -> None:
        self.probe("resume.reconciled", **fields)

    @contextlib.contextmanager
    def model_call(self) -> Iterator[None]:
        self.probe("model.request")
        yield
        self.model_calls += 1
        self.probe("model.response")

    @contextlib.contextmanager
    def commit(self, conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
        """A write transaction on `conn` (BEGIN IMMEDIATE ... COMMIT), its kill points around and inside
        it; rolled back if the block raises. `conn` must be in autocommit mode (isolation_level=None)."""
        self.probe("flush.begin")
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            self.probe("flush.in_txn")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        self.probe("flush.committed")

    @contextlib.contextmanager
    def finalizing(self) -> Iterator[None]:
        self.probe("finalize.before")
        yield
        self.probe("finalize.after")

    # ------------------------------------------------------------ tools and what is shown
    def run_tool(self, call_id: str, name: str, arguments: str | dict[str, Any]) -> str:
        """Run one tool call (its `tool.dispatch.*` kill points around it); its result text. Arguments
        that are not a JSON object give an error result, and the tool does not run."""
        where = {"tool_call_id": call_id, "tool": name}
        self.probe("tool.dispatch.before", **where)
        decoded, problem = _decode_arguments(arguments)
        if problem is not None:
            result = json.dumps({"error": f"tool {name!r}: {problem}"}, ensure_ascii=False)
        else:
            result = handle_function_call(name, decoded, self.session, tool_call_id=call_id, idempotency_key=None,
                                          session_id=self.session, turn_id=self.turn_id)
        self.probe("tool.dispatch.after", **where)
        return result

    def show_tool_result(self, call_id: str, name: str, content: str) -> None:
        """Show the user a tool's result (checked: it must be durable by now)."""
        self.probe("callback.tool_complete.before", tool_call_id=call_id)
        self.show(self.turn_id, "tool_complete", tool_call_id=call_id, tool=name, content=content)
        self.probe("callback.tool_complete.after", tool_call_id=call_id)

    def show_interim(self, text: str) -> None:
        """Show the user an assistant message (checked: it must be durable by now)."""
        self.probe("callback.interim.before")
        self.show(self.turn_id, "interim", text=text)
        self.probe("callback.interim.after")

    # ------------------------------------------------------------ outcomes
    def completed(self, final_response: str, **extra: Any) -> dict[str, Any]:
        return {"outcome": "completed", "session": self.session, "turn_id": self.turn_id,
                "final_response": final_response, "turn_exit_reason": "final_answer", "api_calls": self.model_calls,
                **extra}

    def failed(self, reason: str, error: str, **extra: Any) -> dict[str, Any]:
        return {"outcome": "failed", "session": self.session, "turn_id": self.turn_id, "final_response": None,
                "turn_exit_reason": "error", "failure_reason": reason, "error": error,
                "api_calls": self.model_calls, **extra}

    def nothing_to_resume(self) -> dict[str, Any]:
        return {"outcome": "nothing to resume", "session": self.session}


def _decode_arguments(arguments: str | dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    if isinstance(arguments, dict):
        return arguments, None
    try:
        decoded = json.loads(arguments) if arguments and arguments.strip() else {}
    except ValueError as exc:
        return {}, f"the arguments are not JSON ({exc})"
    return (decoded, None) if isinstance(decoded, dict) else ({}, "the arguments are not a JSON object")
