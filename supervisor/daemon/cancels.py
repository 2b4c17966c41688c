"""Cancel requests (`POST /v1/turns/{id}/cancel`): which turns must end 'failed' with the error
CANCELLED, kept durably until they have.

The daemon's loop records a request, kills the turn's worker (if it has one) by recorded pid,
and once no worker holds the turn and it heads its session, gives it up well-formed: a call
that was dispatched gets a result saying its outcome is unknown, one that was not gets "not
run". The requests live in `PATH.daemon.cancels` (0600, fsynced, replaced atomically), so a
daemon killed between the request and its end still honours it on its next start.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Collection, Iterator

from hermes import private_files
from hermes.outcomes import CANCELLED  # noqa: F401  (the error of a turn ended by a cancel request)
from supervisor.daemon.inbox import cancels_path
from supervisor.daemon.log import log


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

    def _save(self) -> None:
        private_files.replace_file_durably(self.path, json.dumps({"turns": self._turns}))

    def __contains__(self, turn_id: object) -> bool:
        return turn_id in self._turns

    def __iter__(self) -> Iterator[str]:
        return iter(self._turns)

    def __len__(self) -> int:
        return len(self._turns)
