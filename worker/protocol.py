"""The control channel between a worker and its supervisor.

Frames are a 4-byte big-endian length followed by that many bytes of UTF-8 JSON,
over an inherited socketpair (never a listening socket, so no other user can
connect). Both sides import this module; it imports nothing of either.

Worker -> supervisor messages (``type``):
    hello    {pid, incarnation, session, command}
    probe    {name, n, ctx, kill}      a probe hit; n is its occurrence (1-based)
    ui       {seq, kind, session, turn, ...}   a UI projection; the worker waits for ack
    effect   {seq, tool, tool_call_id, ...}    a tool about to run; the worker waits for ack
    outcome  {result}                  how the command ended
Supervisor -> worker:
    ack      {seq}
    plan     {kill_at: "probe[:n]" | null, mode: "self" | "external" | "pause" | "interrupt"}
    continue {}                        release a worker paused at its kill point
"""
from __future__ import annotations

import json
import socket
import struct
import threading
from dataclasses import dataclass
from typing import Any

# A worker's exit status: 0 the turn completed (or there was nothing to resume), 1 the turn
# ended failed (its outcome says why), 2 bad arguments. The supervisor judges by them too.
EXIT_OK, EXIT_TURN_FAILED, EXIT_USAGE = 0, 1, 2

_HEADER = struct.Struct(">I")
MAX_FRAME = 64 * 1024 * 1024
# self: the worker SIGKILLs itself; external: it reports and blocks until the supervisor kills it;
# pause: it reports and blocks until told to continue (the supervisor SIGSTOPs it meanwhile);
# interrupt: it reports and sends itself SIGINT, as a user's Ctrl-C: the turn's KeyboardInterrupt
# answers what it cut off, and the worker ends on SIGINT (no SIGKILL: what it does next is judged).
KILL_MODES = ("self", "external", "pause", "interrupt")


class ChannelClosed(Exception):
    """The other end is gone (it exited or was killed)."""


@dataclass(frozen=True)
class KillPlan:
    probe: str
    occurrence: int = 1
    mode: str = "self"

    @classmethod
    def parse(cls, spec: str, mode: str = "self") -> "KillPlan":
        """`probe` or `probe:N` (the N-th hit, 1-based)."""
        name, _, count = spec.partition(":")
        if not name:
            raise ValueError(f"kill point {spec!r} names no probe")
        if mode not in KILL_MODES:
            raise ValueError(f"kill mode must be one of {', '.join(KILL_MODES)}, not {mode!r}")
        try:
            occurrence = int(count) if count else 1
        except ValueError:
            raise ValueError(f"kill point {spec!r}: occurrence {count!r} is not a whole number") from None
        if occurrence < 1:
            raise ValueError(f"kill point {spec!r}: occurrences count from 1")
        return cls(name, occurrence, mode)

    def spec(self) -> str:
        return f"{self.probe}:{self.occurrence}"

    def to_json(self) -> dict[str, Any]:
        return {"kill_at": self.spec(), "mode": self.mode}


class Channel:
    """Length-prefixed JSON frames over a connected stream socket; safe to send from many threads."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._send_lock = threading.Lock()
        self._recv_lock = threading.Lock()

    @classmethod
    def from_fd(cls, fd: int) -> "Channel":
        return cls(socket.socket(fileno=fd))

    def send(self, message: dict[str, Any]) -> None:
        with self._send_lock:
            self._send_locked(message)

    def send_last(self, message: dict[str, Any]) -> None:
        """Send `message` and keep the send lock for good: nothing any thread sends can follow it.

        For a process about to die where it stands (a planned kill): the supervisor then knows
        that a death it sees after this message is the one announced, not a later one."""
        self._send_lock.acquire()
        self._send_locked(message)

    def _send_locked(self, message: dict[str, Any]) -> None:
        data = json.dumps(message, ensure_ascii=False, default=str).encode("utf-8", "surrogatepass")
        try:
            self.sock.sendall(_HEADER.pack(len(data)) + data)
        except OSError as exc:
            raise ChannelClosed(str(exc)) from exc

    def _read_exact(self, size: int) -> bytes:
        parts, left = [], size
        while left:
            try:
                chunk = self.sock.recv(left)
            except OSError as exc:
                raise ChannelClosed(str(exc)) from exc
            if not chunk:
                raise ChannelClosed("peer closed the channel")
            parts.append(chunk)
            left -= len(chunk)
        return b"".join(parts)

    def recv(self) -> dict[str, Any]:
        """The next message; raises ChannelClosed at end of stream."""
        with self._recv_lock:
            (size,) = _HEADER.unpack(self._read_exact(_HEADER.size))
            if size > MAX_FRAME:
                raise ChannelClosed(f"frame of {size} bytes exceeds the {MAX_FRAME} limit")
            return json.loads(self._read_exact(size).decode("utf-8", "surrogatepass"))

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def send_with_fds(sock: socket.socket, message: dict[str, Any], fds: list[int]) -> None:
    """One frame whose header carries `fds` (SCM_RIGHTS), for handing a child its sockets and pipes."""
    body = json.dumps(message).encode("utf-8")
    socket.send_fds(sock, [_HEADER.pack(len(body))], fds)
    sock.sendall(body)


def recv_with_fds(sock: socket.socket, max_fds: int = 4) -> tuple[dict[str, Any], list[int]] | None:
    """The next frame and the descriptors that came with it; None at end of stream."""
    header, fds, _flags, _addr = socket.recv_fds(sock, _HEADER.size, max_fds)
    if not header:
        return None
    if len(header) < _HEADER.size:
        header += Channel(sock)._read_exact(_HEADER.size - len(header))
    (size,) = _HEADER.unpack(header)
    return json.loads(Channel(sock)._read_exact(size).decode("utf-8")), list(fds)
