"""Storage faults: a write lock held past a worker's patience (`locked`) or for a moment
(`busy`), and storage that breaks while a worker is down (`disk`, `readonly`, `corrupt`).

``--faults locked``: at the first tool effect of a case, while the worker waits for its
acknowledgement, another connection takes the database's write lock and holds it a second past
that worker's busy budget, counted from its next write (`hold_write_lock`), so only its budget can
end its wait: its next flush must fail closed as `locked` (checker: fails-closed), and the case
must still end with the turn resumed and the transcript whole. ``--faults busy`` holds the same
lock for a quarter of that budget only: the worker must wait it out and go on.

A campaign run with ``--faults disk|readonly|corrupt`` adds one round to every case whose
worker gets killed: while no worker is running, the case's storage is broken; a worker is
started on it and must fail closed (exit 1, ``session_persistence_failed:<cause>``, nothing
shown, no tool run, no row written); the storage is mended; then the case goes on as
usual and the interrupted turn must still finish. Breaking storage between two processes is
what happens in real life (a disk fills, a volume is remounted read-only, a file gets
damaged while the service is down), and it is deterministic, where breaking it under a live
worker depends on what that worker happens to have cached.

How each fault is made, for real, on the case's own files:

* disk     -- the case directory is a small tmpfs mounted for the case. The fault checkpoints
  the WAL into the main file and truncates it (so the next write must grow a file), then
  fills the file system with a filler file; mending deletes the filler. Mounting needs root
  (CAP_SYS_ADMIN): without it the campaign refuses this fault up front and says so. Each
  mount is released with its case; a supervisor killed mid-case leaves its running cases'
  mounts behind, named ``hermes-chaos-case`` in /proc/mounts, for ``umount`` to clear.
* readonly -- the database file is made read-only: ``chattr +i`` as root (root ignores file
  modes), ``chmod 0400`` otherwise. SQLite then opens it read-only and the first write fails
  with SQLITE_READONLY.
* corrupt  -- after a checkpoint, b-tree root pages are overwritten in the main file (the
  originals are kept in memory), so the worker's first read of such a table fails with
  "database disk image is malformed"; mending writes the originals back. Two rounds: every
  table's roots but the schema page's (the worker fails reading its session), then the
  transcript's (`messages` and its indexes) alone, so that a resuming worker opens the file,
  takes its lease and reads its turn before it meets the damage, and must name that turn.

Each fault ends with a commit that touches only the header page (``user_version`` set to
itself), so every open connection, the supervisor's read-only observer included, drops its
page cache and sees the file as it now is.
"""
from __future__ import annotations

import errno
import os
import shutil
import sqlite3
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from supervisor.chaos.nemesis.family import EVERY_CASE, FaultUnavailable, Nemesis

if TYPE_CHECKING:
    from supervisor.procs.pool import WorkerProcess

STORAGE_FAULTS = ("disk", "readonly", "corrupt")
TMPFS_SIZE = "16m"  # plenty for any scenario's files; small enough to fill in milliseconds


def hold_write_lock(db: Path) -> Callable[[], None]:
    """Take the database's write lock now; the returned function releases it (a second call does nothing)."""
    holder = sqlite3.connect(db, isolation_level=None, timeout=5.0, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    lock = threading.Lock()
    held = [True]

    def release() -> None:
        with lock:
            if not held[0]:
                return
            held[0] = False
        holder.execute("ROLLBACK")
        holder.close()

    return release


class StorageFaultUnavailable(FaultUnavailable):
    """This machine cannot make the fault (no right to mount, no chattr, ...); says why."""


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)


def _touch_header(db: Path) -> None:
    """Commit a header-only change so every connection rereads the file (see the module doc)."""
    conn = sqlite3.connect(db, isolation_level=None, timeout=10.0)
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        conn.execute(f"PRAGMA user_version = {int(version)}")
    finally:
        conn.close()


def _checkpoint(db: Path) -> sqlite3.Connection:
    """Move every committed page into the main file and empty the WAL; returns the open connection."""
    conn = sqlite3.connect(db, isolation_level=None, timeout=10.0)
    busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    if busy:
        conn.close()
        raise RuntimeError(f"could not checkpoint {db}: a reader kept its snapshot open")
    return conn


class StorageFault:
    """One kind of storage fault for one case directory: prepare, break, mend, release."""

    cause = ""
    # Whether a resuming worker reads its interrupted turn before this fault stops it (and so
    # must name that turn in its outcome); a worker running a new turn knows its turn either way.
    reads_the_turn = False

    def __init__(self, case_dir: Path) -> None:
        self.case_dir = case_dir
        self.broken = False

    @classmethod
    def check_available(cls, scratch: Path) -> None:
        """Raise StorageFaultUnavailable if this machine cannot make the fault under `scratch`."""

    def prepare(self) -> None:
        """Before the case's first worker starts (the directory exists, empty)."""

    def break_storage(self, db: Path) -> str | None:
        """Break the storage of `db` (no worker is running); returns what was done, for the history,
        or None when `db` as it stands gives this fault nothing to break (it is left untouched)."""
        raise NotImplementedError

    def mend(self, db: Path) -> None:
        """Undo break_storage; the database is then exactly as it was before."""
        raise NotImplementedError

    def release(self) -> None:
        """After the case: undo whatever would outlive it. Safe to call twice, and after a failure."""
        if self.broken:
            try:
                self.mend(self.case_dir / "state.db")
            except Exception:  # noqa: BLE001  (releasing must go on: the mount must not outlive the case)
                pass


class FullFileSystem(StorageFault):
    cause = "disk"

    def __init__(self, case_dir: Path) -> None:
        super().__init__(case_dir)
        self.mounted = False
        self.filler = case_dir / ".filler"

    @classmethod
    def check_available(cls, scratch: Path) -> None:
        probe = Path(tempfile.mkdtemp(prefix="tmpfs-probe-", dir=scratch))
        try:
            done = _run("mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "hermes-probe", str(probe))
            if done.returncode != 0:
                raise StorageFaultUnavailable(
                    "--faults disk puts each case on a small tmpfs, and mounting one is not permitted here "
                    f"({' '.join((done.stderr or done.stdout).split()) or 'mount failed'}); run the campaign as root, "
                    "or leave `disk` out")
            _run("umount", str(probe))
        finally:
            shutil.rmtree(probe, ignore_errors=True)

    def prepare(self) -> None:
        done = _run("mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0700", "hermes-chaos-case",
                    str(self.case_dir))
        if done.returncode != 0:
            raise StorageFaultUnavailable(f"mount tmpfs on {self.case_dir}: {done.stderr.strip()}")
        self.mounted = True

    def break_storage(self, db: Path) -> str:
        _checkpoint(db).close()
        fd = os.open(self.filler, os.O_CREAT | os.O_WRONLY, 0o600)
        try:
            for chunk in (1 << 20, 4096, 1):  # unbuffered writes, down to the last free byte
                try:
                    while os.write(fd, b"\0" * chunk):
                        pass
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
        finally:
            os.close(fd)
        self.broken = True
        return f"filled the case's {TMPFS_SIZE} tmpfs ({os.statvfs(self.case_dir).f_bavail} blocks left)"

    def mend(self, db: Path) -> None:
        self.filler.unlink(missing_ok=True)
        self.broken = False

    def release(self) -> None:
        """Keep the case's files: copy them off the tmpfs, unmount it, put them back."""
        super().release()
        if not self.mounted:
            return
        self.mounted = False
        keep = Path(tempfile.mkdtemp(prefix="case-", dir=self.case_dir.parent))
        try:
            for item in self.case_dir.iterdir():
                shutil.move(str(item), keep / item.name)
            if _run("umount", str(self.case_dir)).returncode != 0:
                _run("umount", "-l", str(self.case_dir))  # busy: detached now, gone with its last file
            for item in keep.iterdir():
                shutil.move(str(item), self.case_dir / item.name)
        finally:
            shutil.rmtree(keep, ignore_errors=True)


class ReadOnlyFile(StorageFault):
    cause = "readonly"

    def __init__(self, case_dir: Path) -> None:
        super().__init__(case_dir)
        self.mode: int | None = None

    @staticmethod
    def _as_root() -> bool:
        return os.geteuid() == 0

    @classmethod
    def check_available(cls, scratch: Path) -> None:
        if not cls._as_root():
            return  # chmod binds everyone else
        if shutil.which("chattr") is None:
            raise StorageFaultUnavailable("--faults readonly needs `chattr` when run as root (root ignores file "
                                          "modes); install e2fsprogs, or leave `readonly` out")
        probe = scratch / ".chattr-probe"
        probe.write_bytes(b"")
        try:
            done = _run("chattr", "+i", str(probe))
            if done.returncode != 0:
                raise StorageFaultUnavailable(
                    f"--faults readonly: the file system under {scratch} has no immutable attribute "
                    f"({done.stderr.strip()}); use another --workdir, or leave `readonly` out")
            _run("chattr", "-i", str(probe))
        finally:
            probe.unlink(missing_ok=True)

    def break_storage(self, db: Path) -> str:
        self.broken = True
        if self._as_root():
            done = _run("chattr", "+i", str(db))
            if done.returncode != 0:
                self.broken = False
                raise RuntimeError(f"chattr +i {db}: {done.stderr.strip()}")
            return "chattr +i on the database file"
        self.mode = db.stat().st_mode & 0o777
        db.chmod(0o400)
        return "chmod 0400 on the database file"

    def mend(self, db: Path) -> None:
        if self._as_root():
            _run("chattr", "-i", str(db))
        elif self.mode is not None:
            db.chmod(self.mode)
        self.broken = False


class DamagedPages(StorageFault):
    cause = "corrupt"

    def __init__(self, case_dir: Path, table: str | None = None) -> None:
        super().__init__(case_dir)
        self.table = table  # damage only this table and its indexes (None: every table)
        self.reads_the_turn = table == "messages"  # sessions and turns read, the transcript not
        self.saved: dict[int, bytes] = {}
        self.page_size = 0

    def break_storage(self, db: Path) -> str | None:
        conn = _checkpoint(db)
        try:
            self.page_size = conn.execute("PRAGMA page_size").fetchone()[0]
            roots = [r for (r,) in conn.execute("SELECT rootpage FROM sqlite_master WHERE rootpage > 1 "
                                                "AND (? IS NULL OR tbl_name = ?)", (self.table, self.table))]
        finally:
            conn.close()
        if not roots:  # killed before its schema was committed: a file with no table to damage
            return None
        self.broken = True
        with open(db, "r+b") as fh:
            for page in roots:
                fh.seek((page - 1) * self.page_size)
                self.saved[page] = fh.read(self.page_size)
                fh.seek((page - 1) * self.page_size)
                fh.write(b"\xa5" * self.page_size)
            fh.flush()
            os.fsync(fh.fileno())
        _touch_header(db)
        return f"overwrote {len(roots)} b-tree root pages (all but the schema page)"

    def mend(self, db: Path) -> None:
        with open(db, "r+b") as fh:
            for page, data in self.saved.items():
                fh.seek((page - 1) * self.page_size)
                fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        self.saved.clear()
        self.broken = False
        _touch_header(db)


KINDS: dict[str, type[StorageFault]] = {"disk": FullFileSystem, "readonly": ReadOnlyFile, "corrupt": DamagedPages}


def rounds(name: str, case_dir: Path) -> list[StorageFault]:
    """The rounds of storage fault `name` in one case (the module docstring: `corrupt` has two)."""
    if name == "corrupt":
        return [DamagedPages(case_dir), DamagedPages(case_dir, table="messages")]
    return [KINDS[name](case_dir)]


def check_available(faults: tuple[str, ...] | list[str], scratch: Path) -> None:
    """Raise StorageFaultUnavailable for the first fault in `faults` this machine cannot make."""
    for name in faults:
        if name in KINDS:
            KINDS[name].check_available(scratch)


class LockedDatabase(Nemesis):
    """`locked`: another connection takes the database's write lock when the case's first tool
    effect is about to happen, and holds it MARGIN_S past the worker's busy budget, counted from
    the moment that worker begins its next write (its `flush.begin` probe; from the effect when it
    never gets there): only its budget can end its wait in time (checker.liveness.fails_closed),
    and a worker that goes on after that failure meets a free database, so what it does next shows
    (a worker resuming the turn meets the end of the lock too, and waits it out within its budget).

    `busy`: the same lock, held only BRIEF of the worker's busy budget from its next write: the
    worker must wait it out and go on with its turn (a busy retry that gives up early, or never
    retries, fails it: `_waited_out_the_lock`)."""

    FAULTS = ("locked", "busy")
    PLANNED = EVERY_CASE
    NEVER_REACHED = "the case reported no tool effect"
    WHY_NOT_ON = "it holds the SQLite file's write lock"
    MARGIN_S = 1.0
    BRIEF = 0.25
    GIVES_UP_AS = "session_persistence_failed:locked"  # the turn's failure when its worker stops waiting

    fired = False
    _holder: int | None = None  # the incarnation whose wait the lock is held against
    _release: Callable[[], None] | None = None
    _timer: threading.Timer | None = None
    _counted_from_write = False  # the hold now runs from the holder's next write, not from the effect

    @classmethod
    def check_available(cls, chosen: tuple[str, ...], faults: tuple[str, ...], workdir: Path) -> None:
        if len(chosen) > 1:
            raise FaultUnavailable("--faults locked and busy each hold the write lock at the first tool effect: "
                                   "run them in two campaigns")

    def _hold_s(self) -> float:
        budget = self.case.BUSY_BUDGET_S
        return budget * self.BRIEF if self.chosen == ("busy",) else budget + self.MARGIN_S

    def on_effect(self) -> None:
        if self.fired:
            return
        self.fired = True
        (fault,) = self.chosen
        waiting = self.case.reporting_worker()
        self._holder = waiting.incarnation if waiting is not None else None
        self._release = hold_write_lock(self.case.db)  # taken now, before the ack, so the worker meets it
        self._release_in(self._hold_s())
        self.case.history.record("storage_fault", fault=fault, incarnation=self._holder, seconds=self._hold_s(),
                                 budget=self.case.BUSY_BUDGET_S, gives_up_as=self.GIVES_UP_AS,
                                 expect=self.GIVES_UP_AS if fault == "locked" else "waits")
        self.case.account(fault, landed=True)

    def on_probe(self, proc: WorkerProcess, name: str) -> None:
        if name == "flush.begin" and proc.incarnation == self._holder and not self._counted_from_write \
                and self._release is not None:
            self._counted_from_write = True
            self._release_in(self._hold_s())

    def _release_in(self, seconds: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        assert self._release is not None
        self._timer = threading.Timer(seconds, self._release)
        self._timer.daemon = True
        self._timer.start()

    def teardown(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._release is not None:
            self._release()


class BrokenStorage(Nemesis):
    """`disk`, `readonly`, `corrupt`: one round each, after the first kill that leaves a turn to finish."""

    FAULTS = STORAGE_FAULTS
    NEVER_REACHED = "no killed worker left its turn unfinished"
    WHY_NOT_ON = "it breaks the case's SQLite file (a full tmpfs, a read-only file, damaged pages)"

    def __init__(self, case: Any, chosen: tuple[str, ...], resource: Any = None) -> None:
        super().__init__(case, chosen, resource)
        self.faults = [fault for name in chosen for fault in rounds(name, case.dir)]
        self.done = False

    @classmethod
    def check_available(cls, chosen: tuple[str, ...], faults: tuple[str, ...], workdir: Path) -> None:
        check_available(chosen, workdir)

    def setup(self) -> None:
        for fault in self.faults:
            fault.prepare()

    def teardown(self) -> None:
        for fault in self.faults:
            fault.release()

    def after_kill(self, turn_index: int, state: str | None) -> str | None:
        """With the worker down: per storage fault, break the storage, start a worker that must
        fail closed on it (checker: fails-closed), then mend the storage exactly as it was. First
        of the recovery rounds, while the killed worker's state is as it left it."""
        if state in ("done", "failed") or self.done:
            return state
        self.done = True
        case, command = self.case, "resume" if state == "running" else "run"
        for fault in self.faults:
            if not case.db.exists():
                case.account(fault.cause, landed=False, reason="the killed worker had not created the database yet")
                continue
            # Our own observer connection must not be open across the break: a worker that finds
            # itself the file's last connection checkpoints and deletes the WAL index, and a
            # connection that outlived that keeps reading a stale, unlinked copy of it.
            case.observer.close()
            what = fault.break_storage(case.db)
            if what is None:
                case.account(fault.cause, landed=False,
                             reason="the killed worker had not committed a table for this fault to break")
                continue
            try:  # mended whatever happens, a worker that cannot start (the campaign stopping) too
                # Process index -1: no kill plan is ever aimed at this worker, and its probe hits
                # stay out of the traces further cases are derived from.
                proc = case.spawn(command, turn_index, -1, None)
                named = command == "run" or fault.reads_the_turn  # the turn its outcome must name
                case.history.record("storage_fault", fault=fault.cause, phase="broken", what=what,
                                    incarnation=proc.incarnation, expect=f"session_persistence_failed:{fault.cause}",
                                    **({"turn": f"turn-{turn_index}"} if named else {}))
                case.account(fault.cause, landed=True)
                case.finish(proc, snapshot=False)  # a corrupt file cannot be snapshotted: after mending
            finally:
                fault.mend(case.db)
            case.history.record("storage_fault", fault=fault.cause, phase="mended", incarnation=proc.incarnation)
            case.snapshot("mend")
        return state
