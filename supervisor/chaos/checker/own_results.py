"""What the effects ledger knows of a user's own tools (worker.ledgered_tools): each run's return,
and how each tool declared itself.

A user's tool has no oracle of its clean results: it writes files, numbers notes, reads the
clock. What it returned is known all the same, run by run, because the worker wrapped it: the
ledger holds every execution and, for each run that got as far as returning, the result text it
returned. So result-fidelity holds such a tool to this rule: every durable result of a call is,
character for character, what one of that call's recorded runs returned (the unknown-outcome and
cancelled results aside, judged as for every tool). A result no run returned was made up, or is
a harness or runtime error in the tool's place. The declarations, written when a worker wraps
the tools, say which tools were wrapped (a call of one with no recorded return cannot have a
clean result, and a success of one needs an execution behind it) and which are read-only
(idempotent and parallel-safe: effect-semantics lets them rerun freely).
"""
from __future__ import annotations

import sqlite3
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from hermes.state import open_snapshot
from worker.ledgered_tools import DECLARATIONS_TABLE, RETURNS_TABLE

CallKey = tuple[str, str, str]


@dataclass
class OwnRecords:
    returned: dict[CallKey, list[str]] = field(default_factory=dict)  # per call, what each run returned
    declared: dict[str, dict[str, Any]] = field(default_factory=dict)  # tool -> {"policy", "read_only"}

    @property
    def read_only(self) -> set[str]:
        return {tool for tool, d in self.declared.items() if d["read_only"]}


def load_own(ledger: Path | str | Sequence[dict[str, Any]] | None) -> OwnRecords | str:
    """The returns and declarations of the wrapped tools in `ledger` (empty when it has none: a
    campaign over the chaos tools), or why they cannot be read."""
    if ledger is None or not isinstance(ledger, (str, Path)):
        return OwnRecords()  # executions handed over already read: nothing more to find
    path = Path(ledger)
    if not path.exists():
        return f"no effects ledger at {path}"
    try:
        conn = open_snapshot(path)
    except sqlite3.DatabaseError as exc:
        return f"cannot open effects ledger {path}: {exc}"
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        records = OwnRecords()
        if DECLARATIONS_TABLE not in tables:
            return records  # no wrapped tool ever ran
        for tool, policy, read_only in conn.execute(f"SELECT tool, policy, read_only FROM {DECLARATIONS_TABLE}"):
            records.declared[tool] = {"policy": policy, "read_only": bool(read_only)}
        returned: dict[CallKey, list[str]] = defaultdict(list)
        if RETURNS_TABLE in tables:
            for session, turn, call, result in conn.execute(
                    f"SELECT e.session_id, e.turn_id, e.tool_call_id, r.result FROM {RETURNS_TABLE} r "
                    "JOIN executions e ON e.id = r.execution_id ORDER BY e.id"):
                returned[(session or "", turn or "", call or "")].append(result)
        records.returned = dict(returned)
        return records
    except sqlite3.DatabaseError as exc:
        return f"cannot read the tool returns of effects ledger {path}: {exc}"
    finally:
        conn.close()
