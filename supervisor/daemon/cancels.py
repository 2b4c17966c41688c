"""Cancel requests (`POST /v1/turns/{id}/cancel`): which turns must end 'failed' with the error
CANCELLED, kept durably until they have.

The daemon's loop records a request, kills the turn's worker (if it has one) by recorded pid,
and once no worker holds the turn and it heads its session, gives it up well-formed: a call
that was dispatched gets a result saying its outcome is unknown, one that was not gets "not
run". The requests live in `PATH.daemon.cancels` (0600, fsynced, replaced atomically), so a
daemon killed between the request and its end still honours it on its next start.

A fleet keeps its requests in the shared PostgreSQL store instead (`FleetCancelRequests`): any
daemon takes a request, and whichever holds the turn's session carries it out, seeing it at its
next pass (`refresh`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Collection, Iterator

from hermes import private_files
from hermes.outcomes import CANCELLED  # noqa: F401  (the error of a turn ended by a cancel request)
from supervisor.daemon.inbox import cancels_path
from supervisor.daemon.log import log

if TYPE_CHECKING:
    from hermes.store.pg.sessiondb import PgSessionDB


class CancelRequests:
    """turn id -> session, of the cancel requests not carried out yet; every change is saved."""

    def __init__(self, db_path: Path) -> None:
        self.path = cancels_path(db_path)
        self._turns: dict[str, str] = {}

    def load(self, unfinished: Collection[str]) -> None:
        """Read what a previous daemon left, keeping only the turns still unfinished."""
        try:
            turns = json.loads(self.path.read_text(encoding="utf-8")).get("turns") or {}
        except (OSError, ValueError, AttributeError):
            turns = {}
        if not isinstance(turns, dict):
            turns = {}
        self._turns = {str(t): str(s) for t, s in turns.items() if str(t) in unfinished}

    def add(self, turn_id: str, session: str) -> bool:
        """Record a request durably; False when it was already recorded."""
        if turn_id in self._turns:
            return False
        self._turns[turn_id] = session
        self._save()
        return True

    def forget(self, turn_id: str) -> None:
        """The turn ended: its request is carried out."""
        if self._turns.pop(turn_id, None) is not None:
            try:
                self._save()
            except OSError as exc:  # it only costs a look at an ended turn on the next start
                log.error("could not rewrite the cancel requests: %s", exc)

    def refresh(self) -> None:
        """Requests made elsewhere since (a fleet's); this daemon's file has only its own."""

    def _save(self) -> None:
        private_files.replace_file_durably(self.path, json.dumps({"turns": self._turns}))

    def __contains__(self, turn_id: object) -> bool:
        return turn_id in self._turns

    def __iter__(self) -> Iterator[str]:
        return iter(self._turns)

    def __len__(self) -> int:
        return len(self._turns)


class FleetCancelRequests(CancelRequests):
    """The cancel requests of a fleet, in its PostgreSQL store (`turn_cancels`); cached per pass."""

    def __init__(self, db: PgSessionDB) -> None:
        self.db = db
        self._turns = {}

    def load(self, unfinished: Collection[str]) -> None:
        self.refresh()

    def refresh(self) -> None:
        self._turns = self.db.cancel_requests()

    def add(self, turn_id: str, session: str) -> bool:
        added = self.db.request_cancel(turn_id)
        self._turns[turn_id] = session
        return added

    def forget(self, turn_id: str) -> None:
        if self._turns.pop(turn_id, None) is not None:
            try:
                self.db.forget_cancel(turn_id)
            except Exception as exc:  # an ended turn's request is never looked at again
                log.error("could not remove a carried-out cancel request: %s", exc)
