"""The systems a worker can run a turn of, chosen with ``--target NAME``: each target's record
(`targetkit.Target`, found through `targetkit.registry`) names its adapter, a module with

- ``execute(args, link, report) -> int``: run or resume one turn as ``python -m worker`` was
  asked (``args``; the target's options checked, in ``args.target_options``), talking to the
  supervisor through ``link`` (None when run by hand), and hand the outcome to ``report``
  (which prints it, sends it, and gives the exit status); or
- ``run_turn(turn)`` and ``resume_turn(turn)``, a plain loop written with targetkit.loop: the
  worker gives it a ``TurnContext`` and reports what it returns.

An adapter is imported only when its target is chosen and installed (`Target.missing`), so
running one target never imports another's packages. What every adapter does the same way
(the toolsets of ``--tools``, the effects ledger and the chaos tools, a UI event) lives here too.

A user message is text, or (``--message-format json``) a list of OpenAI content parts
(``hermes.content``). An adapter that can hand such a list to its library's user message as it
is says so with ``content_parts_refusal(parts) -> str | None`` (None: it takes them; else why
not); one without it takes text only. `check_message` refuses what the adapter cannot take,
before anything is written.
"""
from __future__ import annotations

import importlib
import json
import logging
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Mapping

from targetkit import Target, registry

if TYPE_CHECKING:
    from worker.ledger import Ledger
    from worker.link import SupervisorLink

log = logging.getLogger("worker")

# report(outcome) -> the worker's exit status, once the outcome is printed and sent.
Report = Callable[[dict[str, Any]], int]


class UsageError(Exception):
    """Bad arguments, database, session or target: the worker prints one line and exits 2."""


def target(name: str) -> Target:
    """The target called `name` (targetkit.registry); UsageError when there is none."""
    try:
        return registry.get(name)
    except registry.UnknownTarget as exc:
        raise UsageError(str(exc)) from None


def execute(module: ModuleType, args: Any, link: "SupervisorLink | None", report: Report) -> int:
    """Run the command `args` asks for with a target's adapter module: its own `execute(args, link,
    report)`, or, for an adapter written with targetkit.loop, its `run_turn(turn)` / `resume_turn(turn)`."""
    if hasattr(module, "execute"):
        return module.execute(args, link, report)
    return _execute_loop(module, args, link, report)


def _execute_loop(module: ModuleType, args: Any, link: "SupervisorLink | None", report: Report) -> int:
    import os
    import sqlite3

    from hermes import persistence_failure
    from targetkit.loop import TurnContext

    ledger = open_ledger(args, link)
    turn = TurnContext(
        command=args.command, session=args.session, turn_id=getattr(args, "turn_id", None),
        message=getattr(args, "message", None), db=Path(args.db), base_url=args.base_url, model=args.model,
        api_key=args.api_key or os.environ.get("OPENAI_API_KEY") or "no-key-configured", timeout=args.timeout,
        system_prompt=args.system_prompt, toolsets=toolsets_of(args), options=dict(args.target_options),
        show=lambda turn_id, kind, **fields: show(link, args.session, turn_id, kind, **fields))
    step = module.run_turn if args.command == "run" else getattr(module, "resume_turn", None)
    try:
        out = turn.nothing_to_resume() if step is None else step(turn)
    except sqlite3.Error as exc:  # its store failed: the named persistence failure, as for our runtime
        cause = persistence_failure.classify(exc, Path(args.db))
        out = turn.failed(f"session_persistence_failed:{cause}", persistence_failure.describe(cause, str(exc),
                                                                                              Path(args.db)))
    except Exception as exc:  # the loop's own failure ends the turn failed, saying what it was
        log.warning("the turn's loop failed: %s: %s", type(exc).__name__, exc)
        out = turn.failed(f"loop_error:{type(exc).__name__}", f"{type(exc).__name__}: {exc}")
    code = report(out)
    ledger.close()
    return code


def check_message(name: str, module: ModuleType, message: Any) -> None:
    """UsageError (one line) when target `name`'s adapter `module` cannot take `message`: a list of
    content parts, unless its ``content_parts_refusal(parts)`` returns None. Called before the
    adapter runs, so a refused message leaves no row, ledger or file behind."""
    if not isinstance(message, list):
        return
    judge = getattr(module, "content_parts_refusal", None)
    why = ("its adapter passes text messages only (it defines no content_parts_refusal)" if judge is None
           else judge(message))
    if why is not None:
        raise UsageError(f"--target {name} cannot take this message as a list of content parts: {why}; "
                         "send text (--message-format text)")


def adapter(name: str) -> ModuleType:
    """The adapter module of target `name`; UsageError when it is unknown or cannot run here."""
    chosen = target(name)
    problem = chosen.missing()
    if problem is not None:
        raise UsageError(problem)
    return importlib.import_module(chosen.adapter)


def load_tools(value: str) -> list[str]:
    """The toolsets a worker's ``--tools`` value names (ValueError, one line, if any cannot be offered).

    Each comma-separated name is ``chaos`` (the chaos harness's tools, installed by
    `open_ledger`), a toolset of ``hermes.tools`` (``files``), or an importable module whose
    ``@tool`` functions form a toolset (``examples.notes_tools``): see
    ``hermes.tools.load_toolsets``. A daemon calls this up front to refuse a bad value at start.
    """
    from hermes.tools import load_toolsets
    from worker import chaos_tools

    return load_toolsets(value, provided={chaos_tools.TOOLSET: chaos_tools.TOOL_NAMES})


def user_app_tools(options: Mapping[str, str], option: str, what: str,
                   declared: str) -> list[dict[str, Any]] | None:
    """The tools of the user's own app named by `option` (a target's `app_tools`), read by the
    function `declared` ("module:function", imported only when the option is given); None without
    it. `policies` declares that app's tools, so it is refused without one."""
    if not options.get(option):
        if options.get("policies"):
            raise ValueError(f"policies declares the tools of your own {what}: "
                             f"give it with {option}=package.module:NAME")
        return None
    module, _, function = declared.partition(":")
    return getattr(importlib.import_module(module), function)(options[option], dict(options))


def toolsets_of(args: Any) -> list[str]:
    """The toolsets `args` chose: what the CLI resolved, or else its ``--tools`` loaded now."""
    chosen = getattr(args, "toolsets", None)
    return list(chosen) if chosen is not None else load_tools(args.tools)


def open_ledger(args: Any, link: "SupervisorLink | None") -> "Ledger":
    """The worker's effects ledger (``--ledger``, default the database path + ``.effects``), with the
    chaos tools (when ``--tools`` chose them) installed to record into it and to report each effect
    to the supervisor first; with ``--ledger-tools``, every other tool of ``--tools`` too."""
    from worker import chaos_tools
    from worker.ledger import Ledger

    ledger_tools = bool(getattr(args, "ledger_tools", False))
    if ledger_tools:  # a user's own tools, counted as the chaos tools count themselves (worker.ledgered_tools)
        from worker.ledgered_tools import ToolLedger

        ledger = ToolLedger(args.ledger or Path(f"{args.db}.effects"), incarnation=args.incarnation)
    else:
        ledger = Ledger(args.ledger or Path(f"{args.db}.effects"), incarnation=args.incarnation)
    report = (lambda effect: link.request(dict(effect, type="effect"))) if link else None
    if chaos_tools.TOOLSET in toolsets_of(args):
        chaos_tools.install(ledger, report)
    if ledger_tools:
        from worker import ledgered_tools

        ledgered_tools.install(toolsets_of(args), (chaos_tools.TOOLSET,), ledger, report)
    return ledger


def show(link: "SupervisorLink | None", session: str, turn: str | None, kind: str, **fields: Any) -> None:
    """A UI projection of `turn`: to the supervisor, which acknowledges once it has checked it
    against the database; without one, to the log, where message and tool text never go (only
    what was shown, for which turn, and how long it was)."""
    event = {"type": "ui", "kind": kind, "session": session, "turn": turn, **fields}
    if link is not None:
        link.request(event)
        return
    shown = fields.get("text") if kind != "tool_complete" else fields.get("content")
    ids = {k: fields[k] for k in ("tool_call_id", "outcome") if k in fields}
    log.info("ui %s", json.dumps({"kind": kind, "turn": turn, **ids,
                                  "chars": len(shown) if isinstance(shown, str) else 0}))
