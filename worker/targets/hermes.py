"""The hermes target: run or resume a turn of a session with our runtime (``hermes/``).

The worker claims the session (a new fencing lease, so an older worker still running it can
write nothing more), finishes an interrupted turn first, and only then runs the new message.
With ``--compact-above ROWS`` older turns are summarized before the new turn (`_compact`) and,
by the agent itself (``AIAgent.compact_above``), inside a turn between a tool block and the next
model call, in `run` and in `resume` alike.
Storage that fails at open, while the session is claimed or while the worker reads it ends the
command with the named persistence failure, like a failed write inside the turn; a path that
is no usable database, or an unknown session, is a usage error.
"""
from __future__ import annotations

import argparse
import logging
import os
import sqlite3
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from hermes import persistence_failure
from hermes.executor import SPILL_THRESHOLD_CHARS
from hermes.state import SessionDB, StorageError
from hermes.store.engines import open_store
from hermes.transcript import is_final_answer
from hermes.turn import PERSISTENCE_FAILED
from targetkit import FULL_PROMISES, Target
from worker.link import SupervisorLink
from worker.targets import Report, UsageError, open_ledger, show, toolsets_of

if TYPE_CHECKING:
    from hermes.runner import AIAgent

log = logging.getLogger("worker")

# The runtime (hermes.runner, and the openai SDK under it) is imported when a turn runs, not with
# this record: every supervisor reads the record, and a worker's template imports the runtime anyway.
TARGET = Target("hermes", "ours (default)", adapter=__name__, schema="supervisor.chaos.schema.hermes",
                forkserver=True, promises=replace(FULL_PROMISES, spills_results_over=SPILL_THRESHOLD_CHARS,
                                                 compacts_between_turns=True, compacts_inside_turns=True))


def content_parts_refusal(parts: list[dict[str, Any]]) -> str | None:
    """None: our runtime takes a list of content parts as the user message, stores it as JSON,
    sends it to the model as given and reads it back as a list (hermes.content)."""
    del parts
    return None


def execute(args: argparse.Namespace, link: SupervisorLink | None, report: Report) -> int:
    """Run (or resume) the turn `args` asks for, and report its outcome (before letting go of the database)."""
    try:
        db = _open_db(args)
    except sqlite3.Error as exc:  # SQLite could not open it: a read-only directory, a full disk, ...
        return report(_storage_failure(args, exc))
    log.info("%s started for session %s", args.command, args.session)
    ledger = open_ledger(args, link)
    try:
        db.create_session(args.session, source="worker", model=args.model, system_prompt=args.system_prompt)
        if args.claim is not None:  # started by a daemon of a fleet: work only while its claim holds
            epoch, owner = args.claim
            db.hold_claim(args.session, owner, epoch)
        db.acquire_lease(args.session, owner=f"pid:{os.getpid()}:inc:{args.incarnation}")
        out = _run_command(args, db, _build_agent(args, db, link))
    except sqlite3.Error as exc:  # claiming or reading the session (a turn's own failures end closed inside)
        out = _storage_failure(args, exc)
    code = report(out)
    db.close()
    ledger.close()
    return code


def _open_db(args: argparse.Namespace) -> SessionDB:
    try:
        db = open_store(args.store or args.db, synchronous=args.synchronous, busy_budget_s=args.busy_budget)
    except StorageError as exc:  # not a usable database path at all (a directory, not SQLite, newer schema)
        raise UsageError(str(exc)) from None
    except ImportError as exc:  # --store without the postgres extra: what to install
        raise UsageError(str(exc)) from None
    try:
        known = args.command != "resume" or db.get_session(args.session) is not None
    except sqlite3.Error:
        # The file opened but cannot be read (e.g. corrupt pages): claiming the session next
        # fails with the same error, and that becomes the turn's named storage failure.
        return db
    if not known:
        db.close()
        raise UsageError(f"session {args.session!r} is not in {db.db_path}")
    return db


def _storage_failure(args: argparse.Namespace, exc: Exception) -> dict[str, Any]:
    """The outcome of a worker that could not claim or read its session (e.g. the database is locked):
    failed, as a turn whose write failed is, and nothing written to say so (the storage just failed)."""
    where = args.db
    if args.store is not None:  # its password, if any, never goes into a message
        from hermes.store.pg.connection import redact

        where = redact(args.store)
    cause = persistence_failure.classify(exc, args.db)
    detail = None if cause == "locked" else str(exc)
    return {"outcome": "failed", "session": args.session, "turn_id": getattr(args, "turn_id", None),
            "final_response": None, "turn_exit_reason": PERSISTENCE_FAILED,
            "failure_reason": f"{PERSISTENCE_FAILED}:{cause}",
            "error": persistence_failure.describe(cause, detail, where)}


def _run_command(args: argparse.Namespace, db: SessionDB, agent: AIAgent) -> dict[str, Any]:
    from hermes.resume import resume_interrupted_turn

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


def _finished_turn(db: SessionDB, turn_id: str | None) -> dict[str, Any] | None:
    """The outcome of a turn that already ended, so running it again is a no-op, not a duplicate."""
    turn = db.get_turn(turn_id) if turn_id else None
    if turn is None or turn["state"] not in ("done", "failed"):
        return None
    answers = [r["content"] for r in db.get_messages(turn["session_id"])
               if r["turn_id"] == turn_id and is_final_answer(r)]
    out = {"outcome": "completed" if turn["state"] == "done" else "failed", "session": turn["session_id"],
           "turn_id": turn_id, "final_response": answers[-1] if answers else None,
           "turn_exit_reason": "already_finished", "api_calls": 0}
    if turn["state"] == "failed":
        out.update(failure_reason="already_failed", error=turn["error"])
    return out


def _compact(agent: AIAgent, max_rows: int) -> None:
    from hermes.compaction import compact_if_needed

    try:
        if compact_if_needed(agent, max_rows):
            log.info("compacted session %s", agent.session_id)
    except Exception as exc:  # an unavailable summarizer must not cost the user their turn
        log.warning("compaction skipped: %s", exc)


def _build_agent(args: argparse.Namespace, db: SessionDB, link: SupervisorLink | None) -> AIAgent:
    from hermes.runner import AIAgent

    toolsets = toolsets_of(args)
    agent_ref: list[AIAgent] = []

    def project(kind: str, **fields: Any) -> None:
        show(link, args.session, agent_ref[0].turn.id, kind, **fields)

    try:
        agent = AIAgent(api_key=args.api_key, base_url=args.base_url, model=args.model, session_db=db,
                        session_id=args.session, enabled_toolsets=toolsets, system_prompt=args.system_prompt,
                        stream=args.stream, request_timeout=args.timeout, max_retries=args.max_retries,
                        max_model_calls=args.max_model_calls,
                        # Inside a turn (a resumed one too): between a tool block and the next model call.
                        compact_above=getattr(args, "compact_above", 0) or 0,
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
    if args.home is not None:
        agent.hermes_home = args.home
    agent.save_trajectories = bool(getattr(args, "save_trajectories", False))
    agent_ref.append(agent)
    return agent


# ------------------------------------------------------------- the SDK's HTTP client
_TLS_CONTEXT: Any = None
_CLIENT: Any = None


def sdk_http_module() -> Any:
    """The HTTP library the OpenAI SDK is built on (httpx, or httpx2 in newer SDKs)."""
    import openai

    client = next(c for c in openai.DefaultHttpxClient.__mro__ if c.__name__ == "Client")
    return sys.modules[client.__module__.partition(".")[0]]


def http_client(base_url: str, timeout: float) -> Any:
    """This process's HTTP client for the SDK: the SDK's own defaults, on one TLS context.

    The SDK would build a client per agent, loading the CA store each time (~30 ms). Here one
    client is built per process (a fork-server template builds it before forking, so its workers
    find it built). One serves every agent whatever its `base_url` and `timeout`: the SDK sends
    each request with its absolute URL and its timeout, so those of the HTTP client are never
    used. None if the SDK has no such hook (it then builds its own client, as before).
    """
    global _TLS_CONTEXT, _CLIENT
    try:
        import openai

        if _CLIENT is None or _CLIENT.is_closed:
            if _TLS_CONTEXT is None:
                _TLS_CONTEXT = sdk_http_module().create_ssl_context()
            _CLIENT = openai.DefaultHttpxClient(verify=_TLS_CONTEXT)
        return _CLIENT
    except Exception as exc:  # an SDK without DefaultHttpxClient/create_ssl_context
        log.debug("no shared HTTP client (%s); the SDK builds its own", exc)
        return None
