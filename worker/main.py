"""`python -m worker`: run one turn of a session, or finish its interrupted turn.

    run    --db PATH --session ID --base-url URL --model NAME --message TEXT [--tools SET]
    resume --db PATH --session ID --base-url URL --model NAME [--tools SET]

Prints one JSON line with the outcome on stdout; logs JSON lines on stderr.
Exit status: 0 the turn completed (or there was nothing to resume), 1 the turn
failed (its failure fields say why), 2 bad arguments, database or session.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import signal
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any, NoReturn, Sequence

from hermes import persistence_failure, probes
from hermes.compaction import compact_if_needed
from hermes.resume import resume_interrupted_turn
from hermes.runner import PERSISTENCE_FAILED, AIAgent
from hermes.state import SessionDB, StorageError
from worker import chaos_tools
from worker.ledger import Ledger
from worker.link import ProbeWiring, SupervisorLink
from worker.protocol import EXIT_OK, EXIT_TURN_FAILED, EXIT_USAGE, KILL_MODES, Channel, ChannelClosed, KillPlan

log = logging.getLogger("worker")


class UsageError(Exception):
    """Bad arguments, database or session: one line on stderr, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one clear line, not a usage dump
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m worker", description="Run or resume a turn of an agent session.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in ("run", "resume"):
        sub = commands.add_parser(name)
        sub.add_argument("--db", required=True, type=Path, help="the session database (SQLite)")
        sub.add_argument("--session", required=True)
        sub.add_argument("--base-url", required=True, help="an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
        sub.add_argument("--model", required=True)
        sub.add_argument("--tools", default="chaos", help="comma-separated toolsets (default: chaos)")
        sub.add_argument("--api-key", default=None, help="default: $OPENAI_API_KEY")
        sub.add_argument("--control", type=int, default=None, metavar="FD", help="inherited control socket")
        sub.add_argument("--kill-at", default=None, metavar="PROBE[:N]")
        sub.add_argument("--kill-mode", default="self", choices=KILL_MODES)
        sub.add_argument("--incarnation", type=int, default=0)
        sub.add_argument("--ledger", type=Path, default=None, help="effects ledger (default: DB path + .effects)")
        sub.add_argument("--stream", action="store_true", help="stream model replies")
        sub.add_argument("--synchronous", default="FULL", choices=("FULL", "NORMAL"))
        sub.add_argument("--busy-budget", type=float, default=10.0, metavar="SECONDS")
        sub.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS", help="model request timeout")
        sub.add_argument("--max-retries", type=int, default=2)
        sub.add_argument("--system-prompt", default=None)
        sub.add_argument("--target", default="hermes", choices=("hermes", "hermes-agent"),
                         help="the agent under test: ours (default) or upstream's hermes-agent (worker.upstream)")
        if name == "run":
            sub.add_argument("--message", required=True)
            sub.add_argument("--turn-id", default=None, help="run this queued turn (default: a new turn)")
            sub.add_argument("--compact-above", type=int, default=0, metavar="ROWS",
                             help="before the turn, summarize older turns when the session has more rows")
    return parser


_PARSER: argparse.ArgumentParser | None = None


def _parser() -> argparse.ArgumentParser:
    """`build_parser()`, built once per process (argparse's message lookups touch the file
    system; a fork-server template builds it before forking, see worker.forkserver)."""
    global _PARSER
    if _PARSER is None:
        _PARSER = build_parser()
    return _PARSER


def _validate(args: argparse.Namespace) -> KillPlan | None:
    if not args.base_url.startswith(("http://", "https://")):
        raise UsageError(f"--base-url {args.base_url!r} is not an http(s) URL")
    if args.busy_budget < 0 or args.timeout <= 0 or args.max_retries < 0:
        raise UsageError("--busy-budget, --timeout and --max-retries must not be negative")
    if args.db.is_dir():
        raise UsageError(f"--db {args.db} is a directory, not a database file")
    if args.command == "resume" and not args.db.exists():
        raise UsageError(f"--db {args.db} does not exist; there is nothing to resume")
    if args.command == "run" and not args.db.parent.is_dir():
        raise UsageError(f"--db {args.db}: directory {args.db.parent} does not exist")
    if args.kill_mode != "self" and args.control is None:
        raise UsageError(f"--kill-mode {args.kill_mode} needs --control: the supervisor does the killing")
    if args.kill_at is None:
        return None
    try:
        plan = KillPlan.parse(args.kill_at, args.kill_mode)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not probes.is_known(plan.probe):
        raise UsageError(f"--kill-at {args.kill_at!r}: unknown probe; known: {', '.join(probes.POINTS)}")
    return plan


class _JsonLines(logging.Formatter):
    def __init__(self, fields: dict[str, Any]) -> None:
        super().__init__()
        self.fields = fields

    def format(self, record: logging.LogRecord) -> str:
        line = {"ts": round(record.created, 6), "level": record.levelname.lower(), "logger": record.name,
                "msg": record.getMessage(), **self.fields}
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def _setup_logging(args: argparse.Namespace) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonLines({"worker": args.session, "pid": os.getpid(),
                                     "incarnation": args.incarnation}))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    for noisy in ("httpx", "httpx2", "openai", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent (the supervisor) dies."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)


def _outcome(result: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
    if result is None:
        return {"outcome": "nothing to resume", **extra}
    out = {"outcome": "completed" if result.get("completed") else "failed",
           "session": result.get("session_id"), "turn_id": result.get("turn_id"),
           "final_response": result.get("final_response"), "turn_exit_reason": result.get("turn_exit_reason"),
           "api_calls": result.get("api_calls")}
    if result.get("failed"):
        out["failure_reason"] = result.get("failure_reason")
        out["error"] = result.get("error")
    out.update(extra)
    return out


def _open_db(args: argparse.Namespace) -> SessionDB:
    try:
        db = SessionDB(args.db, synchronous=args.synchronous, busy_budget_s=args.busy_budget)
    except StorageError as exc:  # not a usable database path at all (a directory, not SQLite, newer schema)
        raise UsageError(str(exc)) from None
    try:
        known = args.command != "resume" or db.get_session(args.session) is not None
    except sqlite3.Error:
        # The file opened but cannot be read (e.g. corrupt pages): claiming the session next
        # fails with the same error, and that becomes the turn's named storage failure.
        return db
    if not known:
        db.close()
        raise UsageError(f"session {args.session!r} is not in {args.db}")
    return db


def _compact(agent: AIAgent, max_rows: int) -> None:
    try:
        if compact_if_needed(agent, max_rows):
            log.info("compacted session %s", agent.session_id)
    except Exception as exc:  # an unavailable summarizer must not cost the user their turn
        log.warning("compaction skipped: %s", exc)


def _storage_failure(args: argparse.Namespace, exc: Exception) -> dict[str, Any]:
    """The outcome of a worker that could not even claim its session (e.g. the database is locked)."""
    cause = persistence_failure.classify(exc, args.db)
    detail = None if cause == "locked" else str(exc)
    return {"outcome": "failed", "session": args.session, "turn_id": getattr(args, "turn_id", None),
            "final_response": None, "turn_exit_reason": PERSISTENCE_FAILED,
            "failure_reason": f"{PERSISTENCE_FAILED}:{cause}",
            "error": persistence_failure.describe(cause, detail, args.db)}


def _finished_turn(db: SessionDB, turn_id: str | None) -> dict[str, Any] | None:
    """The outcome of a turn that already ended, so running it again is a no-op, not a duplicate."""
    turn = db.get_turn(turn_id) if turn_id else None
    if turn is None or turn["state"] not in ("done", "failed"):
        return None
    answers = [r["content"] for r in db.get_messages(turn["session_id"])
               if r["turn_id"] == turn_id and r["role"] == "assistant" and not r["tool_calls"]]
    out = {"outcome": "completed" if turn["state"] == "done" else "failed", "session": turn["session_id"],
           "turn_id": turn_id, "final_response": answers[-1] if answers else None,
           "turn_exit_reason": "already_finished", "api_calls": 0}
    if turn["state"] == "failed":
        out.update(failure_reason="already_failed", error=turn["error"])
    return out


_TLS_CONTEXT: Any = None


def sdk_http_module() -> Any:
    """The HTTP library the OpenAI SDK is built on (httpx, or httpx2 in newer SDKs)."""
    import openai

    client = next(c for c in openai.DefaultHttpxClient.__mro__ if c.__name__ == "Client")
    return sys.modules[client.__module__.partition(".")[0]]


def http_client(base_url: str, timeout: float) -> Any:
    """An HTTP client for the SDK with the SDK's own defaults, on this process's one TLS context.

    The SDK would build a client per agent, loading the CA store each time (~30 ms). Here the
    context is built once per process with the same defaults; a fork-server template builds it
    before forking, so its workers share it. None if the SDK has no such hook (it then builds
    its own client, as before).
    """
    global _TLS_CONTEXT
    try:
        import openai

        if _TLS_CONTEXT is None:
            _TLS_CONTEXT = sdk_http_module().create_ssl_context()
        return openai.DefaultHttpxClient(base_url=base_url, timeout=timeout, verify=_TLS_CONTEXT)
    except Exception as exc:  # an SDK without DefaultHttpxClient/create_ssl_context
        log.debug("no shared HTTP client (%s); the SDK builds its own", exc)
        return None


def _build_agent(args: argparse.Namespace, db: SessionDB, link: SupervisorLink | None) -> AIAgent:
    toolsets = [t.strip() for t in args.tools.split(",") if t.strip()]
    agent_ref: list[AIAgent] = []

    def project(kind: str, **fields: Any) -> None:
        event = {"type": "ui", "kind": kind, "session": args.session, "turn": agent_ref[0]._current_turn_id,
                 **fields}
        if link is not None:
            link.request(event)  # returns once the supervisor has checked it against the database
        else:
            # Message and tool text never reach a log: only what was shown, for which turn, how long.
            shown = fields.get("text") if kind != "tool_complete" else fields.get("content")
            ids = {k: fields[k] for k in ("tool_call_id", "outcome") if k in fields}
            log.info("ui %s", json.dumps({"kind": kind, "turn": event["turn"], **ids,
                                          "chars": len(shown) if isinstance(shown, str) else 0}))

    try:
        agent = AIAgent(api_key=args.api_key, base_url=args.base_url, model=args.model, session_db=db,
                        session_id=args.session, enabled_toolsets=toolsets, system_prompt=args.system_prompt,
                        stream=args.stream, request_timeout=args.timeout, max_retries=args.max_retries,
                        interim_assistant_callback=lambda text, already_streamed=False: project(
                            "interim", text=text),
                        tool_complete_callback=lambda call_id, name, _args, content: project(
                            "tool_complete", tool_call_id=call_id, tool=name, content=content),
                        stream_delta_callback=(lambda delta: project("stream", text=delta)) if args.stream else None,
                        # Always wired, streaming or not: resuming a turn retracts what a killed
                        # predecessor may have streamed, and the supervisor must hear it.
                        stream_end_callback=lambda outcome, text: project("stream_end", outcome=outcome, text=text),
                        http_client=http_client(args.base_url, args.timeout))
    except ValueError as exc:  # e.g. an unknown toolset
        raise UsageError(str(exc)) from None
    agent.session_source = "worker"
    agent._session_db_created = True
    agent_ref.append(agent)
    return agent


def _run_command(args: argparse.Namespace, db: SessionDB, agent: AIAgent) -> dict[str, Any]:
    resumed = resume_interrupted_turn(agent, system_message=args.system_prompt)
    if args.command == "resume":
        return _outcome(resumed)
    if resumed is not None and not resumed.get("completed"):
        # The older turn could not finish; a new one must not overtake it.
        return _outcome(resumed, note="the interrupted turn could not be finished; the new message was not run")
    finished = _finished_turn(db, args.turn_id)
    if finished is not None:
        return finished
    _compact(agent, args.compact_above)
    result = agent.run_conversation(args.message, system_message=args.system_prompt,
                                    conversation_history=db.load_live_messages(args.session),
                                    turn_id=args.turn_id)
    return _outcome(result, **({"resumed_turn": resumed.get("turn_id")} if resumed else {}))


def execute(args: argparse.Namespace, plan: KillPlan | None, die_with_parent: bool = True) -> int:
    link = None
    if args.control is not None:
        if die_with_parent:
            _die_with_parent()
        link = SupervisorLink(Channel.from_fd(args.control))
        link.report({"type": "hello", "pid": os.getpid(), "incarnation": args.incarnation,
                     "session": args.session, "command": args.command, "started": time.time()})
    probes.install(ProbeWiring(link, plan))

    if getattr(args, "target", "hermes") == "hermes-agent":
        return _execute_upstream(args, link)
    try:
        db = _open_db(args)
    except sqlite3.Error as exc:  # SQLite could not open it: a read-only directory, a full disk, ...
        return _report(args, link, _storage_failure(args, exc))
    log.info("%s started for session %s", args.command, args.session)
    ledger = Ledger(args.ledger or Path(f"{args.db}.effects"), incarnation=args.incarnation)
    chaos_tools.install(ledger, (lambda effect: link.request(dict(effect, type="effect"))) if link else None)
    try:
        db.create_session(args.session, source="worker", model=args.model, system_prompt=args.system_prompt)
        db.acquire_lease(args.session, owner=f"pid:{os.getpid()}:inc:{args.incarnation}")
    except sqlite3.Error as exc:
        out = _storage_failure(args, exc)
    else:
        out = _run_command(args, db, _build_agent(args, db, link))
    code = _report(args, link, out)
    db.close()
    ledger.close()
    return code


def _report(args: argparse.Namespace, link: SupervisorLink | None, out: dict[str, Any]) -> int:
    """Log, print (one JSON line) and send the outcome; the exit code it stands for."""
    log.info("%s finished: %s %s", args.command, out["outcome"], out.get("failure_reason") or "")
    print(json.dumps(out, ensure_ascii=False, default=str), flush=True)
    if link is not None:
        link.finished = True
        link.report({"type": "outcome", "result": out})
    return EXIT_OK if out["outcome"] in ("completed", "nothing to resume") else EXIT_TURN_FAILED


def _execute_upstream(args: argparse.Namespace, link: SupervisorLink | None) -> int:
    """The same run/resume, with upstream Hermes (PyPI hermes-agent) as the agent: see worker.upstream."""
    from worker import upstream

    try:
        upstream.require()
    except upstream.UpstreamMissing as exc:
        raise UsageError(str(exc)) from None
    ledger = Ledger(args.ledger or Path(f"{args.db}.effects"), incarnation=args.incarnation)
    try:
        out = upstream.execute(args, link, ledger)
    finally:
        ledger.close()
    return _report(args, link, out)


def main(argv: Sequence[str] | None = None, *, die_with_parent: bool = True) -> int:
    """The worker entry. A fork-server child passes die_with_parent=False: its parent at that
    instant is a short-lived intermediate, and a closed control channel already stops it."""
    try:
        args = _parser().parse_args(argv)
        plan = _validate(args)
        _setup_logging(args)
        return execute(args, plan, die_with_parent)
    except UsageError as exc:
        print(f"worker: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ChannelClosed as exc:
        print(f"worker: supervisor channel closed ({exc}); stopping", file=sys.stderr)
        return EXIT_TURN_FAILED
