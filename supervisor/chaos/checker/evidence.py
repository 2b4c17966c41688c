"""What the invariants read, and how a witness quotes it: the durable state, the effects
ledger, the history's events, and brief forms of rows and turns a person can follow."""
from __future__ import annotations

import sqlite3
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from hermes.transcript import is_final_answer
from supervisor.chaos.checker.verdict import UNREADABLE, Verdict, unknown_verdict
from supervisor.chaos.durable import Durable, load_durable
from supervisor.chaos.history import canonical_json
from worker.ledger_reader import LedgerReader

# How much of a row's text a witness quotes: enough to recognise it in a report.
QUOTE = 200

DB = Path | Durable


def as_durable(db: DB) -> Durable:
    return db if isinstance(db, Durable) else load_durable(Path(db))


def unreadable(name: str, d: Durable) -> Verdict:
    return unknown_verdict(name, f"cannot read {d.path}: {d.error}", UNREADABLE)


def _read_ledger(ledger: Path | str, what: str,
                 read: Callable[[LedgerReader], list[dict[str, Any]]]) -> list[dict[str, Any]] | str:
    """`read` on a private copy of the ledger file (the original is never opened read-write),
    or a string saying why `what` cannot be read."""
    path = Path(ledger)
    if not path.exists():
        return f"no effects ledger at {path}"
    try:
        handle = LedgerReader(path)
    except sqlite3.DatabaseError as exc:
        return f"cannot open effects ledger {path}: {exc}"
    try:
        return read(handle)
    except sqlite3.DatabaseError as exc:  # e.g. killed before its schema was committed
        return f"cannot read the {what} of effects ledger {path}: {exc}"
    finally:
        handle.close()


def ledger_records(ledger: Path) -> dict[str, str | None] | str:
    """What the effects ledger holds, read from one private copy: each record as a comparable key
    ("execution <id>", "applied <idempotency key>") -> the tool call it belongs to; an empty dict
    when there is no ledger yet; else why it cannot be read."""
    if not Path(ledger).exists():
        return {}

    def read(handle: LedgerReader) -> list[dict[str, Any]]:
        executions = handle.executions()
        calls = {row["idempotency_key"]: row["tool_call_id"] for row in executions if row["idempotency_key"]}
        return [*({"key": f"execution {row['id']}", "call": row["tool_call_id"]} for row in executions),
                *({"key": f"applied {row['idempotency_key']}", "call": calls.get(row["idempotency_key"])}
                  for row in handle.applied())]

    found = _read_ledger(ledger, "executions and applied keyed writes", read)
    return found if isinstance(found, str) else {row["key"]: row["call"] for row in found}


def load_executions(ledger: Path | Sequence[dict[str, Any]] | None) -> list[dict[str, Any]] | str:
    """The ledger's execution rows, or a string saying why there are none to judge by."""
    if ledger is None:
        return "no effects ledger was given"
    if not isinstance(ledger, (str, Path)):
        return list(ledger)
    return _read_ledger(ledger, "executions", lambda handle: handle.executions())


def load_applied(ledger: Path | Sequence[dict[str, Any]] | None) -> list[dict[str, Any]] | str:
    """The ledger's applied keyed writes (table `kv`: one row per application, as
    `idempotency_key`, `key`, `value`, `applied_at`), or a string saying why there are none to
    judge by. A ledger older than that table has none, which is said, never read as "no write
    was applied"."""
    if ledger is None:
        return "no effects ledger was given"
    if not isinstance(ledger, (str, Path)):
        return list(ledger)
    return _read_ledger(ledger, "applied keyed writes (table kv)", lambda handle: handle.applied())


def quote(value: Any) -> str | None:
    """The start of what a message says, as a witness quotes it: text as it is, anything else (a list
    of content parts) as its JSON; None stays None."""
    if value is None:
        return None
    return (value if isinstance(value, str) else canonical_json(value))[:QUOTE]


def brief(row: dict[str, Any]) -> dict[str, Any]:
    """A row as a witness shows it: its identity and the start of what it says."""
    calls = row.get("tool_calls") or []
    return {"id": row["id"], "session": row.get("session_id"), "turn": row.get("turn_id"),
            "role": row.get("role"), "active": row.get("active"), "cloned_from": row.get("cloned_from"),
            "tool_call_id": row.get("tool_call_id"),
            "tool_calls": [c.get("id") for c in calls if isinstance(c, dict)],
            "content": quote(row.get("content"))}


def of_type(events: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("type") == kind]


def when(event: dict[str, Any]) -> dict[str, Any]:
    """Where an observation sits in the history, for a witness."""
    return {k: event.get(k) for k in ("t", "type", "incarnation", "after") if k in event}


def is_summary_row(row: dict[str, Any]) -> bool:
    """A compaction's summary: an original user row of no turn."""
    return row["role"] == "user" and row["turn_id"] is None and row["cloned_from"] is None


def turn_brief(turn: dict[str, Any]) -> dict[str, Any]:
    text = turn.get("user_text")
    return {"id": turn["id"], "session": turn["session_id"], "state": turn["state"],
            "attempts": turn.get("attempts"), "error": turn.get("error"),
            "user_text": text[:QUOTE] if isinstance(text, str) else text}


def final_answers(d: Durable) -> dict[str, list[dict[str, Any]]]:
    """Each turn's final answers: original (not compaction-cloned) assistant rows with text and no tool calls."""
    answers: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in d.rows:
        if row["cloned_from"] is None and is_final_answer(row):
            answers[row["turn_id"]].append(row)
    return answers
