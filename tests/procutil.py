"""Stopping a supervisor a test started, and everything it started, by recorded pids; running one with a bound."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

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


def run_bounded(argv: list[str], cwd: Path, env: dict[str, str], bound_s: float) -> subprocess.CompletedProcess[str]:
    """`python ARGV` in its own session, failing the test (its tree stopped) past `bound_s`."""
    import pytest

    proc = subprocess.Popen([sys.executable, *argv], cwd=cwd, env=env, text=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=bound_s)
    except subprocess.TimeoutExpired:
        stop_tree(proc)
        out, err = proc.communicate()
        pytest.fail(f"{argv} did not finish in {bound_s:.0f}s\n{out[-3000:]}\n{err[-3000:]}")
    finally:
        stop_tree(proc)  # a no-op once reaped
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)
