"""Ctrl-C, twice, during a power-loss campaign leaves nothing of the lazy file system behind.

A `--faults power-loss` campaign runs every case on a lazy FUSE mount served by server processes
of its own (in sessions of their own, so a terminal's Ctrl-C never reaches them). The test starts
a real campaign with TMPDIR in its own directory, reads its output until the first case finished
(so the servers exist), notes every process the campaign started (its process tree, by pid and
start time), sends SIGINT, waits for the "stopping" line, notes the tree again, and sends SIGINT
again. Whether the second signal quit at once (130) or came after the first stop ended (3), no
process of that tree may be left, no lazy mount, and no server's temporary directory.
Nothing waits for time to pass: every wait is for a line, or for the noted processes to end.
"""
from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest
from fuseutil import require_fuse
from test_chaos_interrupt import WAIT_S, Running, finished

from supervisor.chaos.nemesis.lazyfs import is_mounted

pytestmark = [pytest.mark.chaos, pytest.mark.xdist_group("chaos")]

EXIT_INTERRUPTED, EXIT_QUIT = 3, 128 + signal.SIGINT


def tree(pid: int) -> set[tuple[int, float]]:
    """Every live process under `pid`, as (pid, start time): a pid alone may be reused."""
    try:
        return {(p.pid, p.create_time()) for p in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def still_running(noted: set[tuple[int, float]]) -> list[psutil.Process]:
    left = []
    for pid, created in noted:
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(proc)
        except psutil.Error:
            continue
    return left


def lazy_mounts(under: Path) -> list[str]:
    with open("/proc/self/mountinfo", encoding="utf-8") as table:
        return [line for line in table if " - fuse.lazyfs " in line or " lazyfs " in line
                if str(under) in line]


@pytest.mark.parametrize("first", [signal.SIGINT, signal.SIGTERM], ids=["sigint-twice", "sigterm-then-sigint"])
def test_two_signals_leave_no_lazy_file_system_server_mount_or_directory(tmp_path: Path, first: int) -> None:
    require_fuse()
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    run = Running("--faults", "power-loss", "--scenario", "single-tool", "--probe", "tool.dispatch.after",
                  "--jobs", "2", "--verbose", "--report", str(tmp_path / "report"), tmp=scratch)
    noted: set[tuple[int, float]] = set()
    try:
        assert run.wait_for("out", lambda lines: len(finished(lines)) >= 1), run.output()
        noted |= tree(run.proc.pid)
        servers = [pid for pid, _ in noted if "lazyfs_server" in " ".join(psutil.Process(pid).cmdline())]
        assert servers, f"no lazy file system server under the campaign\n{run.output()}"
        run.proc.send_signal(first)
        assert run.wait_for("err", lambda lines: any("stopping" in line for line in lines)), run.output()
        noted |= tree(run.proc.pid)
        run.proc.send_signal(signal.SIGINT)
        code = run.finish()
    finally:
        if run.proc.poll() is None:
            os.killpg(run.proc.pid, signal.SIGKILL)
            run.proc.wait()
    assert code in (EXIT_INTERRUPTED, EXIT_QUIT), run.output()
    _, alive = psutil.wait_procs(still_running(noted), timeout=WAIT_S)  # an upper bound, not a delay
    assert not [p.pid for p in alive], f"left running: {alive}\n{run.output()}"
    assert not lazy_mounts(tmp_path), lazy_mounts(tmp_path)
    assert not [d for d in scratch.iterdir() if d.name.startswith("lazyfs-")], list(scratch.iterdir())
    for mountpoint in tmp_path.rglob("state"):
        assert not is_mounted(mountpoint), mountpoint
