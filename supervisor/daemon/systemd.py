"""systemd's notify protocol (sd_notify(3)), with the standard library only.

When systemd starts the daemon as a `Type=notify` service it sets ``NOTIFY_SOCKET`` (a unix
datagram socket: a path, or ``@name`` in the abstract namespace) and, with `WatchdogSec=`,
``WATCHDOG_USEC`` (and ``WATCHDOG_PID``). The daemon says

    READY=1        once its loop runs (and whatever it serves besides is bound)
    STOPPING=1     when it starts draining
    WATCHDOG=1     every WATCHDOG_USEC/2 while its loop runs
    STATUS=...     a line `systemctl status` shows

Without ``NOTIFY_SOCKET`` every call is a no-op, so the daemon runs the same anywhere.
"""
from __future__ import annotations

import os
import socket
from typing import Mapping


class Notifier:
    """One daemon's connection to systemd (or to nothing, when not run by it)."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.address = _address(env.get("NOTIFY_SOCKET", ""))
        self.watchdog_seconds = _watchdog_seconds(env)
        self._sock: socket.socket | None = None
        self.errors = 0

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def notify(self, *fields: str) -> bool:
        """Send `fields` ("READY=1", "STATUS=...") as one datagram; True when it was sent."""
        if self.address is None:
            return False
        message = "\n".join(f.replace("\n", " ") for f in fields).encode("utf-8", "replace")
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(message, self.address)
            return True
        except OSError:
            self.errors += 1  # systemd gone or the socket full: the daemon serves on regardless
            return False

    def ready(self, status: str | None = None) -> bool:
        return self.notify("READY=1", f"MAINPID={os.getpid()}", *([f"STATUS={status}"] if status else []))

    def stopping(self, status: str | None = None) -> bool:
        return self.notify("STOPPING=1", *([f"STATUS={status}"] if status else []))

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    @property
    def watchdog_interval(self) -> float | None:
        """How often to ping the watchdog (half its timeout), or None when there is no watchdog."""
        return self.watchdog_seconds / 2 if self.watchdog_seconds else None

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _address(value: str) -> str | bytes | None:
    if not value:
        return None
    if value.startswith("@"):  # the abstract namespace: a leading NUL byte
        return b"\0" + value[1:].encode("utf-8")
    if value.startswith("/"):
        return value
    return None  # sd_notify(3) ignores anything else (e.g. vsock addresses, which this does not speak)


def _watchdog_seconds(env: Mapping[str, str]) -> float | None:
    """WATCHDOG_USEC in seconds, when it is meant for this process (WATCHDOG_PID unset or ours)."""
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    owner = env.get("WATCHDOG_PID")
    if owner:
        try:
            if int(owner) != os.getpid():
                return None
        except ValueError:
            return None
    return usec / 1e6 if usec > 0 else None


# The descriptors the documented unit (docs/daemon.md) gives the daemon: its HTTP API caps
# connections to what RLIMIT_NOFILE leaves once its workers and databases have theirs
# (`supervisor.daemon.http.limits.fd_limits`), and systemd's default soft limit (1024) would leave a
# few hundred.
LIMIT_NOFILE = 65536

