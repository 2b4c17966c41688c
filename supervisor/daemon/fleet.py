"""One daemon of a fleet: the sessions it has claimed on a shared PostgreSQL store.

Any number of daemons, on any hosts, serve one PostgreSQL store (`serve --store URL`). Before a
daemon starts a worker for a session's next turn it claims the session
(``PgSessionDB.claim_sessions``: `FOR UPDATE SKIP LOCKED`, a new epoch, an expiry by the server's
clock); while it holds the claim it renews it every third of its time to live, and it gives it
back once the session has nothing left to run. A daemon that dies stops renewing: its claims
expire and the other daemons take its sessions over, resuming their interrupted turns.

Every write a daemon makes to a session it holds (counting an attempt, giving a turn up) and
every write of the worker it starts (`--claim EPOCH:OWNER`) checks the claim inside its own
transaction (``hermes.store.pg.claims``), so a daemon that lost a session — paused past its claim's
expiry, cut off from the server — can no longer change it, and its worker stops at its next write.
"""
from __future__ import annotations

import os
import socket
import time
import uuid
from typing import TYPE_CHECKING

from supervisor.daemon.log import info, warn

if TYPE_CHECKING:
    from hermes.store.pg.sessiondb import PgSessionDB

DEFAULT_CLAIM_TTL_S = 10.0


def owner_name() -> str:
    """This daemon's name in the claims: host, pid, and a random part (a pid is reused, a host renamed)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Fleet:
    """The sessions this daemon holds (session -> claim epoch), kept alive and given back."""

    def __init__(self, db: PgSessionDB, ttl_s: float = DEFAULT_CLAIM_TTL_S, owner: str | None = None) -> None:
        self.db = db
        self.ttl_s = ttl_s
        self.owner = owner or owner_name()
        self.held: dict[str, int] = {}
        self._next_renewal = 0.0

    def claim_argument(self, session: str) -> str:
        """The worker's `--claim` for `session` (held)."""
        return f"{self.held[session]}:{self.owner}"

    def renew_due(self, now: float) -> float:
        """Seconds until the claims must be renewed (0: now)."""
        return max(0.0, self._next_renewal - now) if self.held else self.ttl_s

    def renew(self) -> set[str]:
        """Renew every claim held when a third of its time has passed; the sessions lost (taken over
        by another daemon after this one missed renewals), which this daemon must stop working on."""
        now = time.monotonic()
        if not self.held or now < self._next_renewal:
            return set()
        kept = self.db.renew_claims(self.owner, self.ttl_s, dict(self.held))
        # From the moment the request was sent: the server may have extended the claim a while later.
        self._next_renewal = now + self.ttl_s / 3
        lost = set(self.held) - kept
        for session in lost:
            warn("lost the claim on a session to another daemon; stopping its worker", session=session,
                 epoch=self.held[session])
            self._forget(session)
        return lost

    def claim(self, limit: int) -> list[str]:
        """Claim up to `limit` more sessions with a turn to run."""
        if limit <= 0:
            return []
        if not self.held:
            self._next_renewal = time.monotonic() + self.ttl_s / 3
        taken = self.db.claim_sessions(self.owner, self.ttl_s, limit, sorted(self.held))
        for session, epoch in taken:
            self.held[session] = epoch
            self.db.hold_claim(session, self.owner, epoch)
            info("claimed session", session=session, epoch=epoch)
        return [session for session, _ in taken]

    def release(self, session: str) -> None:
        """Give `session` back (nothing of it left to run here)."""
        epoch = self.held.pop(session, None)
        if epoch is None:
            return
        self.db.release_claim(session, self.owner, epoch)

    def release_all(self) -> None:
        """On a clean stop: every claim given back at once, so another daemon need not wait for expiry."""
        for session in list(self.held):
            try:
                self.release(session)
            except Exception as exc:  # the server is gone: the claims expire on their own
                warn("could not give a claim back; it expires by itself", session=session, error=str(exc))
                self._forget(session)

    def _forget(self, session: str) -> None:
        self.held.pop(session, None)
        self.db.drop_claim(session)
