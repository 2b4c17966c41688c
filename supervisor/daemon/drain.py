"""The daemon's drain: SIGTERM or SIGINT stop the leasing; the running turns get `seconds` to end.

Then the workers still running are SIGKILLed by recorded pid (their turns stay 'running' and
the next start resumes them). A second signal cuts the wait short. Workers that have not
exited `KILL_GRACE` seconds after SIGKILL (a process in uninterruptible sleep) are given up
on, and said so, rather than holding the daemon forever.
"""
from __future__ import annotations

import time
from typing import Collection

from supervisor.daemon.log import info, log
from supervisor.daemon.restarts import Lease

KILL_GRACE = 10.0


class Drain:
    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.killed_at: float | None = None

    def cut_short(self) -> None:
        if self.killed_at is None:
            self.deadline = time.monotonic()

    def next_wait(self, now: float) -> float | None:
        """Seconds until the drain must act again, or None when only the workers' exits are awaited."""
        return self.deadline - now if self.killed_at is None else None

    def step(self, leases: Collection[Lease]) -> bool:
        """One pass: kill the workers once time is up; True when the drain is over."""
        if not leases:
            return True
        now = time.monotonic()
        if self.killed_at is None and now >= self.deadline:
            self.killed_at = now
            for lease in leases:
                lease.killed_for = "drain"
                lease.proc.kill("drain")
            info("drain time is up: workers killed by recorded pid", workers=[lease.proc.pid for lease in leases])
        if self.killed_at is not None and now - self.killed_at > KILL_GRACE:
            log.error("workers did not exit within %.0f s of SIGKILL", KILL_GRACE,
                      extra={"fields": {"workers": [lease.proc.pid for lease in leases]}})
            return True
        return False
