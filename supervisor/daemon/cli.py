"""The daemon's commands: serve, submit, status, result.

    hermes-supervisor serve  --db PATH [--workers N] [--base-url URL --model NAME] [--drain-seconds S]
                             [--crash-limit K] [--backoff-base S] [--backoff-max S] [--turn-timeout S]
                             [--json-logs] [--log-file PATH] [--log-level LEVEL]
    hermes-supervisor submit --db PATH --session ID [--turn-id ID] TEXT
    hermes-supervisor status --db PATH [--session ID] [--json]
    hermes-supervisor result --db PATH TURN [--wait] [--timeout S] [--json]

Exit status: serve 0 after a clean stop (SIGTERM/SIGINT), 1 if another daemon already
serves the database; submit/status 0; result 0 done, 1 failed, 3 not finished yet
(without --wait, or the wait timed out), 4 no such turn; every command 2 on bad
arguments (one line on stderr).

`supervisor.cli` adds these with `add_commands(subparsers)` and runs them with `run(args)`;
`python -m supervisor.daemon.cli ...` runs them on their own. Each command imports what it
needs when it runs: `serve` the daemon (supervisor.daemon.service), the others the inbox.
"""
from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any, NoReturn, Sequence

from supervisor.argtypes import positive_int, seconds

PROG = "hermes-supervisor"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NOT_FINISHED, EXIT_UNKNOWN = 0, 1, 2, 3, 4
COMMANDS = ("serve", "submit", "status", "result")


class UsageError(Exception):
    """Bad arguments: one line on stderr, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def add_commands(subparsers: Any) -> None:
    """Add serve, submit, status and result to `subparsers` (its parser_class is used)."""
    serve = subparsers.add_parser("serve", help="run the daemon in the foreground: work through the inbox")
    serve.add_argument("--db", type=Path, required=True, metavar="PATH", help="the session database (created if missing)")
    serve.add_argument("--workers", type=positive_int, default=4, metavar="N", help="worker processes at once (default 4)")
    serve.add_argument("--base-url", default=None, metavar="URL",
                       help="OpenAI-compatible endpoint; default: a built-in scripted model on 127.0.0.1")
    serve.add_argument("--model", default=None, metavar="NAME", help="model name (required with --base-url)")
    serve.add_argument("--drain-seconds", type=seconds, default=30.0, metavar="SECONDS",
                       help="on SIGTERM/SIGINT, how long running turns may take to end (default 30)")
    serve.add_argument("--crash-limit", type=positive_int, default=5, metavar="K",
                       help="fail a turn after K attempts in a row that added no durable row (default 5)")
    serve.add_argument("--backoff-base", type=seconds, default=0.25, metavar="SECONDS",
                       help="first restart delay of a turn's worker; doubles per death without progress")
    serve.add_argument("--backoff-max", type=seconds, default=30.0, metavar="SECONDS", help="restart delay cap")
    serve.add_argument("--turn-timeout", type=seconds, default=900.0, metavar="SECONDS",
                       help="kill a worker whose turn runs longer (counts as a crash; default 900)")
    serve.add_argument("--request-timeout", type=seconds, default=60.0, metavar="SECONDS",
                       help="the workers' model request timeout (default 60)")
    serve.add_argument("--json-logs", action="store_true", help="log JSON lines")
    serve.add_argument("--log-file", type=Path, default=None, metavar="PATH", help="log here instead of stderr (SIGHUP reopens)")
    serve.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    serve.add_argument("--no-forkserver", action="store_true",
                       help="start each worker as a fresh interpreter instead of forking a warm template")
    serve.set_defaults(daemon_command="serve")

    submit = subparsers.add_parser("submit", help="queue a user turn; prints its turn id")
    submit.add_argument("--db", type=Path, required=True, metavar="PATH")
    submit.add_argument("--session", required=True, metavar="ID")
    submit.add_argument("--turn-id", default=None, metavar="ID", help="choose the id (submitting it again is a no-op)")
    submit.add_argument("--json", action="store_true")
    submit.add_argument("text", metavar="TEXT", help="the user message (use -- before a text starting with -)")
    submit.set_defaults(daemon_command="submit")

    status = subparsers.add_parser("status", help="sessions, turns and live workers")
    status.add_argument("--db", type=Path, required=True, metavar="PATH")
    status.add_argument("--session", default=None, metavar="ID")
    status.add_argument("--json", action="store_true")
    status.set_defaults(daemon_command="status")

    result = subparsers.add_parser("result", help="print a turn's final answer")
    result.add_argument("--db", type=Path, required=True, metavar="PATH")
    result.add_argument("turn", metavar="TURN", help="a turn id, as submit printed it")
    result.add_argument("--wait", action="store_true", help="wait until the turn ends")
    result.add_argument("--timeout", type=seconds, default=300.0, metavar="SECONDS",
                        help="with --wait: give up after this long (default 300; 0 = forever)")
    result.add_argument("--json", action="store_true")
    result.set_defaults(daemon_command="result")


# ----------------------------------------------------------------- commands
def _existing_db(path: Path) -> Path:
    if path.is_dir():
        raise UsageError(f"--db {path} is a directory, not a database file")
    if not path.exists():
        raise UsageError(f"--db {path} does not exist")
    return path


def _writable_db(path: Path) -> Path:
    if path.is_dir():
        raise UsageError(f"--db {path} is a directory, not a database file")
    if not path.parent.is_dir():
        raise UsageError(f"--db {path}: directory {path.parent} does not exist")
    return path


def _run_serve(args: argparse.Namespace) -> int:
    from hermes.state import StorageError
    from supervisor.daemon.inbox import AlreadyRunning
    from supervisor.daemon.service import DaemonConfig, serve

    db = _writable_db(args.db)
    if (args.base_url is None) != (args.model is None):
        raise UsageError("--base-url and --model go together (without both, the built-in scripted model is used)")
    if args.base_url is not None and not args.base_url.startswith(("http://", "https://")):
        raise UsageError(f"--base-url {args.base_url!r} is not an http(s) URL")
    if args.turn_timeout <= 0 or args.request_timeout <= 0:
        raise UsageError("--turn-timeout and --request-timeout must be more than 0")
    if args.log_file is not None and not args.log_file.parent.is_dir():
        raise UsageError(f"--log-file {args.log_file}: directory {args.log_file.parent} does not exist")
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
    os.environ.setdefault("no_proxy", os.environ["NO_PROXY"])
    config = DaemonConfig(db=db.absolute(), workers=args.workers, base_url=args.base_url, model=args.model,
                          drain_seconds=args.drain_seconds, crash_limit=args.crash_limit,
                          backoff_base=args.backoff_base, backoff_max=max(args.backoff_max, args.backoff_base),
                          turn_timeout=args.turn_timeout, request_timeout=args.request_timeout,
                          forkserver=not args.no_forkserver)
    try:
        return serve(config, json_logs=args.json_logs, log_file=args.log_file, log_level=args.log_level)
    except AlreadyRunning as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except StorageError as exc:
        raise UsageError(str(exc)) from None


def _run_submit(args: argparse.Namespace) -> int:
    from hermes.state import StorageError
    from supervisor.daemon import inbox

    db = _writable_db(args.db)
    if not args.session.strip():
        raise UsageError("--session must not be empty")
    if not args.text.strip():
        raise UsageError("TEXT must not be empty")
    try:
        turn_id, new = inbox.submit(db, args.session, args.text, args.turn_id)
    except (StorageError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        print(json.dumps({"turn": turn_id, "session": args.session, "queued": new}))
    else:
        print(turn_id)
    return EXIT_OK


def _age(since: Any) -> str:
    try:
        return f"{max(0.0, time.time() - float(since)):.1f}s"
    except (TypeError, ValueError):
        return "?"


def _print_status(data: dict[str, Any]) -> None:
    daemon = data["daemon"]
    live = [w for w in daemon.get("workers", []) if w.get("alive")]
    if daemon.get("pid"):
        print(f"daemon: {daemon['state']} (pid {daemon['pid']}), {len(live)}/{daemon.get('workers_max', '?')} "
              f"workers busy, model {daemon.get('model')} at {daemon.get('base_url')}")
    else:
        print("daemon: not running")
    for w in live:
        print(f"  worker pid {w['pid']}  session {w['session']}  turn {w['turn']}  for {_age(w.get('started_at'))}")
    counts = data["counts"]
    print("turns: " + ", ".join(f"{counts.get(s, 0)} {s}" for s in ("queued", "running", "done", "failed")))
    for session in data["sessions"]:
        print(f"session {session['id']}")
        for turn in session["turns"]:
            line = f"  {turn['id']}  {turn['state']:7}  attempts {turn['attempts']}"
            if turn["crashes"]:
                line += f"  crashes {turn['crashes']}"
            if turn["error"]:
                line += f"  error: {turn['error']}"
            print(line)


def _run_status(args: argparse.Namespace) -> int:
    from hermes.state import StorageError
    from supervisor.daemon import inbox

    db = _existing_db(args.db)
    try:
        data = inbox.snapshot(db, args.session)
    except StorageError as exc:
        raise UsageError(str(exc)) from None
    except sqlite3.Error as exc:
        raise UsageError(f"cannot read {db}: {exc}") from None
    if args.json:
        print(json.dumps(data, ensure_ascii=False, default=str))
    else:
        _print_status(data)
    return EXIT_OK


def _run_result(args: argparse.Namespace) -> int:
    from hermes.state import SessionDB, StorageError
    from supervisor.daemon import inbox

    db_path = _existing_db(args.db)
    deadline = time.monotonic() + args.timeout if args.timeout > 0 else None
    try:
        with SessionDB(db_path, readonly=True) as db:
            while True:
                turn = db.get_turn(args.turn)
                if turn is None:
                    print(f"{PROG}: error: no turn {args.turn!r} in {db_path}", file=sys.stderr)
                    return EXIT_UNKNOWN
                if turn["state"] in ("done", "failed") or not args.wait:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    break
                time.sleep(0.1)
            answer = inbox.final_answer(db, turn) if turn["state"] == "done" else None
    except StorageError as exc:
        raise UsageError(str(exc)) from None
    except sqlite3.Error as exc:
        raise UsageError(f"cannot read {db_path}: {exc}") from None
    if args.json:
        print(json.dumps({"turn": turn["id"], "session": turn["session_id"], "state": turn["state"],
                          "answer": answer, "error": turn["error"]}, ensure_ascii=False))
    if turn["state"] == "done":
        if not args.json:
            print(answer if answer is not None else "")
        return EXIT_OK
    if turn["state"] == "failed":
        if not args.json:
            print(f"{PROG}: turn {turn['id']} failed: {turn['error']}", file=sys.stderr)
        return EXIT_FAILED
    if not args.json:
        waited = " (timed out waiting)" if args.wait else ""
        print(f"{PROG}: turn {turn['id']} is {turn['state']}, not finished yet{waited}", file=sys.stderr)
    return EXIT_NOT_FINISHED


_RUNNERS = {"serve": _run_serve, "submit": _run_submit, "status": _run_status, "result": _run_result}


def run(args: argparse.Namespace) -> int:
    """Execute a parsed serve/submit/status/result command; usage errors print one line and return 2."""
    try:
        command = getattr(args, "daemon_command", None) or getattr(args, "command", None)
        if command not in _RUNNERS:
            raise UsageError(f"unknown command {command!r}; expected one of {', '.join(COMMANDS)}")
        return _RUNNERS[command](args)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="The hermes daemon: a durable inbox worked by supervised workers.")
    add_commands(parser.add_subparsers(dest="command", required=True, parser_class=_Parser))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
