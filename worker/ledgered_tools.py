"""A user's own tools, run through the effects ledger without knowing it (``--ledger-tools``).

A chaos campaign over someone's ``@tool`` module (``hermes-supervisor chaos --tools MODULE``)
must count every real run of their tools the way the chaos tools count themselves: each call
reports its effect to the supervisor first (which checks, while the worker waits, that the
request and its dispatch intent are durable), then is written to the ledger as an execution
under the policy the tool declares, runs, and what it returned is written to the ledger too.
The tool itself is untouched: its `Tool` in the registry is swapped for one whose handler
wraps the original.

The ledger's own tables stay as they are; two more, made when the tools are installed (and
again on first use, should that write have failed), hold what only wrapped tools have:

    tool_returns       execution id -> the result text that run returned (a tool's exception
                       as the error text the dispatcher makes of it)
    tool_declarations  tool -> the policy it declares and whether it is read-only (parallel-safe)

A run killed before it returned has an execution and no return. The checker reads both tables
(supervisor.chaos.checker.own_results): a durable result of a wrapped tool must be what one of
that call's runs returned, and a read-only tool may rerun freely.

With ``--ledger-tools`` the tools also run at home in their case (`enter_home`): ``HOME`` is the
worker's working directory and ``HERMES_HOME`` its ``--home``, set before the module is imported.
"""
from __future__ import annotations

import json
import logging
import os
import sqlite3
from pathlib import Path
from typing import Any, Callable, Iterable

from hermes.tools import IDEMPOTENT, Tool, ToolContext, registry, tool_error, tool_failure_message
from worker.ledger import Ledger

RETURNS_TABLE = "tool_returns"
DECLARATIONS_TABLE = "tool_declarations"
_TABLES = (
    f"CREATE TABLE IF NOT EXISTS {RETURNS_TABLE} (execution_id INTEGER PRIMARY KEY, result TEXT NOT NULL)",
    f"CREATE TABLE IF NOT EXISTS {DECLARATIONS_TABLE} (tool TEXT PRIMARY KEY, policy TEXT NOT NULL, "
    "read_only INTEGER NOT NULL)",
)

EffectReporter = Callable[[dict[str, Any]], None]
log = logging.getLogger("worker")


def is_read_only(tool: Tool) -> bool:
    """Read-only, as this runtime spells it: idempotent and safe to run beside others of a batch."""
    return tool.policy == IDEMPOTENT and tool.parallel_safe


class ToolLedger(Ledger):
    """The effects ledger, with what a wrapped tool's runs need recorded besides their executions."""

    def record_call(self, *, session_id: str | None, turn_id: str | None, tool_call_id: str | None,
                    tool: str, policy: str, idempotency_key: str | None, read_only: bool) -> int:
        """Record one execution (and the tool's declaration) in one transaction; the execution's id."""
        import time

        def write(c: Any) -> int:
            for statement in _TABLES:
                c.execute(statement)
            c.execute(f"INSERT OR IGNORE INTO {DECLARATIONS_TABLE} (tool, policy, read_only) VALUES (?, ?, ?)",
                      (tool, policy, int(read_only)))
            return int(c.execute(
                "INSERT INTO executions (session_id, turn_id, tool_call_id, tool, policy, idempotency_key, pid, "
                "incarnation, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (session_id, turn_id, tool_call_id, tool, policy, idempotency_key, os.getpid(), self.incarnation,
                 time.time())).lastrowid)

        return self._write(write)

    def declare(self, tools: Iterable[Tool]) -> None:
        """Record how each of `tools` is declared, before any runs: the checker then knows them
        for wrapped tools even in a case where one never ran (a result of it is then made up)."""
        rows = [(t.name, t.policy, int(is_read_only(t))) for t in tools]

        def write(c: Any) -> None:
            for statement in _TABLES:
                c.execute(statement)
            c.executemany(f"INSERT OR IGNORE INTO {DECLARATIONS_TABLE} (tool, policy, read_only) VALUES (?, ?, ?)",
                          rows)

        self._write(write)

    def record_return(self, execution_id: int, result: str) -> None:
        self._write(lambda c: c.execute(f"INSERT INTO {RETURNS_TABLE} (execution_id, result) VALUES (?, ?)",
                                        (execution_id, result)))


def _as_text(value: Any) -> str:
    # What hermes.tools.handle_function_call makes of a handler's value: the text the transcript gets.
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def ledgered(tool: Tool, ledger: ToolLedger, report_effect: EffectReporter | None) -> Tool:
    """`tool` with every call reported, recorded in `ledger` with its return, then run as before."""
    original = tool.handler
    read_only = is_read_only(tool)

    def handler(arguments: dict[str, Any], ctx: ToolContext) -> str:
        if report_effect is not None:
            report_effect({"tool": tool.name, "policy": tool.policy, "tool_call_id": ctx.tool_call_id,
                           "session": ctx.session_id, "turn": ctx.turn_id, "idempotency_key": ctx.idempotency_key})
        execution = ledger.record_call(session_id=ctx.session_id, turn_id=ctx.turn_id, tool_call_id=ctx.tool_call_id,
                                       tool=tool.name, policy=tool.policy, idempotency_key=ctx.idempotency_key,
                                       read_only=read_only)
        try:
            text = _as_text(original(arguments, ctx))
        except Exception as exc:  # reported to the model as the dispatcher would: the same text, recorded
            text = tool_error(tool_failure_message(tool.name, exc))
        ledger.record_return(execution, text)
        return text

    handler.ledgered = True  # type: ignore[attr-defined]
    return Tool(tool.name, tool.description, handler, tool.parameters, policy=tool.policy,
                parallel_safe=tool.parallel_safe, cleanup=tool.cleanup)


def install(toolsets: Iterable[str], skip: Iterable[str], ledger: ToolLedger,
            report_effect: EffectReporter | None) -> list[str]:
    """Swap every tool of `toolsets` (but those of `skip`, which record themselves) for its ledgered
    form; the names of the tools swapped."""
    swapped = []
    passed = set(skip)
    for toolset in toolsets:
        if toolset in passed:
            continue
        for tool in registry.tools_in([toolset]):
            if getattr(tool.handler, "ledgered", False):
                continue
            registry.register(ledgered(tool, ledger, report_effect), toolset)
            swapped.append(tool)
    try:
        if swapped:
            ledger.declare(swapped)
    except sqlite3.Error as exc:  # best effort: each tool's first run records its declaration again
        log.warning("could not record the tools' declarations in the effects ledger: %s", exc)
    return [t.name for t in swapped]


def enter_home(home: Path | None) -> None:
    """Run the tools at home in the case: ``HOME`` the working directory, ``HERMES_HOME`` `home`
    (when given). Called before the tools' module is imported, so what it reads at import counts."""
    os.environ["HOME"] = os.getcwd()
    if home is not None:
        os.environ["HERMES_HOME"] = str(Path(home).resolve())
