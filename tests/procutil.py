"""Stopping a supervisor a test started, and everything it started, by recorded pids."""
from __future__ import annotations

import os
import signal
import subprocess

import psutil


def stop_tree(proc: subprocess.Popen[str]) -> None:
    """SIGKILL a still-running child's process group (its pgid is its recorded pid: it was started
    with start_new_session), then whatever it had started that survives it (workers run in
    sessions of their own), by pid. A child already reaped is left alone: its pid may be reused."""
    if proc.poll() is not None:
        return
    try:
        descendants = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    for child in descendants:
        try:
            child.kill()  # psutil refuses if the pid now names a different process
        except psutil.Error:
            pass
