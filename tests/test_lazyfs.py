"""The lazy file system keeps what was never fsynced, and a power cut loses exactly that: file
writes not fsynced, and directory entry changes (create, rename, unlink) whose directory was
not fsynced.

Each test mounts `supervisor.chaos.nemesis.lazyfs` over a fresh backing directory (a server
process of its own), works through the mount, cuts the power over the control socket, and
reads the backing directory as the next boot would see it. SQLite runs in child processes
killed by their recorded pid with SIGKILL before the cut, as the chaos harness kills workers.
Without FUSE (no /dev/fuse, no fusermount3, no libfuse 3, no mfusepy) the tests are skipped
with the reason, except in CI (CI=true), where they fail: there that is a broken machine.
"""
from __future__ import annotations

import contextlib
import errno
import os
import select
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from fuseutil import lazy_mount, require_fuse

from hermes.extras import install_line
from hermes.private_files import fsync_dir
from supervisor.chaos.nemesis import lazyfs
from supervisor.chaos.nemesis.lazyfs import LazyFS, LazyFSError, LazyFSServers, is_mounted, why_unavailable
from supervisor.chaos.nemesis.lazyfs_state import Write, power_cut
from supervisor.chaos.nemesis.powerloss import PowerLossUnavailable, check_available

pytestmark = [pytest.mark.chaos, pytest.mark.xdist_group("chaos")]

CHILD_TIMEOUT_S = 60.0
REPO = Path(__file__).resolve().parents[1]


class Mount:
    """One lazy file system for a test, and every process the test starts on it."""

    def __init__(self, root: Path) -> None:
        self.backing, self.mnt, self.fs = lazy_mount(root)
        self.children: list[subprocess.Popen[bytes]] = []

    def durable(self, name: str, content: bytes) -> Path:
        """A file whose content and directory entry are both synced."""
        path = self.mnt / name
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, content)
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(path.parent)
        return path

    def spawn(self, script: str, *args: str) -> subprocess.Popen[bytes]:
        child = subprocess.Popen([sys.executable, "-c", script, *args], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, bufsize=0)
        self.children.append(child)
        return child

    def kill(self, child: subprocess.Popen[bytes]) -> None:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()



def pwrite(path: Path, data: bytes, offset: int, sync: str = "") -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, offset)
        if sync == "fsync":
            os.fsync(fd)
        elif sync == "fdatasync":
            os.fdatasync(fd)
    finally:
        os.close(fd)


def read_line(child: subprocess.Popen[bytes]) -> str:
    """The child's next line, waited for at most CHILD_TIMEOUT_S (read a byte at a time, so
    that nothing waits in a buffer while select() watches the pipe)."""
    assert child.stdout is not None
    fd, line = child.stdout.fileno(), b""
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    while not line.endswith(b"\n"):
        if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            raise AssertionError(f"child {child.pid} said nothing in {CHILD_TIMEOUT_S}s")
        byte = os.read(fd, 1)
        if not byte:
            raise AssertionError(f"child {child.pid} ended (exit {child.wait()}) before a line")
        line += byte
    return line.decode().strip()


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[Mount]:
    require_fuse()
    mounted = Mount(tmp_path)
    try:
        yield mounted
    finally:
        for child in mounted.children:
            if child.poll() is None:
                mounted.kill(child)
        mounted.fs.close()
    assert not mounted.fs.running and not is_mounted(mounted.mnt)


# -- (a) what fsync makes durable, and what it does not ----------------------------------------

def test_a_unsynced_writes_are_read_back_but_lost_by_a_drop_while_fsynced_ones_stay(mount: Mount) -> None:
    lost = mount.durable("lost", b"old-content")
    kept = mount.durable("kept", b"old")
    data_kept = mount.durable("data-kept", b"old")
    pwrite(lost, b"NEW", 0)
    pwrite(lost, b"!", 20)  # past the end: the gap reads as zeros
    pwrite(kept, b"NEW", 0, sync="fsync")
    pwrite(data_kept, b"NEW", 0, sync="fdatasync")

    assert lost.read_bytes() == b"NEW-content" + bytes(9) + b"!"
    assert lost.stat().st_size == 21
    assert (mount.backing / "lost").read_bytes() == b"old-content"  # closed, never synced
    status = mount.fs.status()
    assert status["files"] == [{"path": "/lost", "writes": 2, "size": 21, "ranges": [[0, 3], [20, 21]],
                                "truncates": []}]
    assert status["unsynced_entries"] == []

    report = mount.fs.crash("drop", seed=0)

    assert report["dropped_writes"] == 2
    assert [(f["path"], f["dropped_ranges"]) for f in report["files"]] == [("/lost", [[0, 3], [20, 21]])]
    assert (mount.backing / "lost").read_bytes() == b"old-content"
    assert (mount.backing / "kept").read_bytes() == b"NEW"
    assert (mount.backing / "data-kept").read_bytes() == b"NEW"
    for touch in (lambda: (mount.mnt / "kept").stat(), lambda: os.listdir(mount.mnt),
                  lambda: (mount.mnt / "kept").read_bytes()):
        with pytest.raises(OSError) as failed:
            touch()
        assert failed.value.errno == errno.EIO


def test_a_truncation_is_lazy_too_and_a_bad_request_leaves_the_mount_working(mount: Mount) -> None:
    shrunk = mount.durable("shrunk", b"0123456789")
    emptied = mount.durable("emptied", b"0123456789")
    os.truncate(shrunk, 4)
    with open(emptied, "wb") as handle:  # open(O_TRUNC), then a write
        handle.write(b"ab")
    assert shrunk.read_bytes() == b"0123" and emptied.read_bytes() == b"ab"
    assert [f["truncates"] for f in mount.fs.status()["files"]] == [[0], [4]]
    with pytest.raises(LazyFSError, match="unknown crash mode"):
        mount.fs.crash("sideways", seed=0)
    assert shrunk.read_bytes() == b"0123"

    mount.fs.crash("drop", seed=0)

    assert (mount.backing / "shrunk").read_bytes() == b"0123456789"
    assert (mount.backing / "emptied").read_bytes() == b"0123456789"


# -- (b) prefix and subset keep what they say ---------------------------------------------------

CHUNK = 64
ROUNDS = 8  # writes per file, two files written in turn: 16 writes in issue order


def _interleaved_writes(mount: Mount) -> list[tuple[str, int, bytes]]:
    for name in ("left", "right"):
        mount.durable(name, bytes(CHUNK * ROUNDS))
    issued = []
    for i in range(2 * ROUNDS):
        name, offset, data = ("left", "right")[i % 2], (i // 2) * CHUNK, bytes([i + 1]) * CHUNK
        pwrite(mount.mnt / name, data, offset)
        issued.append((name, offset, data))
    return issued


@pytest.mark.parametrize(("mode", "seed"), [("prefix", 5), ("subset", 7)])
def test_b_prefix_and_subset_keep_exactly_the_writes_they_report(mount: Mount, mode: str, seed: int) -> None:
    issued = _interleaved_writes(mount)

    report = mount.fs.crash(mode, seed=seed)

    kept_in_report = {(f["path"].lstrip("/"), start) for f in report["files"] for start, _ in f["kept_ranges"]}
    kept = [(name, offset) in kept_in_report for name, offset, _ in issued]
    for (name, offset, data), survived in zip(issued, kept):
        on_disk = (mount.backing / name).read_bytes()[offset:offset + CHUNK]
        assert on_disk == (data if survived else bytes(CHUNK)), (name, offset, survived)
    assert report["dropped_writes"] == kept.count(False)
    assert 0 < kept.count(True) < len(kept)  # these seeds cut somewhere in the middle
    # The same seed over the same logs picks the same writes (the harness can replay a cut).
    logs = {f"/{name}": [Write(i + 1, offset, data) for i, (n, offset, data) in enumerate(issued) if n == name]
            for name in ("left", "right")}
    model = power_cut(mode, seed, logs)
    assert {(path.lstrip("/"), op.offset) for path, ops in model.keep.items() for op in ops} == kept_in_report
    if mode == "prefix":
        assert kept == sorted(kept, reverse=True)  # all kept ones come first, in issue order
    else:
        assert kept != sorted(kept, reverse=True)  # a later write survived an earlier lost one


def test_b_the_cut_is_a_function_of_the_seed() -> None:
    logs = {"/f": [Write(i, i * 100, b"x" * 100) for i in range(1, 41)]}
    for mode in ("prefix", "subset", "torn"):
        assert power_cut(mode, 11, logs) == power_cut(mode, 11, logs)
        assert len({repr(power_cut(mode, seed, logs)) for seed in range(20)}) > 1
    assert power_cut("drop", 11, logs).keep == {"/f": []}


# -- (c) a torn write ---------------------------------------------------------------------------

def test_c_a_torn_write_keeps_whole_sectors_before_one_boundary_and_what_was_issued_before(mount: Mount) -> None:
    before = mount.durable("before", b"old")
    torn = mount.durable("torn", b"o" * 2048)
    after = mount.durable("after", b"old")
    pwrite(before, b"NEW", 0)             # crosses no sector boundary: cannot be torn
    pwrite(torn, b"n" * 1500, 100)        # crosses 512, 1024 and 1536
    pwrite(after, b"NEW", 0)

    report = mount.fs.crash("torn", seed=4)

    start, boundary = report["torn"]["kept"]
    assert report["torn"]["path"] == "/torn" and start == 100
    assert boundary in (512, 1024, 1536)
    content = (mount.backing / "torn").read_bytes()
    assert content == b"o" * 100 + b"n" * (boundary - 100) + b"o" * (2048 - boundary)
    assert (mount.backing / "before").read_bytes() == b"NEW"
    assert (mount.backing / "after").read_bytes() == b"old"
    torn_line = next(f for f in report["files"] if f["path"] == "/torn")
    assert torn_line["kept_ranges"] == [[100, boundary]] and torn_line["dropped_ranges"] == [[boundary, 1600]]


# -- (d) directory entries ----------------------------------------------------------------------

def test_d_a_created_file_disappears_unless_its_directory_was_fsynced(mount: Mount) -> None:
    named = mount.mnt / "named"
    named.write_bytes(b"never fsynced")
    fsync_dir(mount.mnt)  # its name, not its data
    unnamed = mount.mnt / "unnamed"
    unnamed.write_bytes(b"fsynced")
    fd = os.open(unnamed, os.O_RDWR)
    os.fsync(fd)  # its data, not its name
    os.close(fd)
    assert oct((mount.backing / "unnamed").stat().st_mode & 0o777) == "0o600"
    assert mount.fs.status()["unsynced_entries"] == ["/unnamed"]

    report = mount.fs.crash("drop", seed=0)

    assert report["removed_entries"] == ["/unnamed"]
    assert os.listdir(mount.backing) == ["named"]
    assert (mount.backing / "named").read_bytes() == b""  # the name survived, its data did not


def test_d_created_entries_are_lost_with_their_directory(mount: Mount) -> None:
    (mount.mnt / "sub").mkdir()
    mount.durable("sub/inner", b"synced inside an unsynced directory")
    (mount.mnt / "orphan").write_bytes(b"x")
    assert oct((mount.backing / "sub").stat().st_mode & 0o777) == "0o700"

    report = mount.fs.crash("drop", seed=0)

    assert report["removed_entries"] == ["/orphan", "/sub"]
    assert os.listdir(mount.backing) == []


def _fsynced_file(path: Path, content: bytes) -> None:
    """Create (or truncate) `path` and fsync its bytes, not its name."""
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, content)
        os.fsync(fd)
    finally:
        os.close(fd)


@pytest.mark.parametrize("dir_synced", [False, True], ids=["no-dir-fsync", "dir-fsync"])
def test_d_a_rename_over_a_file_is_undone_by_a_cut_unless_its_directory_was_fsynced(
        mount: Mount, dir_synced: bool) -> None:
    target = mount.durable("target", b"old content")
    _fsynced_file(mount.mnt / "target.tmp", b"new content")  # the file's fsync: its bytes, not a name
    os.rename(mount.mnt / "target.tmp", target)
    if dir_synced:
        fsync_dir(mount.mnt)
    assert target.read_bytes() == b"new content" and os.listdir(mount.mnt) == ["target"]
    assert mount.fs.status()["unsynced_entries"] == ([] if dir_synced else ["/target", "/target.tmp"])

    report = mount.fs.crash("drop", seed=0)

    assert os.listdir(mount.backing) == ["target"]
    if dir_synced:
        assert (mount.backing / "target").read_bytes() == b"new content"
        assert report["undone_renames"] == [] and report["removed_entries"] == []
    else:  # the replaced file is back, with its old content; the temp file's name went too
        assert (mount.backing / "target").read_bytes() == b"old content"
        assert report["undone_renames"] == [["/target.tmp", "/target"]]
        assert report["removed_entries"] == ["/target.tmp"]


@pytest.mark.parametrize("dir_synced", [False, True], ids=["no-dir-fsync", "dir-fsync"])
def test_d_an_unlinked_file_comes_back_after_a_cut_unless_its_directory_was_fsynced(
        mount: Mount, dir_synced: bool) -> None:
    (mount.mnt / "sub").mkdir()
    fsync_dir(mount.mnt)
    mount.durable("sub/doomed", b"durable bytes")
    pwrite(mount.mnt / "sub" / "doomed", b"UNSYNCED", 0)
    os.unlink(mount.mnt / "sub" / "doomed")
    os.rmdir(mount.mnt / "sub")
    if dir_synced:
        fsync_dir(mount.mnt)  # the rmdir's directory, not the unlink's (that one is gone)
    assert os.listdir(mount.mnt) == []
    assert ".lazyfs-grave" not in os.listdir(mount.mnt)  # what was removed waits out of sight

    report = mount.fs.crash("drop", seed=0)

    # The unsynced write went with the file, or came back with it (and was dropped, as ever with `drop`).
    assert [(f["entry_removed"], f["dropped_writes"]) for f in report["files"]] == [(dir_synced, 1)]
    if dir_synced:  # the rmdir is durable; the unlink inside cannot be undone without its directory
        assert os.listdir(mount.backing) == []
        assert report["restored_entries"] == []
    else:
        assert os.listdir(mount.backing) == ["sub"] and os.listdir(mount.backing / "sub") == ["doomed"]
        assert (mount.backing / "sub" / "doomed").read_bytes() == b"durable bytes"  # its write was lost too
        assert report["restored_entries"] == ["/sub", "/sub/doomed"]


def test_d_a_rename_carries_pending_writes_and_a_clean_unmount_makes_every_change_durable(mount: Mount) -> None:
    moved = mount.durable("moved", b"old")
    mount.durable("doomed", b"old")
    pwrite(moved, b"NEW", 0)
    os.rename(moved, mount.mnt / "renamed")
    os.unlink(mount.mnt / "doomed")
    (mount.mnt / "made").write_bytes(b"made")
    assert (mount.mnt / "renamed").read_bytes() == b"NEW"
    assert [f["path"] for f in mount.fs.status()["files"]] == ["/made", "/renamed"]

    mount.fs.unmount()

    assert sorted(os.listdir(mount.backing)) == ["made", "renamed"]  # no grave left either
    assert (mount.backing / "renamed").read_bytes() == b"NEW"


def test_d_a_file_that_cannot_be_written_back_costs_the_others_nothing_at_unmount(mount: Mount) -> None:
    first = mount.durable("first", b"old")
    second = mount.durable("second", b"old")
    pwrite(first, b"NEW", 0)
    pwrite(second, b"NEW", 0)
    (mount.backing / "first").unlink()  # behind the mount's back: its pending writes have nowhere to go

    mount.fs.unmount()

    assert (mount.backing / "second").read_bytes() == b"NEW"


def _name_changes_and_writes(mount: Mount) -> None:
    """Five entry changes and three writes, interleaved, none of them synced."""
    for name in ("a", "b", "c"):
        mount.durable(name, name.encode() * 4)
    pwrite(mount.mnt / "a", b"A1", 0)                 # write
    os.rename(mount.mnt / "a", mount.mnt / "a2")      # rename
    (mount.mnt / "new").write_bytes(b"")              # create
    os.unlink(mount.mnt / "b")                        # unlink
    pwrite(mount.mnt / "c", b"C1", 0)                 # write
    os.rename(mount.mnt / "c", mount.mnt / "a2")      # rename over a2
    (mount.mnt / "dir").mkdir()                       # mkdir
    pwrite(mount.mnt / "a2", b"C2", 2)                # write


def _expected_tree(kept: list[bool]) -> dict[str, bytes | None]:
    """What a cut keeping `kept` (per op above, in issue order) leaves, as the model says it."""
    w1, r1, cr, ul, w2, r2, mk, w3 = kept
    tree: dict[str, bytes | None] = {"a": b"A1aa" if w1 else b"aaaa", "b": b"bbbb",
                                     "c": (b"C1cc" if w2 else b"cccc")}
    if r1:
        tree["a2"] = tree.pop("a")
    if cr:
        tree["new"] = b""
    if ul:
        del tree["b"]
    if r2:
        tree["a2"] = tree.pop("c")
    if w3:  # written to the file that was c, wherever it is now
        name = "a2" if r2 else "c"
        tree[name] = tree[name][:2] + b"C2"  # type: ignore[index]
    if mk:
        tree["dir"] = None
    return tree


@pytest.mark.parametrize("mode", ["drop", "prefix", "subset", "torn"])
def test_d_entry_changes_are_kept_dropped_and_reordered_like_writes(mount: Mount, mode: str) -> None:
    ops = 8
    # A seed whose cut is neither all nor nothing (found through the model, the same on any machine).
    seed = next(s for s in range(100) if mode in ("drop", "torn")
                or 0 < len(power_cut(mode, s, {}, list(range(1, ops + 1))).names) < ops)
    _name_changes_and_writes(mount)
    status = mount.fs.status()
    assert [c["op"] for c in status["unsynced_changes"]] == ["rename", "create", "unlink", "rename", "mkdir"]

    report = mount.fs.crash(mode, seed=seed)

    # At the cut, the file that was c is /a2 (writes C1, C2), and the one that was a waits in the grave (A1).
    kept_ranges = {f["path"]: f["kept_ranges"] for f in report["files"]}
    (buried,) = [path for path in kept_ranges if path != "/a2"]
    w1, w2, w3 = bool(kept_ranges[buried]), [0, 2] in kept_ranges["/a2"], [2, 4] in kept_ranges["/a2"]
    kept = [change["kept"] for change in report["name_changes"]]
    flags = [w1, kept[0], kept[1], kept[2], w2, kept[3], kept[4], w3]
    if mode == "drop":
        assert flags == [False] * ops
    elif mode == "torn":  # no write crosses a sector boundary: torn keeps nothing, as drop
        assert report["torn"] is None and flags == [False] * ops
    elif mode == "prefix":
        assert flags == sorted(flags, reverse=True) and 0 < flags.count(True) < ops
    else:
        assert flags != sorted(flags, reverse=True)  # a later change kept, an earlier one dropped
    on_disk = {name: (None if (mount.backing / name).is_dir() else (mount.backing / name).read_bytes())
               for name in os.listdir(mount.backing)}
    assert on_disk == _expected_tree(flags), (mode, seed, flags)


# -- (e) SQLite ---------------------------------------------------------------------------------

WRITER = r"""
import sqlite3, sys
db, full, off = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
conn = sqlite3.connect(db, isolation_level=None, timeout=30)
conn.execute("PRAGMA journal_mode=WAL")
conn.execute("PRAGMA synchronous=FULL")
conn.execute("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, body TEXT)")
for i in range(full):
    conn.execute("INSERT INTO t(body) VALUES (?)", ("full-%d" % i,))
conn.execute("PRAGMA synchronous=OFF")
for i in range(off):
    conn.execute("INSERT INTO t(body) VALUES (?)", ("off-%d" % i,))
print("committed", flush=True)
conn.execute("BEGIN IMMEDIATE")  # holds the write lock until killed
print("holding", flush=True)
sys.stdin.readline()
"""


def _backing_rows(mount: Mount) -> tuple[list[str], str]:
    conn = sqlite3.connect(mount.backing / "app.db")
    try:
        rows = [body for (body,) in conn.execute("SELECT body FROM t ORDER BY id")]
        return rows, conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()


def test_e_sqlite_wal_works_across_processes_with_locks_and_the_shm_mapping(mount: Mount) -> None:
    db = mount.mnt / "app.db"
    writer = mount.spawn(WRITER, str(db), "5", "0")
    assert read_line(writer) == "committed" and read_line(writer) == "holding"
    reader = sqlite3.connect(db, isolation_level=None, timeout=0)
    try:
        assert reader.execute("SELECT count(*) FROM t").fetchone() == (5,)  # through the -shm index
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            reader.execute("BEGIN IMMEDIATE")  # the writer's fcntl lock, kept by the kernel
        with open("/proc/self/maps", encoding="utf-8") as maps:
            assert any(line.rstrip().endswith(f"{db}-shm") for line in maps)  # a shared mmap over FUSE
    finally:
        reader.close()
    mount.kill(writer)


@pytest.mark.parametrize("power_cut_after", [True, False], ids=["power-cut", "kill-9-only"])
def test_e_sqlite_full_commits_survive_a_power_cut_and_off_ones_do_not(mount: Mount, power_cut_after: bool) -> None:
    writer = mount.spawn(WRITER, str(mount.mnt / "app.db"), "20", "15")
    assert read_line(writer) == "committed"
    mount.kill(writer)  # its connection never closed: no checkpoint, no cleanup
    unsynced = {f["path"] for f in mount.fs.status()["files"]}
    assert "/app.db-wal" in unsynced  # the commits made with synchronous=OFF

    if power_cut_after:
        report = mount.fs.crash("drop", seed=0)
        assert report["dropped_writes"] > 0 and report["removed_entries"] == []
    mount.fs.unmount()

    rows, integrity = _backing_rows(mount)
    assert integrity == "ok"
    full = [f"full-{i}" for i in range(20)]
    off = [f"off-{i}" for i in range(15)]
    # kill -9 alone loses nothing SQLite wrote: the page cache outlives a process. Only the power cut
    # drops what synchronous=OFF never fsynced, and none of what FULL did.
    assert rows == (full if power_cut_after else full + off)


# -- (f) nothing is left behind -----------------------------------------------------------------

def test_f_close_kills_the_server_by_pid_and_detaches_a_busy_mount(tmp_path: Path) -> None:
    require_fuse()
    mounted = Mount(tmp_path)
    pid = mounted.fs.pid
    held = os.open(mounted.mnt / "held", os.O_CREAT | os.O_RDWR)
    mounted.fs.crash("drop", seed=0)
    with pytest.raises(LazyFSError, match="busy"):
        mounted.fs.unmount()  # a file is still open on it

    mounted.fs.close()

    assert not mounted.fs.running and not is_mounted(mounted.mnt)
    assert pid is not None and not Path(f"/proc/{pid}").exists()
    try:
        os.close(held)
    except OSError:
        pass  # its file system is gone


ORPHANING = r"""
import os, sys
from supervisor.chaos.nemesis.lazyfs import LazyFS
fs = LazyFS(sys.argv[1], sys.argv[2]).start()
open(os.path.join(sys.argv[2], "held"), "w").write("x")  # a mount in use, and a write pending
print(fs.pid, fs.server._private, flush=True)
os._exit(0)  # gone without a word: no close, no unmount, as at a second Ctrl-C or a SIGKILL
"""


def test_f_a_server_whose_supervisor_is_gone_detaches_its_mount_and_exits(tmp_path: Path) -> None:
    require_fuse()
    backing, mnt = tmp_path / "backing", tmp_path / "mnt"
    backing.mkdir()
    mnt.mkdir()
    supervisor = subprocess.run([sys.executable, "-c", ORPHANING, str(backing), str(mnt)], capture_output=True,
                                text=True, timeout=CHILD_TIMEOUT_S, cwd=REPO)
    assert supervisor.returncode == 0, supervisor.stderr
    pid, private = supervisor.stdout.split()
    server = _process(int(pid))
    if server is not None:
        server.wait(timeout=CHILD_TIMEOUT_S)  # an upper bound: its lifeline ended with its supervisor
    assert not is_mounted(mnt) and not Path(private).exists()


def test_f_kill_now_leaves_no_server_mount_or_directory(tmp_path: Path) -> None:
    require_fuse()
    servers = LazyFSServers()
    server = servers.acquire()
    backing, mnt = tmp_path / "backing", tmp_path / "mnt"
    backing.mkdir()
    mnt.mkdir()
    fs = LazyFS(backing, mnt, server=server).start()
    held = os.open(mnt / "held", os.O_CREAT | os.O_RDWR)  # busy: a plain unmount would fail
    private = server._private
    try:
        servers.kill_now()
        servers.kill_now()  # again, as a third signal would: nothing left to do, nothing fails
    finally:
        with contextlib.suppress(OSError):
            os.close(held)
        fs.close()
    assert server.pid is not None and not Path(f"/proc/{server.pid}").exists() or _zombie(server.pid)
    assert not is_mounted(mnt) and private is not None and not private.exists()


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def _zombie(pid: int | None) -> bool:
    proc = _process(pid) if pid is not None else None
    return proc is None or proc.status() == psutil.STATUS_ZOMBIE


# -- (g) what a machine without the lazy file system is told -----------------------------------

def _nothing_missing_but(monkeypatch: pytest.MonkeyPatch, lacking: str) -> None:
    """This machine, as if it had everything the lazy file system needs except `lacking`."""
    import ctypes.util
    import importlib.util
    import shutil

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(lazyfs.os, "access", lambda path, mode: lacking != "/dev/fuse")
    monkeypatch.setattr(shutil, "which", lambda name: None if lacking == name else f"/usr/bin/{name}")
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None if lacking == name else f"lib{name}.so")
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if lacking == name else real_find_spec(name, *a))


@pytest.mark.parametrize("where", ["checkout", "elsewhere"])
def test_g_a_missing_binding_is_named_with_a_line_that_installs_it_from_here(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, where: str) -> None:
    _nothing_missing_but(monkeypatch, "mfusepy")
    monkeypatch.chdir(REPO if where == "checkout" else tmp_path)

    with pytest.raises(PowerLossUnavailable) as refused:
        check_available(("power-loss",))

    message = str(refused.value)
    assert "the Python package mfusepy is not installed" in message, message
    assert "fuse3" not in message and "hermes-supervisor[powerloss]" not in message, message
    line = message.rpartition("install it: ")[2]
    assert line == install_line("powerloss"), message
    if Path(sys.prefix).resolve() == REPO / ".venv":  # run from the checkout's own environment
        command, extra = shlex.split(line)
        assert extra == "powerloss" and os.access(command, os.X_OK), line  # runnable from this directory
        assert Path(command).resolve() == REPO / "scripts" / "setup"
        assert where != "checkout" or line == "./scripts/setup powerloss"


@pytest.mark.parametrize(("lacking", "said", "remedy"), [
    ("/dev/fuse", "/dev/fuse is missing", "--device /dev/fuse --cap-add SYS_ADMIN"),
    ("fusermount3", "fusermount3 is not on PATH", "apt-get install fuse3"),
    ("fuse3", "the libfuse 3 library is not installed", "apt-get install fuse3")])
def test_g_a_missing_system_part_is_named_alone(monkeypatch: pytest.MonkeyPatch, lacking: str, said: str,
                                               remedy: str) -> None:
    _nothing_missing_but(monkeypatch, lacking)

    assert why_unavailable() == lazyfs.missing()[0]  # type: ignore[index]
    with pytest.raises(PowerLossUnavailable) as refused:
        check_available(("torn-write",))

    message = str(refused.value)
    assert said in message and remedy in message and "mfusepy" not in message, message
