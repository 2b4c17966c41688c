"""A deadline on every exchange with the server: a connection that hangs is cut, never waited on forever.

A backend that stops answering (stopped, swapped out, its host frozen, a network path that drops
packets without a reset) leaves libpq waiting in ``poll`` for an answer that never comes: over a
Unix socket no keepalive notices, and ``statement_timeout`` runs on the server, the part that
hangs. A worker stuck there neither finishes its turn nor fails it.

So each call into the server runs under a `Deadline`: one thread per store watches the armed
call, and once it has run longer than its limit shuts the connection's socket down
(``shutdown(2)``, on a duplicate of its descriptor). The blocked call then returns at once with
"server closed the connection", the connection is broken, and the failure is a lost connection
(cause ``connection``): the turn ends closed, the store connects again at its next call, and
recovery reads what the server committed. A write whose COMMIT was cut may or may not have
committed, as after any lost connection.

The limit is generous (the busy budget, which bounds every lock wait, plus `MARGIN_S`): it is
there to end hangs, not to hurry a slow server.
"""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

MARGIN_S = 30.0


class Deadline:
    """Cuts the connection of a call that outlives `seconds`. One per store; calls are serialized by it."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._cond = threading.Condition()
        self._armed: tuple[int, float, int] | None = None  # (socket fd, deadline, call number)
        self._calls = 0
        self._thread: threading.Thread | None = None
        self.cut = 0  # calls cut so far

    @contextlib.contextmanager
    def guard(self, fd: int) -> Iterator[None]:
        """Run the body with the connection on `fd` cut if it lasts past the deadline."""
        with self._cond:
            if self._thread is None or not self._thread.is_alive():  # started lazily: after a fork, in the child
                self._thread = threading.Thread(target=self._watch, name="pg-deadline", daemon=True)
                self._thread.start()
            self._calls += 1
            self._armed = (fd, time.monotonic() + self.seconds, self._calls)
            self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._armed = None

    def _watch(self) -> None:
        with self._cond:
            while True:
                armed = self._armed
                if armed is None:
                    self._cond.wait()
                    continue
                left = armed[1] - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                # Still the same call, and still inside its guard (the lock is held): its descriptor is
                # still the connection's, never one reused by a later open.
                self._armed = None
                self.cut += 1
                _shut_down(armed[0])


def _shut_down(fd: int) -> None:
    try:
        sock = socket.socket(fileno=socket.dup(fd))
    except OSError:
        return  # already closed: nothing hangs on it
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()
