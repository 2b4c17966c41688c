"""What the lazy file system costs SQLite: commits on a plain directory against the same commits
through the mount over it, side by side.

    python -m bench.lazyfs_overhead [--commits N] [--dir PATH]

Each configuration (journal mode, synchronous) commits N single-row inserts, one transaction
each, in a fresh database, then reads every row back once. Printed: the median and mean time of
a commit, the time of the full read, and the ratio mount / plain. A measurement, not a test.
"""
from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from supervisor.chaos.nemesis.lazyfs import LazyFS, why_unavailable

CONFIGS = (("wal", "full"), ("wal", "normal"), ("delete", "full"))
ROW = "x" * 200


def measure(db: Path, journal: str, synchronous: str, commits: int) -> dict[str, float]:
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute(f"PRAGMA journal_mode={journal}")
        conn.execute(f"PRAGMA synchronous={synchronous}")
        conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, body TEXT)")
        times = []
        for _ in range(commits):
            start = time.perf_counter()
            conn.execute("INSERT INTO t(body) VALUES (?)", (ROW,))
            times.append(time.perf_counter() - start)
        start = time.perf_counter()
        conn.execute("SELECT sum(length(body)) FROM t").fetchone()
        read = time.perf_counter() - start
    finally:
        conn.close()
    return {"median_ms": statistics.median(times) * 1e3, "mean_ms": statistics.fmean(times) * 1e3,
            "read_ms": read * 1e3}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=300)
    parser.add_argument("--dir", type=Path, default=None, help="where to put the databases (default: a temp dir)")
    args = parser.parse_args(argv)
    why = why_unavailable()
    if why:
        print(f"lazyfs_overhead: cannot mount here: {why}")
        return 1
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        plain, backing, mnt = Path(tmp, "plain"), Path(tmp, "backing"), Path(tmp, "mnt")
        for directory in (plain, backing, mnt):
            directory.mkdir()
        print(f"{args.commits} commits of one {len(ROW)}-byte row each; times per commit, then one full read")
        print(f"{'journal/sync':<14} {'plain med':>10} {'mount med':>10} {'x':>6} "
              f"{'plain mean':>11} {'mount mean':>11} {'x':>6} {'read plain':>11} {'read mount':>11}")
        with LazyFS(backing, mnt) as _:
            for journal, synchronous in CONFIGS:
                name = f"{journal}-{synchronous}.db"
                base = measure(plain / name, journal, synchronous, args.commits)
                lazy = measure(mnt / name, journal, synchronous, args.commits)
                print(f"{journal + '/' + synchronous:<14} {base['median_ms']:>8.3f}ms {lazy['median_ms']:>8.3f}ms "
                      f"{lazy['median_ms'] / base['median_ms']:>5.1f}x {base['mean_ms']:>9.3f}ms "
                      f"{lazy['mean_ms']:>9.3f}ms {lazy['mean_ms'] / base['mean_ms']:>5.1f}x "
                      f"{base['read_ms']:>9.3f}ms {lazy['read_ms']:>9.3f}ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
