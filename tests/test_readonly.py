"""Read-only opens never change the database they read.

The evidence a checker judges is a WAL database whose writer was SIGKILLed: its committed
rows live only in the -wal, and the -shm index is whatever the writer left. Every reader
here must see those rows and leave the database, its -wal and its -shm byte-identical,
with no file created or removed next to them.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

import hermes.store.snapshot as snapshot
from hermes.state import (
    LiveReadUnavailable,
    ReadOnlyOpenError,
    SessionDB,
    StorageError,
    connect_readonly,
    open_snapshot,
)
from supervisor.chaos.checker import load_durable
from supervisor.chaos.history import snapshot_rows
from supervisor.chaos.schema import hermes_agent as upstream_schema

REPO = Path(__file__).resolve().parent.parent
_CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
TURN = [
    {"role": "user", "content": "what is 2+2?", "_turn_id": "t1"},
    {"role": "assistant", "content": None, "tool_calls": [_CALL], "_turn_id": "t1"},
    {"role": "tool", "tool_call_id": "c1", "name": "add", "content": "4", "_turn_id": "t1"},
    {"role": "assistant", "content": "2+2 is 4", "_turn_id": "t1"},
]
CONTENTS = [m["content"] for m in TURN]

# The writer: commits one turn with automatic checkpoints off (so every row stays in the
# WAL), says so, and waits on stdin to be killed.
_WRITER = textwrap.dedent("""
    import json, sys
    from hermes.state import SessionDB

    db = SessionDB(sys.argv[1])
    db._conn.execute("PRAGMA wal_autocheckpoint = 0")
    db.create_session("s", source="test")
    db.write_pending("s", json.loads(sys.argv[2]), start_turn="t1")
    db.finish_turn("t1", "done")
    print("committed", flush=True)
    sys.stdin.readline()
""")


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO), NO_PROXY="127.0.0.1,localhost")


def _killed_writer_db(directory: Path) -> Path:
    """A database whose writer was SIGKILLed right after committing: rows only in its WAL."""
    directory.mkdir()
    db = directory / "state.db"
    child = subprocess.Popen([sys.executable, "-c", _WRITER, str(db), json.dumps(TURN)], cwd=REPO, env=_env(),
                             text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
    pid = child.pid
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "committed"
    finally:
        os.kill(pid, signal.SIGKILL)
        child.wait()
        child.stdin.close()  # type: ignore[union-attr]
        child.stdout.close()  # type: ignore[union-attr]
    assert child.returncode == -signal.SIGKILL
    assert sorted(p.name for p in directory.iterdir()) == ["state.db", "state.db-shm", "state.db-wal"]
    # The main file alone holds none of it (read from a copy: the original stays untouched).
    alone = directory.parent / "main-file-only.db"
    shutil.copyfile(db, alone)
    with closing(sqlite3.connect(alone)) as conn:
        assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'messages'").fetchone()[0] == 0
    alone.unlink()
    return db


def _fingerprint(directory: Path) -> dict[str, str]:
    """Every file next to the database, by name, with the sha256 of its bytes."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def _data(db: Path) -> tuple[list[str], dict[str, str]]:
    """The names next to `db`, and the bytes of the files that hold data (all but the -shm)."""
    files = _fingerprint(db.parent)
    return sorted(files), {name: digest for name, digest in files.items() if not name.endswith("-shm")}


def _supervisor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", *args], cwd=REPO, env=_env(), text=True,
                          capture_output=True, timeout=120, stdin=subprocess.DEVNULL)


# Each reader returns how many message rows it saw, having checked what it could of them.
def _contents(contents: list[Any]) -> int:
    assert contents == CONTENTS
    return len(contents)


def _via_open_snapshot(db: Path) -> int:
    conn = open_snapshot(db)
    try:
        return _contents([r[0] for r in conn.execute("SELECT content FROM messages ORDER BY id")])
    finally:
        conn.close()


def _via_session_db(**mode: bool) -> Callable[[Path], int]:
    def read(db: Path) -> int:
        with SessionDB(db, **mode) as handle:
            return _contents([m["content"] for m in handle.get_messages("s", include_inactive=True)])
    return read


def _via_connect_readonly(db: Path) -> int:
    conn = connect_readonly(db)
    try:
        return _contents([r[0] for r in conn.execute("SELECT content FROM messages ORDER BY id")])
    finally:
        conn.close()


def _via_is_upstream(db: Path) -> int:
    assert upstream_schema.is_upstream(db) is False  # it had to read the schema, only in the WAL
    return _via_open_snapshot(db)


def _via_snapshot_rows(db: Path) -> int:
    rows = snapshot_rows(db)
    assert [r["role"] for r in rows.values()] == ["user", "assistant", "tool", "assistant"]
    return len(rows)


def _via_load_durable(db: Path) -> int:
    durable = load_durable(db)
    assert durable.error is None and not durable.missing, durable.error
    assert [t["state"] for t in durable.turns] == ["done"]
    return _contents([r["content"] for r in durable.rows])


def _via_check_verb(db: Path) -> int:
    done = _supervisor("check", "--db", str(db), "--json")
    # Exit 0: a judged, valid database. Had its rows gone unseen (even the schema is only
    # in the WAL), nothing could be judged: verdict "unknown", exit 1.
    assert done.returncode == 0, (done.stdout, done.stderr)
    verdict = json.loads(done.stdout)
    assert verdict["valid"] is True
    return next(n for name, n in verdict["counts"].items() if name.endswith("rows_checked"))


# Readers of evidence: they leave every byte and name next to the database as it was.
READERS = {
    "open_snapshot": _via_open_snapshot,
    "SessionDB(snapshot=True)": _via_session_db(snapshot=True),
    "upstream_schema.is_upstream": _via_is_upstream,
    "history.snapshot_rows": _via_snapshot_rows,
    "checker.load_durable": _via_load_durable,
    "supervisor check --db": _via_check_verb,
}


@pytest.mark.parametrize("reader", list(READERS))
def test_a_killed_writers_database_is_read_without_a_byte_changed(tmp_path: Path, reader: str) -> None:
    db = _killed_writer_db(tmp_path / "data")
    before = _fingerprint(db.parent)
    assert READERS[reader](db) == len(CONTENTS)
    # Same names, same bytes: no recovery, no checkpoint, no sidecar created.
    assert _fingerprint(db.parent) == before, f"{reader} changed the files next to the database"


@pytest.mark.parametrize("reader", [*READERS, "SessionDB(readonly=True)"])
def test_a_wal_without_its_index_is_read_from_a_copy(tmp_path: Path, reader: str) -> None:
    """No -shm (the index lost, or the files copied without it): reading needs WAL recovery,
    which is done on a private copy; no -shm appears next to the original. A live reader
    (readonly=True) cannot open such a WAL without indexing it, so it reads a copy too."""
    db = _killed_writer_db(tmp_path / "data")
    (db.parent / "state.db-shm").unlink()
    before = _fingerprint(db.parent)
    assert READERS.get(reader, _via_session_db(readonly=True))(db) == len(CONTENTS)
    assert _fingerprint(db.parent) == before


@pytest.mark.parametrize("reader", ["connect_readonly", "SessionDB(readonly=True)"])
def test_a_live_reader_of_a_killed_writers_database_changes_no_data(tmp_path: Path, reader: str) -> None:
    """A live read-only connection may rebuild the -shm index (SQLite's, of the WAL), but
    never writes the database or the WAL: no recovery into them, no checkpoint, no delete."""
    db = _killed_writer_db(tmp_path / "data")
    read = _via_connect_readonly if reader == "connect_readonly" else _via_session_db(readonly=True)
    before = _data(db)
    assert read(db) == len(CONTENTS)
    assert _data(db) == before


def test_connect_readonly_refuses_a_wal_it_could_only_read_by_recovering_it(tmp_path: Path) -> None:
    db = _killed_writer_db(tmp_path / "data")
    (db.parent / "state.db-shm").unlink()
    before = _fingerprint(db.parent)
    with pytest.raises(LiveReadUnavailable, match="open_snapshot"):
        connect_readonly(db)
    assert _fingerprint(db.parent) == before


@pytest.mark.parametrize("reader", list(READERS))
def test_a_cleanly_closed_database_gets_no_wal_or_shm(tmp_path: Path, reader: str) -> None:
    """With no writer left, a read-only open of a WAL database would create an empty -wal
    and -shm next to it; these readers create nothing."""
    directory = tmp_path / "data"
    directory.mkdir()
    with SessionDB(directory / "state.db") as writer:
        writer.create_session("s", source="test")
        writer.write_pending("s", TURN, start_turn="t1")
        writer.finish_turn("t1", "done")
    assert [p.name for p in directory.iterdir()] == ["state.db"]
    before = _fingerprint(directory)
    assert READERS[reader](directory / "state.db") == len(CONTENTS)
    assert _fingerprint(directory) == before, f"{reader} changed the files next to the database"


def test_connect_readonly_is_never_a_writer(tmp_path: Path) -> None:
    db = _killed_writer_db(tmp_path / "data")
    before = _data(db)
    conn = connect_readonly(db)
    try:
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            conn.execute("INSERT INTO sessions (id, created_at) VALUES ('x', 0)")
    finally:
        conn.close()  # the last connection: a writer would checkpoint and delete the WAL here
    assert _data(db) == before


def test_a_live_reader_leaves_a_writer_of_the_same_process_able_to_write(tmp_path: Path) -> None:
    """SQLite shares one -shm mapping among a process's connections to a file: a reader
    that mapped it read-only first would make a later writer there fail ("readonly")."""
    db = _killed_writer_db(tmp_path / "data")
    live = connect_readonly(db)
    try:
        with SessionDB(db) as writer:
            writer.create_session("after")
        assert live.execute("SELECT count(*) FROM sessions WHERE id = 'after'").fetchone()[0] == 1
    finally:
        live.close()


def test_connect_readonly_follows_a_running_writer(db_path: Path) -> None:
    with SessionDB(db_path) as writer:
        writer.create_session("a")
        live = connect_readonly(db_path)
        frozen = open_snapshot(db_path)
        try:
            writer.create_session("b")
            assert [r[0] for r in live.execute("SELECT id FROM sessions ORDER BY id")] == ["a", "b"]
            assert [r[0] for r in frozen.execute("SELECT id FROM sessions ORDER BY id")] == ["a"]
        finally:
            live.close()
            frozen.close()


def test_connect_readonly_copes_with_a_wal_deleted_while_it_looks(db_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer closing its last connection deletes its WAL at any instant, e.g. between a
    reader's look at the WAL's existence and at its size: that is an absent WAL, not an error."""
    with SessionDB(db_path) as writer:
        writer.create_session("a")
    real_stat = os.stat

    def wal_just_deleted(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        if str(path).endswith("-wal"):
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real_stat(path, *args, **kwargs)

    # The WAL is seen to exist, then gone when its size is asked for.
    monkeypatch.setattr(Path, "exists", lambda self: str(self).endswith("-wal") or os.path.exists(self))
    monkeypatch.setattr(os, "stat", wal_just_deleted)
    live = connect_readonly(db_path)
    try:
        assert [r[0] for r in live.execute("SELECT id FROM sessions")] == ["a"]
    finally:
        live.close()


def test_snapshot_readers_refuse_writes(tmp_path: Path) -> None:
    db = _killed_writer_db(tmp_path / "data")
    conn = open_snapshot(db)
    try:
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            conn.execute("DELETE FROM messages")
    finally:
        conn.close()
    with SessionDB(db, snapshot=True) as handle:
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            handle.create_session("x")
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            handle.write_pending("s", [{"role": "user", "content": "x"}])


def test_a_snapshot_keeps_this_processs_own_locks(db_path: Path) -> None:
    """Copying the file must not drop the POSIX locks this process's connections hold on it
    (closing any descriptor of a file drops them all). While our writer is open, another
    process closing its connection is not the last one, so it leaves the WAL in place."""
    with SessionDB(db_path) as writer:
        writer.create_session("a")
        open_snapshot(db_path).close()
        closer = "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('SELECT 1 FROM sessions'); c.close()"
        subprocess.run([sys.executable, "-c", closer, str(db_path)], check=True, timeout=60)
        assert (db_path.parent / (db_path.name + "-wal")).exists()
        assert [s["id"] for s in writer.list_sessions()] == ["a"]


def test_open_snapshot_works_in_a_private_directory_and_removes_it(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    db = _killed_writer_db(tmp_path / "data")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(scratch))
    modes: list[int] = []
    copy = snapshot._copy_into

    def recording(sources: list[Path], directory: Path) -> str | None:
        modes.append(stat.S_IMODE(directory.stat().st_mode))
        assert sorted(p.name for p in sources) == ["state.db", "state.db-wal"]  # never the -shm
        return copy(sources, directory)

    monkeypatch.setattr(snapshot, "_copy_into", recording)
    open_snapshot(db).close()
    assert modes == [0o700]
    assert list(scratch.iterdir()) == []


def test_open_snapshot_gives_up_on_a_file_that_keeps_changing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = _killed_writer_db(tmp_path / "data")
    wal = db.parent / "state.db-wal"
    copy = snapshot._copy_into
    attempts: list[int] = []

    def busy_writer(sources: list[Path], directory: Path) -> str | None:
        attempts.append(1)
        result = copy(sources, directory)
        with open(wal, "ab") as fh:  # a writer appending frames during the copy
            fh.write(b"\0")
        return result

    monkeypatch.setattr(snapshot, "_copy_into", busy_writer)
    with pytest.raises(ReadOnlyOpenError, match="kept changing"):
        open_snapshot(db)
    assert len(attempts) == snapshot._SNAPSHOT_ATTEMPTS


def test_open_snapshot_retries_until_a_copy_is_consistent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = _killed_writer_db(tmp_path / "data")
    copy = snapshot._copy_into
    attempts: list[int] = []

    def changed_once(sources: list[Path], directory: Path) -> str | None:
        attempts.append(1)
        result = copy(sources, directory)
        if len(attempts) == 1:
            os.utime(db, ns=(0, 0))  # the main file changed under the first copy
        return result

    monkeypatch.setattr(snapshot, "_copy_into", changed_once)
    assert _via_open_snapshot(db) == len(CONTENTS)
    assert len(attempts) == 2


OPENERS: dict[str, Callable[[Path], Any]] = {
    "open_snapshot": open_snapshot,
    "connect_readonly": connect_readonly,
    "SessionDB(readonly=True)": lambda p: SessionDB(p, readonly=True),
    "SessionDB(snapshot=True)": lambda p: SessionDB(p, snapshot=True),
}


@pytest.mark.parametrize("opener", list(OPENERS))
def test_a_missing_database_is_a_clear_error_and_nothing_is_created(tmp_path: Path, opener: str) -> None:
    missing = tmp_path / "state.db"
    with pytest.raises(StorageError, match="does not exist"):
        OPENERS[opener](missing)
    assert list(tmp_path.iterdir()) == []


def test_missing_database_through_the_supervisor_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "state.db"
    assert snapshot_rows(missing) == {}
    assert load_durable(missing).missing
    assert upstream_schema.is_upstream(missing) is False
    with pytest.raises(sqlite3.DatabaseError, match="does not exist"):
        upstream_schema.read(missing)
    done = _supervisor("check", "--db", str(missing))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not exist" in lines[0] and str(missing) in lines[0], done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("opener", list(OPENERS))
def test_a_directory_or_a_non_database_is_refused_untouched(tmp_path: Path, opener: str) -> None:
    with pytest.raises(StorageError, match="is a directory"):
        OPENERS[opener](tmp_path)
    junk = tmp_path / "notes.txt"
    junk.write_bytes(b"this is not a database\n" * 200)
    before = _fingerprint(tmp_path)
    with pytest.raises(StorageError, match="not a usable SQLite database"):
        OPENERS[opener](junk)
    assert _fingerprint(tmp_path) == before
