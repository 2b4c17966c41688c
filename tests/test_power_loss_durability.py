"""What the runtime and the daemon treat as durable survives a power cut.

Each test mounts `supervisor.chaos.nemesis.lazyfs` over a fresh backing directory, does the real
operation through the real code on the mount, cuts the power (`crash("drop")`: every write not
fsynced, and every name created, renamed or removed since its directory was last fsynced, is
undone), mounts a new lazy file system over the same backing directory, and reads back what
survived. Without FUSE the tests are skipped with the reason, except in CI (CI=true), where
they fail (as in tests/test_lazyfs.py).
"""
from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fuseutil import lazy_mount, require_fuse

from hermes.executor import maybe_persist_tool_result
from hermes.private_files import create_private_file, make_private_dirs
from hermes.state import SessionDB
from hermes.tools import ToolContext, registry
from hermes.transcript import make_tool_result_message
from supervisor.chaos.nemesis.lazyfs import LazyFS, is_mounted
from supervisor.daemon.cancels import CancelRequests
from supervisor.daemon.http import load_token
from supervisor.daemon.inbox import read_status, write_status
from worker.ledger import Ledger
from worker.ledger_reader import read_executions

pytestmark = [pytest.mark.chaos, pytest.mark.xdist_group("chaos")]


class Mount:
    """A lazy file system over `backing`, and the power cut followed by the next boot's mount."""

    def __init__(self, root: Path) -> None:
        self.backing, self.mnt, self.fs = lazy_mount(root)

    def power_cut(self, *open_things: object) -> dict:
        """Cut the power, close what the code under test still holds, and mount again."""
        report = self.fs.crash("drop", seed=0)
        for thing in open_things:
            with contextlib.suppress(Exception):  # its file system is gone: EIO
                thing.close()  # type: ignore[attr-defined]
        self.fs.close()
        self.fs = LazyFS(self.backing, self.mnt).start()
        return report


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[Mount]:
    require_fuse()
    mounted = Mount(tmp_path)
    try:
        yield mounted
    finally:
        mounted.fs.close()
    assert not mounted.fs.running and not is_mounted(mounted.mnt)


# -- new files and directories: their names ---------------------------------------------------

def test_a_session_db_in_a_new_home_directory_keeps_its_commits(mount: Mount) -> None:
    home = make_private_dirs(mount.mnt / "home" / "sessions")  # the fix: each new directory's parent fsynced
    db = SessionDB(home / "state.db")
    db.create_session("s1")
    db.write_pending("s1", [{"role": "user", "content": "remember me"}])  # committed, FULL: fsynced

    mount.power_cut(db)

    with SessionDB(home / "state.db") as after:
        assert [m["content"] for m in after.get_messages("s1")] == ["remember me"]


def test_a_created_private_file_keeps_its_name(mount: Mount) -> None:
    # What SessionDB and the ledger create their database file with. (SQLite's first fsync of a
    # new -wal file also fsyncs the directory, which covers the database's name as well; a name
    # made here must not depend on that.)
    assert create_private_file(mount.mnt / "state.db")

    report = mount.power_cut()

    assert report["removed_entries"] == []
    assert (mount.mnt / "state.db").exists()


@pytest.mark.parametrize("spill_dir_exists", [False, True], ids=["new-spill-dir", "existing-spill-dir"])
def test_a_spilled_tool_result_survives_with_the_row_that_names_it(mount: Mount, spill_dir_exists: bool) -> None:
    db = SessionDB(mount.mnt / "state.db")
    db.create_session("s1")
    home = make_private_dirs(mount.mnt / "home")
    spill_dir = home / "tool_results" / "s1"  # as Turn.spill_dir lays it out
    if spill_dir_exists:  # an earlier spill of the session made it
        maybe_persist_tool_result(content="e" * 200, tool_name="t", tool_call_id="earlier",
                                  spill_dir=spill_dir, threshold=100)
    big = "x" * 150_000
    preview = maybe_persist_tool_result(content=big, tool_name="read_file", tool_call_id="call_1",
                                        spill_dir=spill_dir)
    db.write_pending("s1", [make_tool_result_message("read_file", preview, "call_1")])  # the row commits

    mount.power_cut(db)

    with SessionDB(mount.mnt / "state.db") as after:
        (row,) = after.get_messages("s1")
    saved = re.search(r"the full text is saved in (\S+)\]$", row["content"])
    assert saved is not None, row["content"][-200:]
    assert Path(saved.group(1)).read_text(encoding="utf-8") == big


def test_a_ledger_commit_survives(mount: Mount) -> None:
    ledger = Ledger(mount.mnt / "state.db.effects")
    ledger.record_execution(session_id="s1", turn_id="t1", tool_call_id="c1", tool="charge",
                            policy="at_most_once", idempotency_key="k1")

    mount.power_cut(ledger)

    after = read_executions(mount.mnt / "state.db.effects")
    assert [(e["tool_call_id"], e["idempotency_key"]) for e in after] == [("c1", "k1")]


# -- files replaced by a rename ---------------------------------------------------------------

def test_b_the_daemon_status_file_survives(mount: Mount) -> None:
    db_path = mount.mnt / "state.db"
    write_status(db_path, {"pid": 1, "turns": {"turn-1": {"spawns": 1}}})
    write_status(db_path, {"pid": 1, "turns": {"turn-1": {"spawns": 2}}})

    mount.power_cut()

    assert read_status(db_path) == {"pid": 1, "turns": {"turn-1": {"spawns": 2}}}


def test_b_the_daemon_api_token_survives(mount: Mount) -> None:
    db_path = mount.mnt / "state.db"
    token = load_token(db_path)

    mount.power_cut()

    assert load_token(db_path) == token  # read back, not made anew


def test_b_a_cancel_request_survives(mount: Mount) -> None:
    db_path = mount.mnt / "state.db"
    CancelRequests(db_path).add("turn-1", "s1")

    mount.power_cut()

    requests = CancelRequests(db_path)
    requests.load({"turn-1"})
    assert list(requests) == ["turn-1"]


def test_b_the_write_file_tool_result_survives(mount: Mount, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERMES_WORKSPACE", str(mount.mnt))
    (mount.mnt / "notes.txt").write_text("old")
    tool = registry.get("write_file")
    assert tool is not None
    result = json.loads(tool.handler({"path": "notes.txt", "content": "new"}, ToolContext(None, None)))
    assert result["bytes"] == 3

    mount.power_cut()

    assert (mount.mnt / "notes.txt").read_text() == "new"
