"""Which daemon of a fleet runs a session's turns: claims with an epoch and an expiry, on PostgreSQL.

Several daemons (on any hosts) share one store. A daemon *claims* a session before it starts a
worker for the session's next turn, and keeps the claim alive while it works (`renew_claims`);
a daemon that dies stops renewing, its claims expire, and another daemon takes the session over.

One row per session in ``session_claims`` (owner, epoch, expires_at). The server's clock decides
expiry (``clock_timestamp()``), so the daemons' clocks never need to agree. Taking a claim is one
statement that picks free sessions with ``FOR UPDATE SKIP LOCKED``: two daemons claiming at once
never wait for each other and never get the same session; a row another transaction holds is
simply left for the next pass. Every take bumps the epoch.

Fencing: a store that *holds* a claim (`hold_claim`) checks it, inside the same transaction, in
every write of that session and in ``acquire_lease`` (see ``connection``), by reading the claim
with the session's row locked. Once another daemon took the session over (a new epoch), the old
holder's writes fail with ``LeaseLostError`` and write nothing. The worker a daemon starts holds
its daemon's claim (`--claim`), so a worker started late by a daemon that lost the session cannot
take the session's lease from the worker of the daemon that owns it now.

Cancel requests (``turn_cancels``) live here too: any daemon of the fleet takes one, and the
daemon that holds the turn's session carries it out.
"""
from __future__ import annotations

import time
from typing import Any

from hermes.store.pg.connection import PgStorage
from hermes.store.pg.driver import psycopg

# The head of each session with work left, oldest first; the free claims among them.
_CLAIM_SQL = """
WITH heads AS (
    SELECT session_id, min(seq) AS first FROM turns
    WHERE state IN ('queued', 'running') GROUP BY session_id
), free AS (
    SELECT c.session_id, h.first FROM session_claims c JOIN heads h ON h.session_id = c.session_id
    WHERE c.expires_at < clock_timestamp() AND NOT (c.session_id = ANY(%(skip)s::text[]))
    ORDER BY h.first LIMIT %(limit)s
    FOR UPDATE OF c SKIP LOCKED
)
UPDATE session_claims c SET owner = %(owner)s, epoch = c.epoch + 1,
    expires_at = clock_timestamp() + make_interval(secs => %(ttl)s)
FROM free WHERE c.session_id = free.session_id
RETURNING c.session_id, c.epoch, free.first
"""

# Rows for sessions that have work and no claim row yet (a session is claimable once it has one).
_ADD_ROWS_SQL = """
INSERT INTO session_claims (session_id)
SELECT DISTINCT t.session_id FROM turns t
WHERE t.state IN ('queued', 'running')
  AND NOT EXISTS (SELECT 1 FROM session_claims c WHERE c.session_id = t.session_id)
ON CONFLICT (session_id) DO NOTHING
"""

_RENEW_SQL = """
UPDATE session_claims c SET expires_at = clock_timestamp() + make_interval(secs => %(ttl)s)
FROM unnest(%(sessions)s::text[], %(epochs)s::bigint[]) AS held(session_id, epoch)
WHERE c.session_id = held.session_id AND c.epoch = held.epoch AND c.owner = %(owner)s
RETURNING c.session_id
"""

_RELEASE_SQL = ("UPDATE session_claims SET owner = NULL, expires_at = '-infinity' "
                "WHERE session_id = %s AND owner = %s AND epoch = %s")


class PgClaims(PgStorage):
    """The fleet's claims on sessions, on a ``PgSessionDB``."""

    def claim_sessions(self, owner: str, ttl_s: float, limit: int, skip: list[str] | tuple[str, ...] = ()
                       ) -> list[tuple[str, int]]:
        """Claim up to `limit` sessions whose next turn waits and whose claim is free or expired, the
        oldest waiting first, none of `skip`; (session, epoch) of each, valid for `ttl_s` seconds."""
        if limit <= 0:
            return []
        self._execute_write(lambda cur: cur.execute(_ADD_ROWS_SQL))

        def take(cur: psycopg.Cursor[Any]) -> list[tuple[str, int]]:
            cur.execute(_CLAIM_SQL, {"owner": owner, "ttl": float(ttl_s), "limit": int(limit), "skip": list(skip)})
            return [(str(row[0]), int(row[1])) for row in sorted(cur.fetchall(), key=lambda r: r[2])]

        return self._execute_write(take)

    def renew_claims(self, owner: str, ttl_s: float, held: dict[str, int]) -> set[str]:
        """Extend the claims in `held` (session -> epoch) that are still ours; the sessions renewed.
        A claim that expired but that nobody took since is still ours (its epoch is unchanged)."""
        if not held:
            return set()

        def renew(cur: psycopg.Cursor[Any]) -> set[str]:
            sessions = list(held)
            cur.execute(_RENEW_SQL, {"ttl": float(ttl_s), "owner": owner, "sessions": sessions,
                                     "epochs": [held[s] for s in sessions]})
            return {str(row[0]) for row in cur.fetchall()}

        return self._execute_write(renew)

    def release_claim(self, session_id: str, owner: str, epoch: int) -> bool:
        """Give the session back at once (its next turn, if any, is free to claim); False when it was
        no longer ours."""
        def release(cur: psycopg.Cursor[Any]) -> bool:
            cur.execute(_RELEASE_SQL, (session_id, owner, epoch))
            return cur.rowcount == 1

        self._claims.pop(session_id, None)
        return self._execute_write(release)

    def hold_claim(self, session_id: str, owner: str, epoch: int) -> None:
        """From now on every write of this store to `session_id` checks that (owner, epoch) is still
        its claim, inside the write's transaction (see the module's docstring)."""
        self._claims[session_id] = (owner, int(epoch))

    def drop_claim(self, session_id: str) -> None:
        """Stop checking a claim on `session_id` (after releasing it, or once it was lost)."""
        self._claims.pop(session_id, None)

    def list_claims(self) -> list[dict[str, Any]]:
        """Every live claim: session, owner, epoch and the seconds it has left (by the server's clock)."""
        return self._read(
            "SELECT session_id, owner, epoch, "
            "extract(epoch FROM expires_at - clock_timestamp())::float8 AS expires_in "
            "FROM session_claims WHERE owner IS NOT NULL AND expires_at > clock_timestamp() "
            'ORDER BY session_id COLLATE "C"')

    # --------------------------------------------------------- cancel requests
    def request_cancel(self, turn_id: str) -> bool:
        """Record that `turn_id` must end cancelled (durably); False when it already was, or is not
        a queued or running turn."""
        def write(cur: psycopg.Cursor[Any]) -> bool:
            cur.execute("INSERT INTO turn_cancels (turn_id, requested_at) SELECT id, %s FROM turns "
                        "WHERE id = %s AND state IN ('queued', 'running') ON CONFLICT (turn_id) DO NOTHING",
                        (time.time(), turn_id))
            return cur.rowcount == 1

        return self._execute_write(write)

    def cancel_requests(self) -> dict[str, str]:
        """turn id -> session of every cancel request whose turn has not ended yet."""
        rows = self._read("SELECT c.turn_id, t.session_id FROM turn_cancels c JOIN turns t ON t.id = c.turn_id "
                          "WHERE t.state IN ('queued', 'running')")
        return {str(r["turn_id"]): str(r["session_id"]) for r in rows}

    def forget_cancel(self, turn_id: str) -> None:
        """The turn ended: its request is carried out."""
        self._execute_write(lambda cur: cur.execute("DELETE FROM turn_cancels WHERE turn_id = %s", (turn_id,)))
