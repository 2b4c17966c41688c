"""The directory entries a lazy file system has not made durable yet, and what a power cut
leaves of them.

The backing directory always holds the live tree, what a reader of the mount sees. Every
change of a directory entry made through the mount (create, mkdir, unlink, rmdir, rename) is
also a `NameChange` in a log, in issue order, sharing its sequence numbers with the file
writes of the same mount (`lazyfs_state`), until a directory it touches is fsynced. What a
change took out of the tree (an unlinked file, a removed directory, the file a rename
replaced) is not deleted: it is moved into a hidden grave directory of the backing root, so
that a cut can bring it back with its durable content.

The model (POSIX's promise, stricter than ext4's data=ordered journal, where a file's fsync
commits every earlier metadata change along with it):
  * a file's fsync makes its bytes and size durable, never a name: neither its own entry nor
    a rename of it;
  * a directory's fsync makes durable every pending change of an entry in that directory;
    a rename between two directories is one change, durable once either of them is fsynced
    (it is atomic: the cut never leaves the file under both names, or under neither).

A cut (`NameLog.cut`) first undoes every pending change, newest first (the tree is then as
durable as its last fsyncs left it), then redoes, in issue order, the changes the crash state
keeps. A kept change whose inputs the cut did not keep (a rename of a name whose creation was
dropped, say) is skipped, and one whose target exists replaces it; a kept rmdir of a
directory whose unlinks were dropped takes the directory with what is still in it. The grave
is then deleted.

Changes are kept by the paths they had when made (what an undo in reverse order needs), so an
fsync of a directory renamed since does not reach the changes made in it under its old name:
they wait for the fsync of a directory they name (nothing this harness runs renames a directory).
"""
from __future__ import annotations

import errno
import os
import shutil
from dataclasses import dataclass

from supervisor.chaos.nemesis.lazyfs_state import under

GRAVE = "/.lazyfs-grave"  # relative to the root; hidden from the mount


def parent(path: str) -> str:
    return os.path.dirname(path) or "/"


@dataclass(slots=True)
class NameChange:
    seq: int
    op: str                    # "create", "mkdir", "unlink", "rmdir" or "rename"
    path: str                  # the entry (rename: its old name)
    target: str | None = None  # rename: the new name
    buried: str | None = None  # the grave slot of what the change took out of the tree, if anything
    undone: str | None = None  # during a cut: the grave slot the undo moved a created entry to

    def touches(self, directory: str) -> bool:
        return parent(self.path) == directory or (self.target is not None and parent(self.target) == directory)

    def describe(self) -> dict[str, object]:
        return {"seq": self.seq, "op": self.op, "path": self.path,
                **({"target": self.target} if self.target is not None else {})}


class NameLog:
    """A mount's unsynced entry changes over the backing directory `root` (a real path)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.changes: list[NameChange] = []
        self._slots = 0
        shutil.rmtree(self.root + GRAVE, ignore_errors=True)  # left by a server that was killed

    def _real(self, path: str) -> str:
        return self.root + path

    def _exists(self, path: str) -> bool:
        return os.path.lexists(self._real(path))

    def _slot(self) -> str:
        os.makedirs(self._real(GRAVE), mode=0o700, exist_ok=True)
        self._slots += 1
        return f"{GRAVE}/{self._slots}"

    def _bury(self, path: str) -> str:
        """Move the entry at `path` into a new grave slot; returns the slot."""
        slot = self._slot()
        os.rename(self._real(path), self._real(slot))
        return slot

    # -- the changes, made in the live tree and logged ----------------------------------------

    def created(self, seq: int, path: str, op: str = "create") -> None:
        self.changes.append(NameChange(seq, op, path))

    def remove(self, seq: int, path: str, directory: bool) -> str:
        """unlink (rmdir when `directory`) `path`; returns the grave slot now holding it."""
        real = self._real(path)
        if directory:
            if not os.path.isdir(real) or os.path.islink(real):
                raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
            if os.listdir(real):
                raise OSError(errno.ENOTEMPTY, os.strerror(errno.ENOTEMPTY), path)
        elif os.path.isdir(real) and not os.path.islink(real):
            raise OSError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        slot = self._bury(path)
        self.changes.append(NameChange(seq, "rmdir" if directory else "unlink", path, buried=slot))
        return slot

    def rename(self, seq: int, old: str, new: str) -> str | None:
        """rename `old` to `new`; returns the grave slot of the entry it replaced, if any."""
        real_old, real_new = self._real(old), self._real(new)
        st_old = os.lstat(real_old)
        try:
            st_new = os.lstat(real_new)
        except FileNotFoundError:
            st_new = None
        if st_new is not None and os.path.samestat(st_old, st_new):
            return None  # one object under both names: rename does nothing
        slot = None
        if st_new is not None and not os.path.isdir(real_new):
            slot = self._slot()
            os.link(real_new, self._real(slot), follow_symlinks=False)  # the replaced file lives on there
            try:
                os.rename(real_old, real_new)  # the real rename does the checks (EISDIR, ...)
            except OSError:
                os.unlink(self._real(slot))
                raise
        elif st_new is not None:
            if not os.path.isdir(real_old):
                raise OSError(errno.EISDIR, os.strerror(errno.EISDIR), new)
            if os.listdir(real_new):
                raise OSError(errno.ENOTEMPTY, os.strerror(errno.ENOTEMPTY), new)
            if under(new, old):
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), new)
            slot = self._bury(new)
            try:
                os.rename(real_old, real_new)
            except OSError:
                os.rename(self._real(slot), real_new)
                raise
        else:
            os.rename(real_old, real_new)
        self.changes.append(NameChange(seq, "rename", old, new, buried=slot))
        return slot

    # -- durability ---------------------------------------------------------------------------

    def synced(self, directory: str) -> list[str]:
        """`directory` was fsynced: its pending changes are durable. Returns the grave slots that
        are now gone for good (their objects are deleted; an open descriptor still reaches one)."""
        done = [change for change in self.changes if change.touches(directory)]
        self.changes = [change for change in self.changes if not change.touches(directory)]
        slots = self._forget(done)
        if slots and not any(change.buried for change in self.changes):
            shutil.rmtree(self._real(GRAVE), ignore_errors=True)  # so that the backing tree is the disk's
        return slots

    def sync_all(self) -> None:
        """Everything becomes durable, as at a clean unmount."""
        self._forget(self.changes)
        self.changes = []
        shutil.rmtree(self._real(GRAVE), ignore_errors=True)

    def _forget(self, done: list[NameChange]) -> list[str]:
        slots = [change.buried for change in done if change.buried is not None]
        for slot in slots:
            _delete(self._real(slot))
        return slots

    def pending_names(self) -> list[str]:
        """Every name a cut may still change."""
        return sorted({name for change in self.changes for name in (change.path, change.target)
                       if name is not None})

    # -- the cut --------------------------------------------------------------------------------

    def cut(self, kept: frozenset[int]) -> dict[str, object]:
        """Leave in the live tree what a power cut that keeps the changes numbered `kept` leaves;
        then delete the grave. Answers which changes it dropped and what that did."""
        for change in reversed(self.changes):
            self._undo(change)
        applied = {change.seq: self._redo(change) for change in self.changes if change.seq in kept}
        dropped = [change for change in self.changes if change.seq not in kept]
        removed: list[str] = []
        for change in sorted((c for c in dropped if c.op in ("create", "mkdir")), key=lambda c: c.path):
            if not any(under(change.path, done) for done in removed):
                removed.append(change.path)
        report = {
            "removed_entries": removed,
            "restored_entries": sorted(c.path for c in dropped
                                       if c.op in ("unlink", "rmdir") and self._exists(c.path)),
            "undone_renames": [[c.path, c.target] for c in dropped if c.op == "rename"],
            "name_changes": [c.describe() | {"kept": c.seq in kept,
                                             **({"skipped": True} if applied.get(c.seq) is False else {})}
                             for c in self.changes],
        }
        self.changes = []
        shutil.rmtree(self._real(GRAVE), ignore_errors=True)
        return report

    def _undo(self, change: NameChange) -> None:
        if change.op in ("create", "mkdir"):
            if self._exists(change.path):
                change.undone = self._bury(change.path)
        elif change.op in ("unlink", "rmdir"):
            self._move(change.buried, change.path)
        else:
            assert change.target is not None
            self._move(change.target, change.path)
            self._move(change.buried, change.target)

    def _redo(self, change: NameChange) -> bool:
        """Apply a kept change to the tree as the cut left it so far; False when it cannot apply."""
        if change.op in ("create", "mkdir"):
            return self._move(change.undone, change.path, replace=True)
        if change.op in ("unlink", "rmdir"):
            if not self._exists(change.path):
                return False
            self._bury(change.path)
            return True
        assert change.target is not None
        return self._move(change.path, change.target, replace=True)

    def _move(self, source: str | None, target: str, replace: bool = False) -> bool:
        """Move the entry at `source` to `target`, if there is one and `target`'s directory exists;
        an entry at `target` is buried first when `replace`, else the move does not happen."""
        if source is None or not self._exists(source) or not os.path.isdir(self._real(parent(target))):
            return False
        if self._exists(target):
            if not replace or under(target, source):
                return False
            self._bury(target)
        os.rename(self._real(source), self._real(target))
        return True


def _delete(real: str) -> None:
    if os.path.isdir(real) and not os.path.islink(real):
        shutil.rmtree(real, ignore_errors=True)
    else:
        try:
            os.unlink(real)
        except FileNotFoundError:
            pass
