"""Deliberate defect: a flush stamps its messages durable before COMMIT, and trusts the stamps.

Loaded only by worker processes (see `worker_only.is_worker`). The live message dicts learn
they are durable (`_db_persisted`, the marker every later flush and projection relies on)
only after `write_pending` has committed. Here they are stamped first, and when the write
then fails (e.g. the database stays locked past the worker's patience) the flush reasons
"the rows are marked persisted, so they are saved" and reports success. The tool result is
then shown although it was never committed, and no later flush writes it. The checker must
report `durable-before-visible`.
"""
import logging
import os
import sqlite3
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "markers-before-commit"


def _arm() -> None:
    from hermes.turn import Turn

    log = logging.getLogger("hermes.runner")
    write = Turn.write

    def stamp_then_write(self, pending, start_turn=None):
        for msg in pending:
            msg["_db_persisted"] = True
        try:
            return write(self, pending, start_turn)
        except sqlite3.OperationalError as exc:
            if all(msg.get("_db_persisted") for msg in pending):
                log.warning("flush reported %s, but its rows are marked persisted; carrying on", exc)
                return True
            raise

    Turn.write = stamp_then_write
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
