"""How the daemon's loop is woken, and how other threads get work done in it.

The loop sleeps in poll(2) on a self-pipe (not select(2): in a daemon that raised its descriptor
limit for the HTTP API, the pipe may be numbered past 1,024). Anything may write a byte to it: a
reaper thread when a worker exits, the HTTP API when a turn is submitted, the signal machinery
(`signal.set_wakeup_fd`) when a signal arrives. Work that must run on the loop's thread
(it owns the database connection and the leases), such as a cancel request from the HTTP
API, is queued as a call whose future the caller waits on.
"""
from __future__ import annotations

import concurrent.futures
import math
import os
import queue
import select
from typing import Any, Callable


class Wakeup:
    """A self-pipe: `wake()` from any thread (or a signal), `wait(timeout)` in the loop."""

    def __init__(self) -> None:
        self._read, self.fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._poll = select.poll()
        self._poll.register(self._read, select.POLLIN)

    def wake(self) -> None:
        try:
            os.write(self.fd, b"x")
        except OSError:  # the pipe is full: a wake-up is pending anyway
            pass

    def wait(self, timeout: float) -> None:
        """Return after `timeout` seconds, or sooner once woken (every pending wake-up consumed)."""
        if self._poll.poll(max(0, math.ceil(timeout * 1000))):
            try:
                while os.read(self._read, 4096):
                    pass
            except OSError:  # drained (EAGAIN)
                pass


class LoopCalls:
    """Calls queued by other threads, run by the loop on its next pass."""

    def __init__(self, wakeup: Wakeup) -> None:
        self._wakeup = wakeup
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future]] = queue.SimpleQueue()

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((fn, future))
        self._wakeup.wake()
        return future

    def run_pending(self, refuse: str | None = None) -> None:
        """Run every queued call (in the loop's thread), or fail each with RuntimeError(`refuse`)."""
        while True:
            try:
                fn, future = self._queue.get_nowait()
            except queue.Empty:
                return
            if not future.set_running_or_notify_cancel():
                continue
            if refuse is not None:
                future.set_exception(RuntimeError(refuse))
                continue
            try:
                future.set_result(fn())
            except Exception as exc:
                future.set_exception(exc)
