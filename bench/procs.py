"""The processes a daemon started, recorded by pid and start time.

`bench.api.HttpDaemon`, `scripts/soak.py` and the daemon tests' harness each run `serve` in a
session of its own and must check that nothing it started outlives it; they kill only by a
recorded pid, and take a pid for the recorded process only while its start time matches (a pid
the system has handed to another process since is never signalled).
"""
from __future__ import annotations

import os
import signal
import subprocess

import psutil

from supervisor.daemon import inbox


def note_descendants(pid: int, seen: dict[int, float]) -> list[psutil.Process]:
    """Record every live descendant of `pid` in `seen` (pid -> start time; the first record of a
    pid stays) and return them; none once `pid` is gone."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    for child in children:
        try:
            seen.setdefault(child.pid, child.create_time())
        except psutil.Error:
            pass  # exited between the listing and the look
    return children


def kill_group(proc: subprocess.Popen, timeout: float | None = None) -> None:
    """SIGKILL a process started with `start_new_session` and its process group, by its recorded
    pid, and reap it (waiting at most `timeout` seconds)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout)


def sigkill_survivors(seen: dict[int, float]) -> list[int]:
    """SIGKILL each process of `seen` still alive as the very process recorded; returns their pids."""
    left = [pid for pid, created in seen.items() if inbox.process_alive(pid, created)]
    for pid in left:
        if pid > 1:  # never our group (0) or init (1), whatever a record says
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return left
