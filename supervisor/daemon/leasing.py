"""Which worker runs which turn: the daemon's leasing of turns to workers.

Each pass of the daemon's loop hands the oldest unfinished turn of each idle session to a new
worker (`lease`), up to `workers` at once; hears each worker's messages, log lines and exit
(`on_message`, `on_log`, `on_exit`: from the workers' reader and reaper threads, which only touch
the lease they find and the exit queue); and, once a worker is gone, restarts its turn after a
backoff or gives it up (`collect_exits`: supervisor.daemon.restarts, supervisor.daemon.giving_up).
A turn over its time is killed (`check_timeouts`); a cancel request is recorded durably and the
turn's worker killed (`cancel`: supervisor.daemon.cancels).

In a fleet (supervisor.daemon.fleet) a daemon first claims sessions in the shared store, up to its
`workers`, and leases turns of the sessions it holds only; it renews its claims, kills the worker
of a session another daemon took over, and gives a session back once nothing of it is left to run.

The daemon owns the database, the launcher, the restart policy, the cancel requests, the counters
and the status file; a lease changes them through `self.daemon`.
"""
from __future__ import annotations

import os
import queue
import time
from typing import TYPE_CHECKING, Any

from hermes import private_files
from supervisor.daemon import inbox
from supervisor.daemon.cancels import CANCELLED
from supervisor.daemon.giving_up import end_turn
from supervisor.daemon.log import info, log, warn, worker_line
from supervisor.daemon.restarts import Lease, TurnNotes, limit_reason
from supervisor.procs.pool import WorkerProcess
from worker.protocol import ChannelClosed

if TYPE_CHECKING:
    from supervisor.daemon.service import Daemon


class Leasing:
    """The daemon's leases: session -> the lease of its worker, and every worker by incarnation."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.leases: dict[str, Lease] = {}            # session -> its worker's lease
        self.by_incarnation: dict[int, Lease] = {}
        self.exits: queue.SimpleQueue[WorkerProcess] = queue.SimpleQueue()
        self.incarnation = 0

    # ----------------------------------------------------------- cancelling
    def cancel(self, turn_id: str) -> dict[str, Any]:
        """Record a cancel request durably, and kill the turn's worker if it has one (by recorded pid).

        The turn then ends like an interrupted one: when its worker has exited (or at once, when
        it is the head of its session and has none), `give_up` closes it well-formed, 'failed'
        with the error CANCELLED. A queued turn behind others of its session waits until it is
        the head, so it never runs and nothing is written into the turn before it.
        """
        assert self.daemon.db is not None
        turn = self.daemon.db.get_turn(turn_id)
        if turn is None:
            return {"found": False}
        out = {"found": True, "session": turn["session_id"], "state": turn["state"], "error": turn["error"]}
        if turn["state"] not in ("queued", "running"):
            return {**out, "cancelling": False}
        session = turn["session_id"]
        if self.daemon.cancels.add(turn_id, session):
            info("cancel requested", session=session, turn=turn_id, state=turn["state"])
        lease = self.leases.get(session)
        if lease is not None and lease.turn == turn_id and lease.killed_for is None:
            lease.killed_for = "cancel"
            lease.proc.kill("cancel")
        self.daemon.changed()
        return {**out, "cancelling": True}

    def give_up_cancelled(self) -> None:
        """End every cancelled turn that heads its session and has no worker."""
        for turn in inbox.session_heads(self.daemon.db):
            if (turn["id"] in self.daemon.cancels and turn["session_id"] not in self.leases
                    and self.holds(turn["session_id"])):
                notes = self.daemon.restarts.notes_for(turn["id"])
                notes.give_up = CANCELLED
                self.give_up(turn["id"], turn["session_id"], notes)

    # ------------------------------------------------------- worker events
    def on_message(self, proc: WorkerProcess, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        if kind == "probe":
            lease = self.by_incarnation.get(proc.incarnation)
            if lease is not None:
                lease.reached = True
        elif kind == "outcome":
            lease = self.by_incarnation.get(proc.incarnation)
            if lease is not None:
                lease.outcome = msg.get("result")
            self.daemon.metrics.note_outcome(msg.get("result"))
        proc.acknowledge(msg)  # after the outcome is noted: the worker holds its database until then

    def on_log(self, proc: WorkerProcess, line: bytes) -> None:
        text = line.decode("utf-8", "replace").rstrip()
        if not text:
            return
        lease = self.by_incarnation.get(proc.incarnation)
        if lease is not None:
            lease.stderr.append(text)
        worker_line(text, proc.pid, lease.session if lease else None, lease.turn if lease else None)

    def on_exit(self, proc: WorkerProcess) -> None:  # a reaper thread
        self.exits.put(proc)
        self.daemon.wakeup.wake()

    # -------------------------------------------------------------- leasing
    def lease(self) -> None:
        fleet = self.daemon.fleet
        if fleet is not None:
            self.keep_claims()
        self.daemon.cancels.refresh()  # a fleet's requests, taken by any of its daemons
        if self.daemon.cancels:
            self.enforce_cancels()
            self.give_up_cancelled()
        if fleet is not None:  # take free sessions up to the workers this daemon may run
            fleet.claim(self.daemon.config.workers - len(fleet.held))
        if len(self.leases) >= self.daemon.config.workers and fleet is None:
            return
        now = time.monotonic()
        heads = inbox.session_heads(self.daemon.db)
        for turn in heads:
            if len(self.leases) >= self.daemon.config.workers:
                break
            session = turn["session_id"]
            if (session in self.leases or self.daemon.restarts.waiting(session, now)
                    or turn["id"] in self.daemon.cancels or not self.holds(session)):
                continue
            notes = self.daemon.restarts.notes_for(turn["id"])
            if notes.give_up is None:
                notes.give_up = self.over_limit(turn, notes.last_error)
            if notes.give_up is not None:
                self.give_up(turn["id"], session, notes)
                continue
            self.spawn(turn, notes)
        if fleet is not None:  # a held session with nothing left to run goes back to the fleet
            waiting = {t["session_id"] for t in heads}
            for session in [s for s in fleet.held if s not in self.leases and s not in waiting]:
                fleet.release(session)
                self.daemon.changed()

    def holds(self, session: str) -> bool:
        """May this daemon start work on `session`? Always, alone on a SQLite file; in a fleet, only
        on the sessions it has claimed."""
        fleet = self.daemon.fleet
        return fleet is None or session in fleet.held

    def keep_claims(self) -> None:
        """Renew the fleet claims; the worker of a session another daemon took over is killed (it
        would fail its next write anyway: the fencing check)."""
        assert self.daemon.fleet is not None
        for session in self.daemon.fleet.renew():
            lease = self.leases.get(session)
            if lease is not None and lease.killed_for is None:
                lease.killed_for = "claim lost"
                lease.proc.kill("claim-lost")
            self.daemon.changed()

    def enforce_cancels(self) -> None:
        """Kill the worker of every turn with a cancel request (made through this daemon or, in a
        fleet, through another one)."""
        for lease in self.leases.values():
            if lease.turn in self.daemon.cancels and lease.killed_for is None:
                lease.killed_for = "cancel"
                lease.proc.kill("cancel")

    def over_limit(self, turn: dict[str, Any], last: str | None = None) -> str | None:
        """Why `turn` may get no other worker (its attempts or model calls), or None."""
        assert self.daemon.db is not None
        config = self.daemon.config
        limits = {"max_attempts": config.max_attempts, "max_model_calls": config.max_model_calls}
        if limit_reason(turn, **limits, last=last) is None:
            return None
        answered = inbox.final_answer(self.daemon.db, turn) is not None  # a worker would only mark it done
        return limit_reason(turn, **limits, last=last, answered=answered)

    def spawn(self, turn: dict[str, Any], notes: TurnNotes) -> None:
        db, launcher = self.daemon.db, self.daemon.launcher
        assert db is not None and launcher is not None
        session, turn_id = turn["session_id"], turn["id"]
        rows = db.count_turn_rows(session, turn_id)
        self.incarnation += 1
        message_file = launcher.message_file(self.incarnation)
        # Registered before the worker exists: its first log lines and its outcome find their lease.
        lease = self.by_incarnation[self.incarnation] = Lease(
            session, turn_id, rows, turn["state"], message_file=message_file)
        try:
            private_files.write_private(message_file, turn["user_text"] or "")
            db.add_turn_attempt(turn_id)  # durably, before the worker exists
            try:
                claim = self.daemon.fleet.claim_argument(session) if self.daemon.fleet is not None else None
                proc = launcher.spawn(launcher.argv(session, turn_id, message_file, claim), self.incarnation,
                                      self.on_message, self.on_log, self.on_exit)
            except BaseException:
                db.add_turn_attempt(turn_id, -1)  # no worker started
                raise
        except (OSError, ChannelClosed, ValueError) as exc:
            self.by_incarnation.pop(self.incarnation, None)
            message_file.unlink(missing_ok=True)
            log.error("could not start a worker: %s", exc, extra={"fields": {"session": session, "turn": turn_id}})
            if self.daemon.restarts.start_failed(session, notes, exc):
                self.daemon.metrics.crash_loops += 1
                self.give_up(turn_id, session, notes)
                return
            launcher.replace_pool_if_broken()
            return
        lease.proc = proc
        self.leases[session] = lease
        notes.spawns += 1
        self.daemon.totals["spawned"] += 1
        self.daemon.changed()
        info("leased turn", session=session, turn=turn_id, state=turn["state"], worker_pid=proc.pid,
             attempt=notes.spawns)

    # ---------------------------------------------------------------- exits
    def collect_exits(self) -> None:
        while True:
            try:
                proc = self.exits.get_nowait()
            except queue.Empty:
                return
            lease = self.by_incarnation.get(proc.incarnation)
            if lease is None:
                continue
            assert self.daemon.db is not None
            try:
                turn = self.daemon.db.get_turn(lease.turn)
            except Exception:
                # The store is out of reach (a PostgreSQL server restarting): this exit is looked at
                # again on a later pass, its lease kept meanwhile, so its restart and crash count are
                # decided once the turn's state can be read, and no other worker starts before.
                self.exits.put(proc)
                raise
            del self.by_incarnation[proc.incarnation]
            if lease.message_file is not None:
                lease.message_file.unlink(missing_ok=True)
            if self.leases.get(lease.session) is lease:
                del self.leases[lease.session]
            self.daemon.changed()
            self.daemon.totals["worker_deaths"] += proc.returncode != 0
            self.after_exit(lease, turn)

    def after_exit(self, lease: Lease, turn: dict[str, Any] | None) -> None:
        """What the end of `lease`'s worker means for its turn (`turn`: its row, read after the exit)."""
        assert self.daemon.db is not None
        notes = self.daemon.restarts.notes_for(lease.turn)
        fields = {"session": lease.session, "turn": lease.turn, "worker_pid": lease.proc.pid,
                  "returncode": lease.proc.returncode, "seconds": round(time.monotonic() - lease.started, 3)}
        if not self.holds(lease.session):  # another daemon took the session over: its turns are its now
            self.daemon.restarts.turn_ended(lease.session, lease.turn)
            info("worker stopped: the session was taken over by another daemon", **fields)
            return
        if turn is None or turn["state"] in ("done", "failed"):
            self.daemon.restarts.turn_ended(lease.session, lease.turn)
            self.daemon.totals["turns_ended"] += 1
            self.daemon.cancels.forget(lease.turn)
            info("turn ended", state=turn["state"] if turn else "unknown", **fields)
            return
        if lease.turn in self.daemon.cancels:  # ended like an interrupt: closed well-formed, failed "cancelled"
            notes.give_up = CANCELLED
            info("worker stopped for a cancel request", **fields)
            self.give_up(lease.turn, lease.session, notes)
            return
        why = self.daemon.restarts.describe_end(lease)
        if lease.killed_for == "drain":
            info("worker stopped by the drain; the turn stays running and resumes on next start", **fields)
            return
        rows = self.daemon.db.count_turn_rows(lease.session, lease.turn)
        progressed = rows > lease.rows_at_start or turn["state"] != lease.state_at_start
        delay = self.daemon.restarts.after_death(lease, notes, progressed, why)
        if delay is None:  # a crash loop: notes.give_up says why
            self.daemon.metrics.crash_loops += 1
            self.give_up(lease.turn, lease.session, notes)
            return
        notes.give_up = self.over_limit(turn, why)
        if notes.give_up is not None:
            self.give_up(lease.turn, lease.session, notes)
            return
        self.daemon.metrics.worker_restarts += 1
        warn("worker ended before its turn did; restarting after backoff", why=why, progressed=progressed,
             reached_turn=lease.reached, rows=rows, crashes=notes.crashes, without_progress=notes.no_progress,
             backoff=round(delay, 3), **fields)

    def give_up(self, turn_id: str, session: str, notes: TurnNotes) -> None:
        """End the turn 'failed' for `notes.give_up`, its dangling tool calls answered, so the
        transcript stays well-formed and the session's later turns can run."""
        assert self.daemon.db is not None and notes.give_up is not None
        reason = notes.give_up
        try:
            owner = self.daemon.fleet.owner if self.daemon.fleet is not None else f"daemon:{os.getpid()}"
            ended = end_turn(self.daemon.db, turn_id, reason, owner=owner)
        except Exception as exc:  # e.g. storage busy: keep the decision, try again after a backoff
            log.error("could not record the failure of turn %s: %s", turn_id, exc,
                      extra={"fields": {"session": session}})
            self.daemon.restarts.retry_later(session, notes.crashes)
            return
        notes.give_up = None
        self.daemon.restarts.turn_ended(session, turn_id)
        self.daemon.cancels.forget(turn_id)
        self.daemon.changed()
        if ended and reason == CANCELLED:
            self.daemon.metrics.cancelled += 1
            self.daemon.totals["turns_ended"] += 1
            info("turn cancelled", session=session, turn=turn_id)
        elif ended:
            self.daemon.totals["turns_given_up"] += 1
            self.daemon.totals["turns_ended"] += 1
            log.error("turn failed: %s", reason, extra={"fields": {"session": session, "turn": turn_id}})

    def check_timeouts(self) -> None:
        now = time.monotonic()
        for lease in list(self.leases.values()):
            if lease.killed_for is None and now - lease.started > self.daemon.config.turn_timeout:
                lease.killed_for = "timeout"
                lease.proc.kill("turn-timeout")
