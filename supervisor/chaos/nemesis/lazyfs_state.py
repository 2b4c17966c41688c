"""What a lazy file system has not made durable yet in its files, and what a power cut leaves of it.

A file's unsynced changes are a log of `Write` and `Truncate` operations in the order they
were issued. Each carries a sequence number shared by all the files of one mount and by its
unsynced directory entry changes (`lazyfs_names`), so that a power cut can be described over
the whole machine: the disk received the operations in issue order, and lost some of them.

`power_cut` picks, with a seeded random generator (the same seed and logs give the same
cut), which operations reach the disk, entry changes counted like writes:

    drop    none of them (the common case: the page cache is simply gone)
    prefix  the first k operations in issue order, k uniform in 0..n
    subset  each operation independently with probability 1/2, applied in issue order
            (a later write survives where an earlier one did not: reordering)
    torn    a prefix that ends inside one write, cut at a 512-byte sector boundary of the
            file (an absolute offset, multiple of 512, strictly inside the write): the sectors
            before the boundary are kept, the rest of that write and everything after it is
            lost. The torn write is picked at random among the writes that cross a boundary;
            with none, `torn` is `drop`.
"""
from __future__ import annotations

import os
import random
import stat
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from supervisor.chaos.nemesis.lazyfs_names import NameLog

CRASH_MODES = ("drop", "prefix", "subset", "torn")
SECTOR = 512


@dataclass(frozen=True, slots=True)
class Write:
    seq: int
    offset: int
    data: bytes

    @property
    def end(self) -> int:
        return self.offset + len(self.data)


@dataclass(frozen=True, slots=True)
class Truncate:
    seq: int
    length: int


Op = Write | Truncate


@dataclass(slots=True)
class PendingFile:
    """One file's unsynced operations, and the size and mtime a reader must see."""
    path: str | None          # relative to the mount's root; None once unlinked
    size: int                 # logical size: the backing size with every pending op applied
    mtime_ns: int
    ops: list[Op] = field(default_factory=list)

    def write(self, seq: int, offset: int, data: bytes, now_ns: int) -> None:
        self.ops.append(Write(seq, offset, data))
        self.size = max(self.size, offset + len(data))
        self.mtime_ns = now_ns

    def truncate(self, seq: int, length: int, now_ns: int) -> None:
        self.ops.append(Truncate(seq, length))
        self.size = length
        self.mtime_ns = now_ns

    def overlay(self, offset: int, size: int, durable: bytes) -> bytes:
        """The bytes a reader sees at [offset, offset+size): `durable` (what the backing file
        holds there) with every pending operation applied in order."""
        end = offset + size
        window = bytearray(durable.ljust(size, b"\0"))
        for op in self.ops:
            if isinstance(op, Write):
                lo, hi = max(op.offset, offset), min(op.end, end)
                if lo < hi:
                    window[lo - offset:hi - offset] = op.data[lo - op.offset:hi - op.offset]
            elif op.length < end:  # bytes past a truncation read as zeros if the file regrows
                cut = max(op.length, offset) - offset
                window[cut:] = bytes(size - cut)
        return bytes(window[:max(0, min(size, self.size - offset))])

    def status(self) -> dict[str, object]:
        writes = [op for op in self.ops if isinstance(op, Write)]
        return {"path": self.path, "writes": len(writes), "size": self.size,
                "ranges": merged_ranges(writes),
                "truncates": [op.length for op in self.ops if isinstance(op, Truncate)]}


def apply_ops(fd: int, ops: list[Op]) -> None:
    """Make `ops` happen, in order, on the backing file open for writing as `fd`."""
    for op in ops:
        if isinstance(op, Truncate):
            os.ftruncate(fd, op.length)
            continue
        view, at = memoryview(op.data), op.offset
        while view:
            done = os.pwrite(fd, view, at)
            view, at = view[done:], at + done


def sync_file(real_path: str, ops: list[Op]) -> None:
    """Apply `ops` to the file at `real_path` and fsync it."""
    fd = os.open(real_path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        apply_ops(fd, ops)
        os.fsync(fd)
    finally:
        os.close(fd)


def merged_ranges(writes: list[Write]) -> list[list[int]]:
    """The byte ranges the writes cover, sorted and merged: [[start, end), ...]."""
    merged: list[list[int]] = []
    for lo, hi in sorted((w.offset, w.end) for w in writes if w.data):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return merged


@dataclass(frozen=True, slots=True)
class Cut:
    """What reaches the disk: per path, the operations to apply in order; the sequence numbers
    of the entry changes kept."""
    keep: dict[str, list[Op]]
    torn: dict[str, object] | None
    names: frozenset[int] = frozenset()


def power_cut(mode: str, seed: int, logs: dict[str, list[Op]], names: list[int] | tuple[int, ...] = ()) -> Cut:
    """Pick the surviving operations of `logs` (path -> ops) and entry changes (`names`, their
    sequence numbers) for a power cut in `mode`."""
    if mode not in CRASH_MODES:
        raise ValueError(f"unknown crash mode {mode!r}: one of {', '.join(CRASH_MODES)}")
    rng = random.Random(seed)
    issued: list[tuple[int, str | None, Op | None]] = sorted(
        [*((op.seq, path, op) for path, ops in logs.items() for op in ops), *((seq, None, None) for seq in names)],
        key=lambda item: item[0])
    torn = None
    if mode == "drop":
        kept: list[tuple[int, str | None, Op | None]] = []
    elif mode == "prefix":
        kept = issued[:rng.randint(0, len(issued))]
    elif mode == "subset":
        kept = [item for item in issued if rng.random() < 0.5]
    else:
        kept, torn = _torn(rng, issued)
    keep: dict[str, list[Op]] = {path: [] for path in logs}
    for _, path, op in kept:
        if path is not None and op is not None:
            keep[path].append(op)
    return Cut(keep, torn, frozenset(seq for seq, path, _ in kept if path is None))


def _torn(rng: random.Random, issued: list[tuple[int, str | None, Op | None]]
          ) -> tuple[list[tuple[int, str | None, Op | None]], dict[str, object] | None]:
    eligible = [i for i, (_, _, op) in enumerate(issued)
                if isinstance(op, Write) and _boundaries(op)]
    if not eligible:
        return [], None
    index = rng.choice(eligible)
    seq, path, op = issued[index]
    assert isinstance(op, Write)
    boundary = rng.choice(_boundaries(op))
    head = Write(seq, op.offset, op.data[:boundary - op.offset])
    torn = {"path": path, "offset": op.offset, "length": len(op.data), "kept": [op.offset, boundary]}
    return [*issued[:index], (seq, path, head)], torn


def _boundaries(op: Write) -> list[int]:
    first = (op.offset // SECTOR + 1) * SECTOR
    return list(range(first, op.end, SECTOR))


def under(path: str, top: str) -> bool:
    """Whether `path` is `top` or inside it (both relative to one root, with a leading /)."""
    return path == top or path.startswith(top.rstrip("/") + "/")


def cut_power(root: str, mode: str, seed: int, logs: dict[str, list[Op]], names: NameLog) -> dict[str, object]:
    """Leave in the backing directory `root` what a power cut in `mode` leaves: in the files,
    wherever their names are now, the operations `power_cut` keeps, applied and fsynced; then
    the directory entries as the entry changes it keeps leave them. Answers what was lost."""
    cut = power_cut(mode, seed, logs, [change.seq for change in names.changes])
    inodes = {path: os.lstat(root + path).st_ino for path in logs}
    for path, ops in sorted(logs.items()):
        if cut.keep[path]:
            sync_file(root + path, cut.keep[path])
    entries = names.cut(cut.names)
    named = _inodes(root) if logs else set()  # a file may be back under another name: look by inode
    files = []
    for path, ops in sorted(logs.items()):
        # What the cut kept of a file it then took away reached blocks that no name reaches.
        files.append(describe(path, ops, cut.keep[path]) | {"entry_removed": inodes[path] not in named})
    return {"mode": mode, "seed": seed, "files": files, **entries, "torn": cut.torn,
            "dropped_writes": sum(int(f["dropped_writes"]) for f in files)}


def _inodes(root: str) -> set[int]:
    """The inode numbers of the regular files in the tree at `root`."""
    found = set()
    for top, _, names in os.walk(root):
        for name in names:
            st = os.lstat(os.path.join(top, name))
            if stat.S_ISREG(st.st_mode):
                found.add(st.st_ino)
    return found


def describe(path: str, pending: list[Op], kept: list[Op]) -> dict[str, object]:
    """One file's line of a crash report: how many writes it had, kept and dropped, and where
    (the lost tail of a torn write is a dropped range of a kept write)."""
    survivors = {op.seq: op for op in kept}
    writes = [op for op in pending if isinstance(op, Write)]
    dropped_ranges = []
    for op in writes:
        head = survivors.get(op.seq)
        if head is None or head.end < op.end:
            dropped_ranges.append([op.offset if head is None else head.end, op.end])
    return {"path": path, "writes": len(writes),
            "kept_writes": sum(isinstance(op, Write) for op in kept),
            "dropped_writes": sum(op.seq not in survivors for op in writes),
            "kept_ranges": [[op.offset, op.end] for op in kept if isinstance(op, Write)],
            "dropped_ranges": dropped_ranges,
            "dropped_truncates": [op.length for op in pending
                                  if isinstance(op, Truncate) and op.seq not in survivors]}
