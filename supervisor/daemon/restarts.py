"""The daemon's restart policy: what a worker's death means for its turn.

A worker that ends while its turn is still unfinished is replaced after a jittered
exponential backoff (per turn: base * 2^(n-1), times a random factor in [0.5, 1], capped),
n growing with each death since the turn last made durable progress. Uptime says nothing
about progress; durable rows do: K consecutive attempts without a single new row of the
turn is a crash loop, and the turn is given up with a reason a person can act on. A worker
killed from outside before it reported reaching the turn did not attempt it and is not
counted towards K.

Two limits hold across restarts, since they are counted on the turn's row: the worker
starts (``attempts``, counted by the daemon before each start) and the model calls
(``model_calls``, counted by the runtime before each call, which refuses a call over the
limit: `--max-model-calls`). A turn that reaches either is
given up too (`limit_reason`); the attempts limit also ends a turn whose every worker dies
after saving something, which the crash-loop rule alone would retry forever.
"""
from __future__ import annotations

import collections
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Collection

if TYPE_CHECKING:
    from supervisor.procs.pool import WorkerProcess

ENDED_NOTES_KEPT = 256  # ended turns whose restart bookkeeping `status` still shows


@dataclass
class TurnNotes:
    """The daemon's bookkeeping for one turn (published in the status file)."""

    spawns: int = 0
    crashes: int = 0          # worker deaths with the turn still unfinished
    no_progress: int = 0      # consecutive attempts at the turn after which it had no new durable row
    unstarted: int = 0        # consecutive workers killed from outside before they reached the turn
    last_error: str | None = None
    give_up: str | None = None  # set when the turn must be failed (retried if the write fails)

    def to_json(self) -> dict[str, Any]:
        return {"spawns": self.spawns, "crashes": self.crashes, "no_progress": self.no_progress,
                "last_error": self.last_error}


@dataclass
class Lease:
    """A turn handed to a worker."""

    session: str
    turn: str
    rows_at_start: int
    state_at_start: str
    proc: WorkerProcess = None  # type: ignore[assignment]  # set once the worker is started
    started: float = field(default_factory=time.monotonic)
    started_wall: float = field(default_factory=time.time)
    killed_for: str | None = None     # "timeout", "drain" or "cancel" when the daemon killed it
    reached: bool = False             # the worker reported a probe: it was working on the turn
    outcome: dict[str, Any] | None = None
    stderr: collections.deque = field(default_factory=lambda: collections.deque(maxlen=8))
    message_file: Path | None = None  # the turn's text, handed to the worker; removed once it exits


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def attempted(lease: Lease) -> bool:
    """Does this death count as an attempt at the turn (towards a crash loop)?

    Yes when the worker was working on the turn (it reported a probe), when it
    crashed by itself (any signal but an outside kill, e.g. SIGSEGV or SIGABRT),
    when it exited saying it could not finish, or when it ran out of time. No only
    when it was killed from outside (SIGKILL, SIGTERM, SIGINT) before it reached
    the turn: that says nothing about the turn.
    """
    if lease.reached or lease.killed_for == "timeout":
        return True
    return lease.proc.signal not in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)


class RestartPolicy:
    """Per unfinished turn, its notes; per session, when it may be leased again."""

    def __init__(self, crash_limit: int, backoff_base: float, backoff_max: float, turn_timeout: float) -> None:
        self.crash_limit = crash_limit
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.turn_timeout = turn_timeout
        self.notes: dict[str, TurnNotes] = {}         # unfinished turn id -> bookkeeping
        # Ended turns that needed more than one worker, newest last (bounded), for `status`.
        self.ended_notes: collections.OrderedDict[str, TurnNotes] = collections.OrderedDict()
        self.retry_at: dict[str, float] = {}          # session -> monotonic time it may be leased again

    # ------------------------------------------------------------ bookkeeping
    def notes_for(self, turn_id: str) -> TurnNotes:
        return self.notes.setdefault(turn_id, TurnNotes())

    def restore(self, turns: dict[str, Any]) -> None:
        """Take over the notes a previous daemon published for its turns."""
        for turn_id, notes in turns.items():
            self.notes[turn_id] = TurnNotes(spawns=int(notes.get("spawns", 0)), crashes=int(notes.get("crashes", 0)),
                                            no_progress=int(notes.get("no_progress", 0)),
                                            last_error=notes.get("last_error"))

    def forget(self, turn_id: str) -> None:
        notes = self.notes.pop(turn_id, None)
        if notes is not None and (notes.spawns > 1 or notes.crashes):
            self.ended_notes[turn_id] = notes
            while len(self.ended_notes) > ENDED_NOTES_KEPT:
                self.ended_notes.popitem(last=False)

    def keep_only(self, open_turns: Collection[str]) -> None:
        """Forget the notes of every turn not in `open_turns` (they ended under a previous daemon)."""
        for turn_id in [t for t in self.notes if t not in open_turns]:
            self.forget(turn_id)

    def turn_ended(self, session: str, turn_id: str) -> None:
        self.retry_at.pop(session, None)
        self.forget(turn_id)

    def status(self) -> dict[str, dict[str, Any]]:
        turns = {t: n.to_json() for t, n in self.ended_notes.items()}
        turns.update((t, n.to_json()) for t, n in self.notes.items() if n.spawns)
        return turns

    # ----------------------------------------------------------------- timing
    def backoff(self, n: int) -> float:
        return min(self.backoff_max, self.backoff_base * 2 ** (max(1, n) - 1)) * random.uniform(0.5, 1.0)

    def retry_later(self, session: str, n: int) -> float:
        """Keep `session` from being leased for the n-th backoff; returns the delay."""
        delay = self.backoff(n)
        self.retry_at[session] = time.monotonic() + delay
        return delay

    def waiting(self, session: str, now: float) -> bool:
        """Is `session` still in its backoff?"""
        return self.retry_at.get(session, 0.0) > now

    def retry_waits(self, now: float, leased: Collection[str]) -> list[float]:
        """Seconds until each session not leased now may be leased again."""
        return [t - now for s, t in self.retry_at.items() if s not in leased]

    # --------------------------------------------------------------- a death
    def describe_end(self, lease: Lease) -> str:
        proc = lease.proc
        if lease.killed_for == "timeout":
            return f"the worker (pid {proc.pid}) ran longer than {self.turn_timeout:g}s and was killed"
        if proc.signal is not None:
            return f"the worker (pid {proc.pid}) was killed by {_signal_name(proc.signal)}"
        outcome = lease.outcome or {}
        said = outcome.get("error") or outcome.get("note") or outcome.get("failure_reason")
        if not said and lease.stderr:
            said = lease.stderr[-1]
        return (f"the worker (pid {proc.pid}) exited with status {proc.returncode} without finishing the turn"
                + (f": {said}" if said else ""))

    def after_death(self, lease: Lease, notes: TurnNotes, progressed: bool, why: str) -> float | None:
        """Count a worker's death before its turn ended. Returns the backoff before the turn's
        next worker, or None when this was a crash loop (then `notes.give_up` says why)."""
        notes.crashes += 1
        notes.last_error = why
        if progressed:
            notes.no_progress = notes.unstarted = 0
        elif attempted(lease):
            notes.no_progress += 1
            notes.unstarted = 0
        else:
            notes.unstarted += 1  # killed from outside while starting up: the turn was not attempted
        if notes.no_progress >= self.crash_limit:
            notes.give_up = self._give_up_reason(lease, notes, why)
            return None
        return self.retry_later(lease.session, 1 + notes.no_progress + notes.unstarted)

    def start_failed(self, session: str, notes: TurnNotes, exc: Exception) -> bool:
        """A worker for the turn could not be started. True when the turn must be given up
        (its own arguments cannot be passed, K times in a row); else it waits a backoff."""
        if isinstance(exc, ValueError):  # the turn's own arguments cannot be passed: its attempt failed
            notes.no_progress += 1
            notes.last_error = f"could not start a worker for this turn: {exc}"
            if notes.no_progress >= self.crash_limit:
                notes.give_up = (f"{notes.no_progress} attempts in a row could not even start a worker for "
                                 f"this turn ({exc}). Submit the message again in a form that can be passed.")
                return True
        self.retry_later(session, 1 + notes.no_progress + notes.unstarted)
        return False

    def _give_up_reason(self, lease: Lease, notes: TurnNotes, why: str) -> str:
        crashed = lease.proc.signal is not None or lease.killed_for == "timeout"
        what = "died" if crashed else "ended without finishing it"
        last_log = next((line for line in reversed(lease.stderr) if line.strip()), None)
        reason = (f"crash loop: {notes.no_progress} workers in a row {what} before this turn saved anything new "
                  f"(last: {why}). The daemon stopped retrying it so that the later turns of session "
                  f"{lease.session!r} can run.")
        if last_log:
            reason += f" Last worker log line: {last_log[:300]}"
        reason += " Fix the cause (see the worker logs for this turn), then submit the message again."
        return reason


def limit_reason(turn: dict[str, Any], *, max_attempts: int, max_model_calls: int, last: str | None = None,
                 answered: bool = False) -> str | None:
    """Why `turn` (its row) may not get another worker, or None while it is within its limits.
    `answered`: the turn already holds its final answer (a worker needs no model call to end it)."""
    attempts, calls = int(turn.get("attempts") or 0), int(turn.get("model_calls") or 0)
    session = turn["session_id"]
    later = f"The daemon stopped retrying it so that the later turns of session {session!r} can run."
    if calls >= max_model_calls and not answered:
        return (f"model-call limit: this turn has made {calls} model calls (the limit is {max_model_calls}, "
                f"over all its workers) without reaching an answer. {later} The transcript so far is kept; "
                "submit a narrower request, or raise --max-model-calls (limits.max_model_calls).")
    if attempts >= max_attempts:
        return (f"attempt limit: {attempts} workers were started for this turn (the limit is {max_attempts}) and "
                f"none finished it" + (f" (last: {last})" if last else "") + f". {later} Look at the worker "
                "logs for this turn and fix the cause, then submit the message again (or raise --max-attempts, "
                "limits.max_attempts).")
    return None
