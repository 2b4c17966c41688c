"""The history of a campaign: what the supervisor observed, in the order it observed it.

An event is a plain dict ``{"t": seconds since the case started, "case": case id,
"type": ..., ...}``; plain dicts because the history is written as JSON lines and read
back by the checker and the reports, and nothing else needs a richer shape.

Event types the supervisor records (fields besides t/case/type):

    spawn     incarnation, pid, create_time, command ("run" | "resume"), turn_index,
              turn_id, kill_at (str | None), kill_mode
    hello     incarnation, pid
    probe     incarnation, name, n, ctx (session, turn, tool_call_id, ...), kill (bool), mode (with kill:
              "self" | "external" | "pause" | "interrupt")
    ui        incarnation, kind ("interim" | "tool_complete"), turn, tool_call_id?, text?,
              durable (bool: found in state.db at that instant),
              witness (dict naming what was found: "row_id" and/or "row_ids")
    effect    incarnation, tool, policy, tool_call_id, turn, idempotency_key,
              request_durable (bool: the assistant row holding the call was active),
              intent_durable (bool: a tool_dispatches row existed),
              witness (dict: "assistant_row_ids" found, "intent_attempts")
    kill      incarnation, pid, signal, by ("self" | "supervisor" | "timer"), probe (str | None)
    exit      incarnation, pid, returncode (int | None), signal (int | None)
    outcome   incarnation, result (the worker's JSON outcome dict)
    snapshot  after ("exit"), rows (:func:`snapshot_rows` with str keys, as JSON has them)
    pause / cont   incarnation, pid
    fault     fault (a --faults family), landed (bool), reason (why it was skipped)
    twin_run  name ("twin-a" | "twin-b"), incarnation, pid, returncode, signal, last_report (type, tool)
    store     engine ("postgres"), database (the case's own, on the campaign's server: `--store postgres`)
    server_fault  fault (pg-terminate | pg-restart | pg-hang) and what it did (supervisor.chaos.nemesis.server)

Everything the harness writes down (the history, each case's file, the reports) holds
transcript text and tool output, so every such file is created private (0600):
:func:`write_private`.
"""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from hermes import private_files
from hermes.state import StorageError, open_snapshot
from hermes.transcript import is_blank_assistant
from supervisor.chaos.durable import Durable
from targetkit.registry import schema_of

_T = TypeVar("_T")

# Keys every event carries; a caller's field of the same name would silently lie about
# when or where the event happened, so `record` refuses them.
_RESERVED = frozenset({"t", "case", "type"})


def _encode_line(event: dict[str, Any]) -> bytes:
    """One JSON line. Lone surrogates (undecodable bytes a tool returned) cannot be UTF-8;
    backslashreplace turns them into \\udXXX escapes, which JSON reads back unchanged."""
    text = json.dumps(event, ensure_ascii=False, default=str, separators=(",", ":"))
    return (text + "\n").encode("utf-8", "backslashreplace")


class HistoryWriter:
    """Streams the events of one campaign to a JSONL file as they happen.

    Each event is one line, written and flushed under a lock, so a reader (or a report
    written after the supervisor itself died) sees every event recorded before that
    instant, and lines of concurrent threads never interleave.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        # The history holds transcript text and tool output: private to this user.
        self._file = private_files.open_private(self.path, "ab")
        self._lock = threading.Lock()

    def append(self, event: dict[str, Any]) -> None:
        line = _encode_line(event)
        with self._lock:
            if self._file.closed:
                raise ValueError(f"history {self.path} is closed; the event was not recorded")
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()

    def __enter__(self) -> "HistoryWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CaseHistory:
    """The events of one running case, kept in memory for its checker and streamed to `sink`.

    The campaign drops the object when the case ends, so memory stays bounded by one case.
    """

    def __init__(self, case_id: str, sink: HistoryWriter | None = None) -> None:
        self.case_id = case_id
        self.sink = sink
        self.events: list[dict[str, Any]] = []
        # Monotonic: a wall-clock step during a case must not reorder its events.
        self._start = time.monotonic()
        self._lock = threading.Lock()

    def record(self, type: str, **fields: Any) -> dict[str, Any]:
        clash = _RESERVED & fields.keys()
        if clash:
            raise ValueError(f"event fields {sorted(clash)} are set by the history itself")
        with self._lock:
            # Stamp and append under one lock so list order and `t` order agree.
            event = {"t": round(time.monotonic() - self._start, 6), "case": self.case_id, "type": type,
                     **fields}
            self.events.append(event)
            if self.sink is not None:
                self.sink.append(event)
        return event


def read_history(path: Path) -> Iterator[dict[str, Any]]:
    """The events of a history file, in file order.

    A last line without its newline is what a writer killed mid-write leaves: it is
    yielded if it still parses and skipped if it does not. A bad line anywhere else
    is corruption, not a kill, and raises ValueError naming the line.
    """
    with open(path, "rb") as fh:
        # Streamed: a campaign's history may be far larger than memory wants.
        for number, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            if raw.endswith(b"\n"):
                yield _parse_line(raw, path, number)
                continue
            # Only the last line can lack its newline: the writer died inside that write.
            try:
                event = _parse_line(raw, path, number)
            except ValueError:
                return
            yield event


def _parse_line(raw: bytes, path: Path, number: int) -> dict[str, Any]:
    try:
        event = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}:{number}: not a JSON line ({exc})") from None
    if not isinstance(event, dict):
        raise ValueError(f"{path}:{number}: an event is a JSON object, not {type(event).__name__}")
    return event


def canonical_json(value: Any) -> str:
    """One spelling per value, so equal rows hash equal whatever order their keys came in."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def row_digest(row: dict[str, Any]) -> str:
    """sha256 of what a message row says: (role, content, tool_calls, tool_call_id, name).

    `row` is a decoded row as ``SessionDB.get_messages`` returns it. Row metadata
    (active flag, turn, clone origin) is left out: those are compared separately,
    since compaction may legally flip `active`.
    """
    payload = canonical_json([row.get("role"), row.get("content"), row.get("tool_calls"),
                              row.get("tool_call_id"), row.get("name")])
    return hashlib.sha256(payload.encode("utf-8", "backslashreplace")).hexdigest()


def summarize_row(row: dict[str, Any]) -> dict[str, Any]:
    """What a snapshot keeps of one decoded row: enough to tell later whether it was rewritten."""
    return {"session": row["session_id"], "turn": row["turn_id"], "role": row["role"],
            "active": int(row["active"]), "cloned_from": row["cloned_from"],
            "digest": row_digest(row), "blank": is_blank_assistant(row)}


def snapshot_rows(db_path: Path) -> dict[int, dict[str, Any]]:
    """Every message row of the database right now, active or not, read from a snapshot copy
    (see supervisor.chaos.durable), so taking it never changes the files it describes.

    Returns ``{id: {"session", "turn", "role", "active", "cloned_from", "digest", "blank"}}``
    ("blank": a blank assistant row, whose later repair the checker allows); ``{}`` when
    the file or its schema does not exist yet (a worker killed before creating them).
    Raises StorageError when the file exists and cannot be read.
    """
    return summarize_rows(snapshot_and_ask(db_path, None)[0])


def summarize_rows(state: Durable) -> dict[int, dict[str, Any]]:
    """`snapshot_rows` of a durable state already read."""
    return {int(r["id"]): summarize_row(r) for r in state.rows}


def snapshot_and_ask(db_path: Path, question: Callable[[sqlite3.Connection], _T] | None
                     ) -> tuple[Durable, _T | None]:
    """The whole durable state of the database now, as `load_durable` reads it (from one private
    copy), and `question` asked of the same copy (None when there is no database yet): one copy
    where two reads of the same instant need one. Raises StorageError when the file exists and
    cannot be read (where `load_durable` returns the error in the state)."""
    path = Path(db_path)
    if not path.exists():
        return Durable(path, missing=True), None
    try:
        conn = open_snapshot(path)
    except (StorageError, sqlite3.DatabaseError) as exc:
        if not path.exists():
            return Durable(path, missing=True), None
        raise StorageError(f"cannot snapshot {db_path}: {exc}") from None
    try:
        try:
            state = Durable(path, *schema_of(conn).read_durable(conn, path, None))
        except sqlite3.OperationalError as exc:
            if "no such table" not in str(exc):  # created, schema not committed: nothing durable yet
                raise StorageError(f"cannot snapshot {db_path}: {exc}") from None
            state = Durable(path, missing=True)
        except (sqlite3.DatabaseError, ValueError) as exc:  # ValueError: a row's JSON does not decode
            raise StorageError(f"cannot snapshot {db_path}: {exc}") from None
        answer = question(conn) if question is not None else None
    finally:
        conn.close()
    return state, answer


def write_private(path: Path, text: str) -> None:
    """Write `text` to a file only this user may read (0600, whatever mode an old file had)."""
    # A lone surrogate (undecodable bytes a tool returned) cannot be UTF-8: write it as its escape.
    private_files.write_private(path, text, errors="backslashreplace")


def write_json(path: Path, data: Any, *, atomic: bool = False) -> None:
    text = json.dumps(data, indent=2, ensure_ascii=False, default=str)
    (write_private_atomic if atomic else write_private)(path, text)


def write_private_atomic(path: Path, text: str) -> None:
    """`write_private`, all or nothing: a reader (or a process killed meanwhile) finds the old
    file or the new one, never half of it. The text goes to a private file beside it first."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        write_private(temporary, text)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def witness_rows(witness: Any) -> list[int]:
    """The durable row ids a witness names, wherever in it they are: a "row_id", any list
    under a key ending in "row_ids" ("row_ids", "assistant_row_ids"), or the "id" of a row
    quoted whole (a dict that also has a "role"). Used by the checker (rows seen durable) and
    by the report (rows to point at)."""
    found: set[int] = set()

    def row_id(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)  # True is an int, never a row id

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if key == "row_id" and row_id(item):
                    found.add(item)
                elif key.endswith("row_ids") and isinstance(item, list):
                    found.update(i for i in item if row_id(i))
                elif key == "id" and row_id(item) and "role" in value:
                    found.add(item)
                else:
                    walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(witness)
    return sorted(found)
