"""The connection guard: what a connection may cost before it is an answered request. The kernel
holds a silent one (`defer_accept`); past the connection cap the oldest one without a whole request
head makes room, or the new one is answered 503 (`admit`); a request's head and body must arrive
in time and within their bounds, and one answered before its body was read is ended at once
(`guarded_protocol`, uvicorn's h11 protocol with these rules)."""
from __future__ import annotations

import asyncio
import json
import socket
from typing import TYPE_CHECKING, Any

from supervisor.daemon.http.limits import LINGER_SECONDS, MAX_HEAD, REJECT_SLACK, RETRY_AFTER

if TYPE_CHECKING:
    from supervisor.daemon.http.server import HttpApi


def defer_accept(sock: socket.socket, seconds: float) -> bool:
    """Have the kernel hold a new connection until its first bytes arrive, for up to about `seconds`
    (Linux's TCP_DEFER_ACCEPT; elsewhere nothing, and False). A client that connects and sends
    nothing then costs the daemon no descriptor, no timer and no eviction, however many it opens
    and however fast it reconnects; past `seconds` it is accepted and timed like any other."""
    option = getattr(socket, "TCP_DEFER_ACCEPT", None)
    if option is None or seconds <= 0:
        return False
    sock.setsockopt(socket.IPPROTO_TCP, option, max(1, round(seconds)))
    return True


def admit(api: HttpApi, proto: Any) -> str:
    """(The loop.) A new connection: "ok", "reject" (answered 503) or "drop" (closed at once).

    Past the cap, the oldest connection that has not sent a whole request head makes room."""
    if len(api.protocols) <= api.max_connections:
        return "ok"
    while api.heads:
        victim, _ = api.heads.popitem(last=False)
        if victim is not proto and not victim.transport.is_closing():
            victim.set_phase(None)
            victim.transport.close()
            api.rate.note("evicted", "HTTP API at its connection cap: closed the oldest connection that had "
                          "sent no request", cap=api.max_connections)
            return "ok"
    if len(api.protocols) <= api.max_connections + REJECT_SLACK:
        api.rate.note("rejected", "HTTP API at its connection cap: answering 503", cap=api.max_connections)
        return "reject"
    api.rate.note("dropped", "HTTP API past its connection cap: closing new connections at once",
                  cap=api.max_connections)
    return "drop"


def guarded_protocol(api: HttpApi) -> type:
    """uvicorn's h11 protocol with the read timeouts and the connection cap of `api`."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    body = json.dumps({"error": "too many connections; try again"}).encode()
    busy = (f"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: {RETRY_AFTER}\r\n"
            f"connection: close\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body
    late = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    too_large = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"

    class GuardedH11(H11Protocol):
        guard_phase: str | None = None  # "head": a request head is due; "body": its body; None: neither
        guard_timer: asyncio.TimerHandle | None = None
        rejected = False
        lingering = False  # answered before its request's body was read whole: what still comes is discarded

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            api.protocols.add(self)
            verdict = admit(api, self)
            if verdict == "drop":
                transport.abort()
            elif verdict == "reject":  # answered 503 at its first bytes; closed if none come
                self.rejected = True
                self.guard_timer = self.loop.call_later(api.reject_seconds, transport.abort)
            else:
                self.guard()

        def data_received(self, data: bytes) -> None:
            if self.lingering:
                return
            if self.rejected:
                if not self.transport.is_closing():
                    self.transport.write(busy)
                    self.transport.close()
                return
            if self.guard_phase == "head":  # h11 bounds a head that comes in pieces; this, one that comes whole
                head = bytes(self.conn.trailing_data[0]) + data[: MAX_HEAD + 4]
                end = head.find(b"\r\n\r\n")
                if (end if end >= 0 else len(head)) > MAX_HEAD:
                    api.rate.note("head-too-large", "HTTP API: refused a request head over its bound", limit=MAX_HEAD)
                    self.set_phase(None)
                    self.transport.write(too_large)
                    self.transport.close()
                    return
            super().data_received(data)
            self.guard()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
                self.linger()
            self.guard()

        def linger(self) -> None:
            """The answer went out before the request's body was read whole (an error: the body is too
            large, or not wanted): end the connection rather than wait for a body nobody reads. The
            write side is shut once the answer is sent (the client reads it, then the end); what the
            client still sends is read and dropped (closing with it unread would reset the connection,
            and the client could lose the answer), for at most LINGER_SECONDS."""
            self.lingering = True
            self.set_phase(None)
            self._unset_keepalive_if_required()
            self.flow.resume_reading()
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.guard_timer = self.loop.call_later(LINGER_SECONDS, self.transport.abort)

        def connection_lost(self, exc: Exception | None) -> None:
            self.set_phase(None)
            api.protocols.discard(self)
            super().connection_lost(exc)

        def guard(self) -> None:
            phase = None
            if not self.transport.is_closing() and not self.lingering:
                state = self.conn.their_state
                phase = "head" if state is h11.IDLE else "body" if state is h11.SEND_BODY else None
            if phase != self.guard_phase:
                self.set_phase(phase)

        def set_phase(self, phase: str | None) -> None:
            self.guard_phase = phase
            if self.guard_timer is not None:
                self.guard_timer.cancel()
                self.guard_timer = None
            api.heads.pop(self, None)
            if phase == "head":
                api.heads[self] = None
                self.guard_timer = self.loop.call_later(api.head_seconds, self.expire, phase)
            elif phase == "body":
                self.guard_timer = self.loop.call_later(api.body_seconds, self.expire, phase)

        def expire(self, phase: str) -> None:
            self.guard_timer = None
            if self.guard_phase != phase or self.transport.is_closing():
                return
            api.rate.note(f"timeout-{phase}", f"HTTP API: closed a connection whose request {phase} did not "
                          "arrive in time", seconds=api.head_seconds if phase == "head" else api.body_seconds)
            if phase == "head" and self.conn.our_state is h11.IDLE and self.conn.trailing_data[0]:
                self.transport.write(late)  # part of a head came: say why (an idle one is just closed)
            self.set_phase(None)
            self.transport.close()

    return GuardedH11
