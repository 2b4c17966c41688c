"""`submit`, `status` and `result`: the commands that write a turn into the inbox or read it back,
on a SQLite `--db` or a fleet's `--store`."""
from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from hermes.text_files import UnreadableText, read_utf8
from supervisor.argtypes import UsageError
from supervisor.daemon.cli_shared import EXIT_FAILED, EXIT_NOT_FINISHED, EXIT_NOT_SERVED, EXIT_OK, EXIT_UNKNOWN, \
    PROG, NotServed, existing_db, shown, store_url, unreadable, writable_db


def _message(args: argparse.Namespace) -> str:
    """The user message: TEXT, or the --message-file, or standard input (`-`); never empty."""
    if args.text is not None and args.message_file is not None:
        raise UsageError("give the message once: TEXT or --message-file, not both")
    if args.text is None and args.message_file is None:
        raise UsageError("no message: give --message-file PATH, - to read standard input, or TEXT")
    if args.text is not None and args.text != "-":
        text, what = args.text, "TEXT"
    elif args.text == "-" or str(args.message_file) == "-":
        what = "the message on standard input"
        try:
            data = sys.stdin.buffer.read() if sys.stdin is not None else b""
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read the message from standard input ({exc})") from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UsageError(f"{what} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    else:
        what = f"--message-file {args.message_file}"
        try:
            text = read_utf8(args.message_file, "--message-file")
        except UnreadableText as exc:
            raise UsageError(str(exc)) from None
    text = text.rstrip("\r\n")  # the newline a file or `echo` ends with is not part of the message
    if not text.strip():
        raise UsageError(f"{what} is empty")
    return text


def run_submit(args: argparse.Namespace) -> int:
    from hermes.state import StorageError
    from supervisor.daemon import inbox

    if args.store is not None:
        if args.create:
            raise UsageError("--create is for a SQLite --db: a PostgreSQL store is created by its first daemon")
        where: str | Path = store_url(args.store)
    else:
        where = db = writable_db(args.db)
        if not args.create and not db.exists():
            raise UsageError(f"--db {db} does not exist: is it the database the daemon serves? "
                             "(add --create to make a new one)")
    if not args.session.strip():
        raise UsageError("--session must not be empty")
    text = _message(args)
    try:
        turn_id, new = inbox.submit(where, args.session, text, args.turn_id)
    except ValueError as exc:  # the turn id was used by another submission
        raise UsageError(str(exc)) from None
    except (StorageError, sqlite3.Error) as exc:
        raise unreadable(where, exc) from None
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
    elif daemon.get("state") == "not asked":
        print(f"store: {data['db']} (a fleet; --home DIR shows one of its daemons)")
    else:
        print("daemon: not running")
    for claim in data.get("claims", []):
        print(f"  session {claim['session_id']} claimed by {claim['owner']} (epoch {claim['epoch']}, "
              f"{max(0.0, claim['expires_in']):.1f}s left)")
    if daemon.get("pid") and (daemon.get("http") or {}).get("url"):
        print(f"http API: {daemon['http']['url']}")
    for w in live:
        print(f"  worker pid {w['pid']}  session {w['session']}  turn {w['turn']}  for {_age(w.get('started_at'))}")
    counts = data["counts"]
    print("turns: " + ", ".join(f"{counts.get(s, 0)} {s}" for s in ("queued", "running", "done", "failed")))
    for session in data["sessions"]:
        print(f"session {session['id']}")
        for turn in session["turns"]:
            line = f"  {turn['id']}  {turn['state']:7}  attempts {turn['attempts']}"
            if turn.get("model_calls"):
                line += f"  model calls {turn['model_calls']}"
            if turn["crashes"]:
                line += f"  crashes {turn['crashes']}"
            if turn["error"]:
                line += f"  error: {turn['error']}"
            print(line)


def _wait_until_served(db: Path, timeout: float) -> None:
    """Return once a live daemon serves `db` (its status file names a running process that is
    still that very process); NotServed after `timeout` seconds (0: wait forever)."""
    from supervisor.daemon import inbox

    if db.is_dir():
        raise UsageError(f"--db {db} is a directory, not a database file")
    deadline = time.monotonic() + timeout if timeout > 0 else None
    while True:
        view = inbox.daemon_view(db) if db.exists() or inbox.status_path(db).exists() else None
        if view is not None and view.get("alive") and view.get("state") == "running":
            return
        if deadline is not None and time.monotonic() >= deadline:
            seen = "the database does not exist" if view is None else f"daemon: {view.get('state')}"
            raise NotServed(f"no live daemon serves {db} after {timeout:g}s ({seen}); is `serve --db {db}` "
                            "running? its log says why not")
        time.sleep(0.05)


def run_status(args: argparse.Namespace) -> int:
    from hermes.state import StorageError
    from supervisor.daemon import inbox

    if args.store is not None:
        where: str | Path = store_url(args.store)
        files = Path(args.home).absolute() / "fleet" if args.home is not None else None
        if args.wait:
            if files is None:
                raise UsageError("status --store --wait needs --home DIR: the daemon to wait for")
            _wait_until_served(files, args.timeout)
    else:
        if args.home is not None:
            raise UsageError("--home goes with --store (a SQLite daemon's files are beside its --db)")
        if args.wait:
            _wait_until_served(args.db, args.timeout)
        where = files = existing_db(args.db)
    try:
        data = inbox.snapshot(where, args.session, files=files)
    except (StorageError, sqlite3.Error) as exc:
        raise unreadable(where, exc) from None
    if args.json:
        print(json.dumps(data, ensure_ascii=False, default=str))
    else:
        _print_status(data)
    if data["daemon"].get("state") == "not asked":  # a fleet's store, no daemon of it named (--home)
        return EXIT_OK
    return EXIT_OK if data["daemon"].get("alive") else EXIT_NOT_SERVED


def run_result(args: argparse.Namespace) -> int:
    from hermes.state import StorageError
    from hermes.store.engines import open_store
    from supervisor.daemon import inbox

    db_path = store_url(args.store) if args.store is not None else existing_db(args.db)
    deadline = time.monotonic() + args.timeout if args.timeout > 0 else None
    try:
        with open_store(db_path, readonly=True) as db:
            while True:
                turn = db.get_turn(args.turn)
                if turn is None:
                    print(f"{PROG}: error: no turn {args.turn!r} in {shown(db_path)}", file=sys.stderr)
                    return EXIT_UNKNOWN
                if turn["state"] in ("done", "failed") or not args.wait:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    break
                time.sleep(0.1)
            answer = inbox.final_answer(db, turn) if turn["state"] == "done" else None
    except (StorageError, sqlite3.Error) as exc:
        raise unreadable(db_path, exc) from None
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
