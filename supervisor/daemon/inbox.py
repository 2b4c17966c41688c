"""The daemon's durable inbox and what it publishes, as plain functions.

The inbox is the `turns` table of the session database itself: `submit` queues a
turn ('queued'), a worker run by the daemon takes it to 'running' when it commits
the user message, and to 'done' or 'failed' when it ends. The order of submission
is the table's insertion order (rowid), never a clock.

Next to the database the daemon keeps two small private files:

    PATH.daemon.lock   held with flock(2) while a daemon serves PATH; holds its pid
    PATH.daemon.json   what it is doing now: its pid, its live workers (pid and
                       start time, so a pid reused by another process is never
                       mistaken for a worker), and per-turn restart bookkeeping.
                       Rewritten atomically and durably (fsynced temp file, rename,
                       fsynced directory) on every change; first as soon as a
                       daemon holds the lock (state "starting"), so it never names
                       a previous daemon, and with the HTTP API's URL before that
                       URL is printed. Readers check the recorded pid (and its start
                       time) is alive: a dead daemon's URL is never reported.
    PATH.daemon.msgs/  (0700) one 0600 file per running worker holding its turn's
                       text, so that no command line carries it; removed when the
                       worker exits, emptied when a daemon starts or stops.

Everything here only reads, except `submit` (one write transaction), `acquire_lock` and
`write_status` (the daemon's own files).

In a fleet (a PostgreSQL store, supervisor.daemon.fleet) the inbox is that store's `turns` table,
and PATH is not a database but the base name of one daemon's files in its home directory.
"""
from __future__ import annotations

import fcntl
import json
import os
import queue
import threading
import uuid
from pathlib import Path
from typing import Any

import psutil

from hermes import private_files
from hermes.state import SessionDB
from hermes.store.engines import open_store
from hermes.transcript import is_final_answer


def lock_path(db_path: Path) -> Path:
    return Path(f"{db_path}.daemon.lock")


def status_path(db_path: Path) -> Path:
    return Path(f"{db_path}.daemon.json")


def messages_path(db_path: Path) -> Path:
    return Path(f"{db_path}.daemon.msgs")


def cancels_path(db_path: Path) -> Path:
    return Path(f"{db_path}.daemon.cancels")


def ledger_path(db_path: Path) -> Path:
    return Path(f"{db_path}.effects")


class AlreadyRunning(Exception):
    """Another daemon holds the database's lock."""


def acquire_lock(db_path: Path) -> int:
    """Hold PATH.daemon.lock (created 0600) for the life of the process; the file names the holder."""
    path = lock_path(db_path)
    fd = private_files.open_private_fd(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "?"
        os.close(fd)
        raise AlreadyRunning(f"another daemon (pid {holder}) is already serving {db_path} "
                             f"(it holds {path}); stop it first, or serve another database") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def new_turn_id() -> str:
    return f"turn-{uuid.uuid4().hex[:16]}"


def submit(location: Path | str, session_id: str, text: str, turn_id: str | None = None) -> tuple[str, bool]:
    """Queue `text` as the next user turn of `session_id` in the store at `location` (a SQLite file or a
    fleet's PostgreSQL URL); returns (turn id, newly queued)."""
    turn_id = turn_id or new_turn_id()
    with open_store(location) as db:
        return turn_id, db.submit_turn(session_id, turn_id, text)


class Submitter:
    """`submit` for a server: at most `size` connections to the store, opened when first needed and
    kept. A burst of submissions waits for one of them instead of opening a connection each (on
    PostgreSQL every connection is a server process, and the workers need theirs)."""

    def __init__(self, location: Path | str, size: int = 2) -> None:
        self.location = location
        self._free: queue.LifoQueue[Any] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(size)
        self._open: list[Any] = []
        self._lock = threading.Lock()

    def submit(self, session_id: str, text: str, turn_id: str | None = None) -> tuple[str, bool]:
        turn_id = turn_id or new_turn_id()
        with self._slots:
            try:
                db = self._free.get_nowait()
            except queue.Empty:
                db = open_store(self.location)
                with self._lock:
                    self._open.append(db)
            try:
                return turn_id, db.submit_turn(session_id, turn_id, text)
            finally:
                self._free.put(db)  # a PostgreSQL store whose connection broke reconnects on its next call

    def close(self) -> None:
        with self._lock:
            opened, self._open = self._open, []
        for db in opened:
            db.close()


# ------------------------------------------------------------- status file
def write_status(db_path: Path, data: dict[str, Any]) -> None:
    """Replace the status file atomically and durably (0600): the next daemon reads its workers
    and restart bookkeeping back, after a power cut too."""
    private_files.replace_file_durably(status_path(db_path), json.dumps(data, ensure_ascii=False, default=str))


def read_status(db_path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(status_path(db_path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def process_alive(pid: Any, create_time: Any) -> bool:
    """Is `pid` still the very process that was recorded (same start time), and not a zombie?

    A start time is the process's start in clock ticks since boot plus the boot time, which the
    kernel derives from the wall clock: read in two processes it may differ by a whole second
    (a clock adjustment moved the boot time), never by a fraction of one."""
    try:
        proc = psutil.Process(int(pid))
        if create_time is not None:
            drift = abs(proc.create_time() - float(create_time))
            if round(drift) > 1 or abs(drift - round(drift)) > 0.01:
                return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, ValueError, TypeError):
        return False


# ------------------------------------------------------------------ reading
def session_heads(db: SessionDB) -> list[dict[str, Any]]:
    """Per session, the turn that must run next: a running one, else its oldest queued one;
    the interrupted (running) heads first, then in submission order."""
    heads: dict[str, dict[str, Any]] = {}
    for turn in db.next_turns():
        current = heads.get(turn["session_id"])
        if current is None or (turn["state"] == "running" and current["state"] != "running"):
            heads[turn["session_id"]] = turn
    return sorted(heads.values(), key=lambda t: (t["state"] != "running", t["seq"]))


def final_answer(db: SessionDB, turn: dict[str, Any]) -> str | None:
    """The turn's final answer: its last original assistant row with text and no tool calls."""
    answers = [r["content"] for r in db.get_messages(turn["session_id"], include_inactive=True)
               if r["turn_id"] == turn["id"] and r["cloned_from"] is None and is_final_answer(r)]
    return answers[-1] if answers else None


def daemon_view(db_path: Path) -> dict[str, Any]:
    """What the status file says, with each recorded process checked against the live system."""
    status = read_status(db_path)
    if status is None:
        return {"state": "not running", "pid": None, "workers": [], "turns": {}}
    alive = process_alive(status.get("pid"), status.get("create_time"))
    state = status.get("state", "unknown")
    if not alive and state != "stopped":
        state = "dead (stale status file)"
    workers = [dict(w, alive=process_alive(w.get("pid"), w.get("create_time")))
               for w in status.get("workers", [])]
    # A daemon that is gone serves nothing: its URL is never shown as if it answered.
    http = status.get("http") if alive and state in ("starting", "running", "draining") else None
    return {**status, "state": state, "alive": alive, "workers": workers, "http": http}


def snapshot(location: Path | str, session_id: str | None = None, *, files: Path | None = None
             ) -> dict[str, Any]:
    """Sessions and their turns with state, attempts and last error, plus the daemon and its workers.

    `location`: the store (a SQLite file, or a fleet's PostgreSQL URL); `files`: the base of the
    daemon's own files (for SQLite, the database itself; in a fleet, one daemon's, or None)."""
    on_file = isinstance(location, Path)
    daemon = daemon_view(files) if files is not None else {"state": "not asked", "pid": None, "workers": []}
    bookkeeping = daemon.pop("turns", {}) or {}
    sessions: dict[str, dict[str, Any]] = {}
    claims: list[dict[str, Any]] = []
    if not on_file or Path(location).exists():
        with open_store(location, readonly=True) as db:
            if not on_file:
                claims = db.list_claims()
            for session in db.list_sessions():
                if session_id is None or session["id"] == session_id:
                    sessions[session["id"]] = {"id": session["id"], "turns": []}
            for turn in db.get_turns(session_id):
                notes = bookkeeping.get(turn["id"], {})
                entry = {"id": turn["id"], "state": turn["state"],
                         "attempts": max(int(turn["attempts"] or 0), int(notes.get("spawns", 0))),
                         "model_calls": int(turn.get("model_calls") or 0),
                         "crashes": int(notes.get("crashes", 0)),
                         "error": turn["error"] or (notes.get("last_error") if turn["state"] != "done" else None),
                         "submitted_at": turn["created_at"], "ended_at": turn["ended_at"]}
                sessions.setdefault(turn["session_id"], {"id": turn["session_id"], "turns": []})["turns"].append(entry)
            shown = str(location) if on_file else db.location
    else:
        shown = str(location)
    counts: dict[str, int] = {}
    for session in sessions.values():
        for turn in session["turns"]:
            counts[turn["state"]] = counts.get(turn["state"], 0) + 1
    out = {"db": shown, "daemon": daemon, "counts": counts, "sessions": list(sessions.values())}
    if not on_file:
        out["claims"] = [c for c in claims if session_id is None or c["session_id"] == session_id]
    return out
