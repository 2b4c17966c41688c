"""`hermes-supervisor check`: the structural invariants (well-formed, no duplicate rows, every done
turn answered once) of a SQLite database (`--db`) or of one snapshot of a PostgreSQL store
(`--store`), said in one line, or (`--json`) the whole verdict with its witnesses. Exit 0 valid, 1
not valid or unknown (nothing to judge), 2 a usage error or a store out of reach."""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from supervisor.argtypes import UsageError

EXIT_OK, EXIT_VIOLATIONS = 0, 1


def run_check(args: argparse.Namespace) -> int:
    from hermes.state import StorageError
    from supervisor.chaos.checker import check_structure

    if args.store is not None:
        return _check_store(args.store, args.session, args.json)
    if not args.db.exists():
        raise UsageError(f"--db {args.db} does not exist")
    if args.db.is_dir():  # a damaged database is a verdict; a directory is a wrong argument
        raise UsageError(f"--db {args.db} is a directory, not a database file")
    try:
        verdict = check_structure(args.db, args.session)
    except StorageError as exc:
        raise UsageError(str(exc)) from None
    return print_verdict(verdict.to_json(), str(args.db), args.json)


def print_verdict(verdict: dict[str, Any], where: str, as_json: bool) -> int:
    """The verdict of `check`: one line for a person, or (--json) all of it; the exit status it means."""
    if as_json:
        print(json.dumps(verdict, indent=2, ensure_ascii=False))
    else:
        parts = ", ".join(part["name"] for part in verdict.get("parts", []))
        if verdict["valid"] is True:
            counts = verdict["counts"]
            print(f"{where}: valid ({parts}): {counts.get('well-formed.rows_checked', 0)} rows, "
                  f"{counts.get('answer-once.done_turns', 0)} done turns")
        elif verdict["valid"] is False:
            broken = sorted({v["invariant"] for v in verdict["violations"]})
            n = len(verdict["violations"])
            print(f"{where}: NOT valid: {n} violation{'' if n == 1 else 's'} of {', '.join(broken)} "
                  "(--json shows each, with its witness)")
        else:
            print(f"{where}: unknown: {' '.join(str(verdict.get('message', '')).split())}")
    return EXIT_OK if verdict["valid"] is True else EXIT_VIOLATIONS


def _check_store(url: str, session: str | None, as_json: bool) -> int:
    """`check --store URL`: the same structural check, on an image of one snapshot of the store
    (hermes.store.pg.image) made in a private directory and removed after; the verdict names the
    store by its URL, without the password."""
    from hermes.state import StorageError
    from hermes.store.engines import is_postgres_url
    from hermes.store.pg.connection import redact
    from supervisor.chaos.checker import check_structure

    if not is_postgres_url(url):
        raise UsageError("--store takes a postgresql:// URL (a SQLite database is --db PATH)")
    try:
        from hermes.store.pg.image import copy_to_sqlite
    except ImportError as exc:  # the postgres extra is not installed: say what to install
        raise UsageError(str(exc)) from None
    where = redact(url)
    with tempfile.TemporaryDirectory(prefix="hermes-check-") as scratch:  # 0700: the image holds the transcript
        try:
            image = copy_to_sqlite(url, Path(scratch) / "state.db", session, durable=False)
            verdict = check_structure(image, session, name=where)
        except StorageError as exc:
            raise UsageError(str(exc)) from None
    return print_verdict({**verdict.to_json(), "store": where}, where, as_json)
