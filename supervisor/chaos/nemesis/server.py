"""Faults of the PostgreSQL server itself (``chaos --store postgres`` only): `pg-terminate`,
`pg-restart`, `pg-hang`.

Each is made at a flush boundary of a worker: at its first tool effect, where it has committed the
call's dispatch intent and waits for the supervisor's acknowledgement before the tool runs, its
connection idle between two transactions. The chosen faults take turns over the case's workers
that reach one, in the order of `FAULTS`: the first chosen at the first such worker, the next at
the next, one fault per worker (a batch of tools run at once reports several effects; only its
first meets a fault, so each fault meets a worker whose session is whole). So each is met on its
own, and every case meets each where its fault-free run did (whose trace is what its kill plan was
derived from), up to its planned kill; after it, `pg-restart`'s recovery restart takes the next
worker's effect and the others move one worker on.

* `pg-terminate`: ``pg_terminate_backend`` on every backend serving the case's database (the
  supervisor's own image reader aside). The worker's next statement meets a session the server
  ended: it must fail closed (``session_persistence_failed:connection``), and the case resumes the
  turn as after a kill.
* `pg-restart`: the server restarts as after a crash of it (immediate shutdown: SIGQUIT to the
  postmaster, its exit waited for, a new start replaying the WAL; ``PgCluster.restart``): during a
  turn, at its effect; and during a recovery, at the first effect of the worker that resumes a turn
  after the case's planned kill landed. No committed row may be lost, no turn left behind.
  A restart ends every session of the server, so a case with `pg-restart` runs on a server it has
  to itself while it runs (`server`; `Servers` keeps about one per job, handed from case to case,
  so a case does not pay for making one). On the campaign's shared server a restart would also
  fail the workers of the cases running beside it, at moments their plans never chose and no
  account of theirs records: those cases would no longer be what their plans (and fault-free
  runs) say they are, and their verdicts would judge something else than they name.
* `pg-hang`: the backend serving the worker is SIGSTOPped at the effect (seen idle first, waiting
  for its client, so it holds no lock another case could wait on), and the worker's next statement
  is never answered. The worker would cut the connection itself past its statement deadline
  (hermes.store.pg.deadline: the busy budget plus half a minute, tests/test_pg_deadline.py), far
  longer than a case should take, so the nemesis plays its supervisor: once the worker has
  outlived `HANG_S` it is killed (SIGKILL, counted apart as a
  ``server-hang`` death), and only then is the backend continued and seen gone, before anything
  reads the case's state again (`on_exit`): whatever the stopped backend still had to do with what
  its dead client sent is done (or undone) before the state is judged. A worker that ends on its
  own within `HANG_S` has its backend continued the same way. The case then resumes as after a kill.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

from supervisor.chaos.checker.deaths import NEMESIS, SERVER_HANG, death_causes
from supervisor.chaos.nemesis.family import EVERY_CASE, Nemesis
from supervisor.chaos.pgstore import POSTGRES, start_cluster

if TYPE_CHECKING:
    from supervisor.chaos.pgstore import CaseDatabase
    from supervisor.procs.pool import WorkerProcess
    from testkit.pgcluster import PgCluster

TERMINATE, RESTART, HANG = "pg-terminate", "pg-restart", "pg-hang"
HANG_S = 1.0        # how long a worker waits on its stopped backend before the nemesis kills it
SETTLE_S = 10.0     # bound on waiting for a backend to go idle, or to be gone
TERMINATE_WAIT_MS = 5000


class Servers:
    """The servers the campaign's `pg-restart` cases run on: each lent to one case at a time, made
    when none is free, stopped when the campaign closes (`Nemesis.open_resource`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: list[PgCluster] = []
        self._all: list[PgCluster] = []

    def lend(self) -> PgCluster:
        with self._lock:
            while self._free:
                server = self._free.pop()
                if server.running():
                    return server
        server = start_cluster()
        with self._lock:
            self._all.append(server)
        return server

    def give_back(self, server: PgCluster) -> None:
        with self._lock:
            if server.running():  # one that failed to come back from a restart is not lent again
                self._free.append(server)

    def close(self) -> None:
        with self._lock:
            servers, self._all, self._free = self._all, [], []
        for server in servers:
            server.stop()


class ServerFaults(Nemesis):
    FAULTS = (TERMINATE, RESTART, HANG)
    PLANNED = EVERY_CASE
    NEVER_REACHED = "fewer of the case's workers reached a tool effect than the faults chosen take turns over"
    STORES = (POSTGRES,)
    WHY_NOT_ON = "they act on the PostgreSQL server of a campaign run with --store postgres"

    def __init__(self, case: Any, chosen: tuple[str, ...], resource: Any = None) -> None:
        super().__init__(case, chosen, resource)
        self.order = [f for f in self.FAULTS if f in chosen]  # fault k at the k-th worker reaching a tool effect
        self.turns = 0
        self._met: set[int] = set()  # the workers whose first effect came (each meets one fault at most)
        self.own: PgCluster | None = None
        self._lock = threading.Lock()
        self._last_exit: tuple[int, bool] | None = None  # (incarnation, died of its planned kill)
        self._recovery_armed = False
        self._recovery_after: int | None = None  # armed: restart at the next effect of a worker started after this one
        self._hung: dict[int, tuple[list[int], threading.Event]] = {}  # incarnation -> (stopped backends, released)

    # ------------------------------------------------------------ the case's server
    @classmethod
    def open_resource(cls, chosen: tuple[str, ...]) -> Servers | None:
        return Servers() if RESTART in chosen else None

    def server(self) -> PgCluster | None:
        return self.own

    def setup(self) -> None:
        if RESTART in self.order:
            self.own = self.resource.lend() if self.resource is not None else start_cluster()

    def teardown(self) -> None:
        for backends, _released in list(self._hung.values()):  # whatever happened, nothing stays stopped
            _signal_all(backends, signal.SIGCONT)
        if self.own is not None:
            if self.resource is not None:
                self.resource.give_back(self.own)  # the case's database was dropped before this
            else:
                self.own.stop()

    @property
    def db(self) -> CaseDatabase:
        assert self.case.pg is not None, "server faults need the case's PostgreSQL database"
        return self.case.pg

    # ------------------------------------------------------------ at a tool effect
    def on_effect(self) -> None:
        with self._lock:
            proc = self.case.reporting_worker()
            if proc is None or proc.incarnation in self._met:
                return
            self._met.add(proc.incarnation)
            if self._recovery_after is not None and proc.incarnation > self._recovery_after:
                # The recovery's restart takes this worker; the turns of the others move one worker on.
                self._recovery_after = None
                fault, moment = RESTART, "recovery"
            else:
                self.turns += 1
                fault = self.order[self.turns - 1] if self.turns <= len(self.order) else None
                moment = "turn"
        if fault == TERMINATE:
            self._terminate()
        elif fault == HANG:
            self._hang(proc)
        elif fault == RESTART:
            self._restart(moment)

    def _terminate(self) -> None:
        backends = self.db.backends()
        with self.db.admin() as conn:
            ended = [pid for pid in backends
                     if conn.execute("SELECT pg_terminate_backend(%s, %s)", (pid, TERMINATE_WAIT_MS)).fetchone()[0]]
        self.case.history.record("server_fault", fault=TERMINATE, backends=backends, terminated=ended)
        if ended:
            self.case.account(TERMINATE, landed=True)
        else:
            self.case.account(TERMINATE, landed=False, reason="no backend served the case's database at the effect")

    def _restart(self, moment: str) -> None:
        assert self.own is not None
        started = time.monotonic()
        self.own.restart("immediate")  # before the ack: the worker's next statement meets the new server
        self.case.history.record("server_fault", fault=RESTART, moment=moment, pid=self.own.pid,
                                 seconds=round(time.monotonic() - started, 3))
        self.case.account(RESTART, landed=True)

    def _hang(self, proc: WorkerProcess) -> None:
        backends = self.db.backends()
        idle = _wait_idle(self.db, backends)
        if not backends or not idle:
            why = "no backend served the case's database" if not backends else "the worker's backend did not go idle"
            self.case.account(HANG, landed=False, reason=why)
            return
        _signal_all(backends, signal.SIGSTOP)
        released = threading.Event()
        self._hung[proc.incarnation] = (backends, released)
        self.case.history.record("server_fault", fault=HANG, phase="stopped", incarnation=proc.incarnation,
                                 backends=backends, seconds=HANG_S)
        self.case.account(HANG, landed=True)
        threading.Thread(target=self._watch, args=(proc, backends, released), daemon=True,
                         name=f"pg-hang {self.case.case.case_id}").start()

    def _watch(self, proc: WorkerProcess, backends: list[int], released: threading.Event) -> None:
        """The hung worker's supervisor: kill it once it outlived HANG_S, then continue its backend."""
        try:
            on_its_own = proc.wait(HANG_S)
            if not on_its_own and proc.kill(SERVER_HANG):
                self.case.history.record("kill", incarnation=proc.incarnation, pid=proc.pid, signal=signal.SIGKILL,
                                         by=SERVER_HANG, probe=None)
            _signal_all(backends, signal.SIGCONT)
            gone = _wait_gone(self.db, backends)  # its client is dead either way: it ends too
            self.case.history.record("server_fault", fault=HANG, phase="continued", incarnation=proc.incarnation,
                                     worker_ended_on_its_own=on_its_own, backends_gone=gone)
        finally:
            released.set()

    # ------------------------------------------------------------ around the kills
    def on_exit(self, proc: WorkerProcess) -> None:
        hung = self._hung.pop(proc.incarnation, None)
        if hung is not None and not hung[1].wait(HANG_S + 2 * SETTLE_S):
            _signal_all(hung[0], signal.SIGCONT)  # never left stopped, even by a watcher that went astray
        self._last_exit = (proc.incarnation, death_causes(self.case.history.events).get(proc.incarnation) == NEMESIS)
        if self._recovery_after is not None and proc.incarnation > self._recovery_after:
            self._recovery_after = None  # the worker resuming after the kill ran no tool effect
            self.case.account(RESTART, landed=False, reason="the worker resuming after the kill ran no tool effect")

    def after_kill(self, turn_index: int, state: str | None) -> str | None:
        """Arm the recovery restart after the first planned kill that leaves a turn to resume."""
        if RESTART in self.order and not self._recovery_armed and state == "running" and self._last_exit is not None:
            killed, planned = self._last_exit
            if planned:
                self._recovery_armed = True
                self._recovery_after = killed  # every worker started from now on has a later incarnation
        return state


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass  # gone already (ended with its client)


def _wait_idle(db: CaseDatabase, pids: list[int]) -> bool:
    """Until every backend in `pids` waits for its client between transactions (bounded)."""
    deadline = time.monotonic() + SETTLE_S
    with db.admin() as conn:
        while True:
            busy = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s) AND NOT "
                                "(state = 'idle' AND wait_event = 'ClientRead')", (pids,)).fetchone()[0]
            if not busy:
                return True
            if time.monotonic() > deadline:
                return False
            threading.Event().wait(0.005)


def _wait_gone(db: CaseDatabase, pids: list[int]) -> bool:
    """Until none of the backends in `pids` is left on the server (bounded)."""
    deadline = time.monotonic() + SETTLE_S
    with db.admin() as conn:
        while True:
            left = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)).fetchone()[0]
            if not left:
                return True
            if time.monotonic() > deadline:
                return False
            threading.Event().wait(0.005)
