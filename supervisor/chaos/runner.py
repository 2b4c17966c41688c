"""The runner: one case, end to end. Spawn a worker, observe it, kill it as planned, restart it
until its turn ends, let the nemesis do its rounds, then check the durable state.

The runner talks to its workers over their control channels: every projection and every
tool effect is looked up in the database while the worker waits for its acknowledgement
(supervisor.chaos.observe), and everything seen goes into the case's history, which the
checker judges once the case is over.
"""
from __future__ import annotations

import json
import shlex
import signal
import sqlite3
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

import psutil

from hermes.private_files import make_private_dirs, write_private
from hermes.state import StorageError, open_snapshot
from supervisor.chaos.checker import Durable, check_case
from supervisor.chaos.checker.deaths import NEMESIS, count_deaths, death_causes
from supervisor.chaos.checker.files import list_modes
from supervisor.chaos.checker.kills import planned_kills
from supervisor.chaos.checker.trajectories import TRAJECTORIES
from supervisor.chaos.conversation import is_generated, scenario_named
from supervisor.chaos.generator import Case, case_file_stem
from supervisor.chaos.history import CaseHistory, HistoryWriter, snapshot_and_ask, summarize_rows
from supervisor.chaos.nemesis import Fault
from supervisor.chaos.nemesis.accounting import account
from supervisor.chaos.nemesis.family import Nemesis, chosen
from supervisor.chaos import own_tools
from supervisor.chaos.observe import Observer
from supervisor.chaos.pgstore import POSTGRES, CaseDatabase, Databases, create_database
from supervisor.chaos.result import CaseResult
from supervisor.chaos.scenarios import MODEL, SESSION, Scenario
from supervisor.procs.pool import Pool, WorkerProcess
from targetkit import registry
from targetkit.target import as_worker_args

if TYPE_CHECKING:
    from supervisor.chaos.config import CampaignConfig

AGENT_HOME = "hermes-home"  # beside the database: where the case's agent keeps its files
PAUSE_SEEN_S = 5.0  # how long a SIGSTOPped worker may take to show as stopped
WORKER_BUSY_BUDGET_S = 2.0
WORKER_TIMEOUT_S = 20.0  # the worker's model request timeout


def _claim_dir(root: Path, stem: str) -> Path:
    """A new directory for one run of a case: `stem`, or `stem~N` when that case already
    ran (random mode may draw a case twice; two runs must never share files)."""
    make_private_dirs(root)
    for n in range(1, 1_000_000):
        path = root / (stem if n == 1 else f"{stem}~{n}")
        try:
            path.mkdir(mode=0o700)
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"no free directory for case {stem} under {root}")


class CaseRunner:
    """Runs one case against a shared model server and process pool (and, with ``--store postgres``,
    a database of the campaign's PostgreSQL server, from `databases`: see supervisor.chaos.pgstore)."""

    BUSY_BUDGET_S = WORKER_BUSY_BUDGET_S  # the workers' busy budget (a fault that holds the lock outlasts it)
    UNREAD = object()  # a snapshot's read of a turn state that failed: read it again on its own

    def __init__(self, case: Case, root: Path, base_url: str, pool: Pool, sink: HistoryWriter | None,
                 config: CampaignConfig, on_log: Callable[[WorkerProcess, bytes], None] | None = None,
                 resources: Mapping[type[Nemesis], Any] | None = None, databases: Databases | None = None) -> None:
        self.case = case
        self.scenario: Scenario = scenario_named(case.scenario)
        self.target = registry.get(config.target)
        self.dir = _claim_dir(root, case_file_stem(case.case_id))
        self.config = config
        # The families of --faults this case meets, each acting at the hooks it needs
        # (supervisor.chaos.nemesis.family); `resources`: what the campaign keeps for them.
        self.nemeses: list[Nemesis] = [family(self, faults, (resources or {}).get(family))
                                       for family, faults in chosen(config.faults)]
        self._kill_hooks = [n for n in self.nemeses if type(n).on_kill is not Nemesis.on_kill]
        # Where the case's state lives: its directory, or where a family puts it (a lazy file system).
        state = next((d for d in (n.state_dir() for n in self.nemeses) if d is not None), self.dir)
        self.db = state / "state.db"  # on PostgreSQL: where the final image of its database goes
        self.ledger = state / "effects.db"
        self.databases = databases
        self.pg: CaseDatabase | None = None  # the case's database, made when it runs (`--store postgres`)
        self.base_url = base_url
        self.pool = pool
        self.on_log = on_log
        self.history = CaseHistory(case.case_id, sink)
        self.observer = Observer(self.db, self.target.reader(),
                                 images=self.durable_state if config.store == POSTGRES else None)
        self._reporting = threading.local()  # the worker whose report this thread is handling
        self._incarnations = 0
        self._where: dict[int, tuple[int, int]] = {}  # incarnation -> (turn, process)
        self._paused = threading.Event()
        self._running: set[int] = set()  # incarnations of this case's workers not yet reaped
        self._procs: dict[int, WorkerProcess] = {}  # incarnation -> its process, for a power cut to kill all
        self._sigkills = 0  # workers of this case that died of SIGKILL, whatever killed them
        # What the last snapshot read while no worker ran, with how many workers had started then:
        # (that count, turn index, the turn's state) and (that count, the durable state).
        self._state_seen: tuple[int, int, str | None] | None = None
        self._durable_seen: tuple[int, Durable] | None = None

    # -------------------------------------------------------------- observing
    def _on_message(self, proc: WorkerProcess, msg: dict[str, Any]) -> None:
        self._reporting.proc = proc
        try:
            self._observe(proc, msg)
        except Exception as exc:  # a harness failure must neither hang the worker nor pass unseen
            self.history.record("harness_error", incarnation=proc.incarnation, message_type=msg.get("type"),
                                error=f"{type(exc).__name__}: {exc}")
            if "seq" in msg:
                proc.send({"type": "ack", "seq": msg["seq"]})

    def _observe(self, proc: WorkerProcess, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        if kind == "hello":
            self.history.record("hello", incarnation=proc.incarnation, pid=msg.get("pid"))
        elif kind == "probe":
            self._on_probe(proc, msg)
        elif kind == "ui":
            self._on_ui(proc, msg)
        elif kind == "effect":
            self._on_effect(proc, msg)
        elif kind == "outcome":
            self._on_outcome(proc, msg)

    def _on_probe(self, proc: WorkerProcess, msg: dict[str, Any]) -> None:
        inc = proc.incarnation
        mode = msg.get("mode")
        self.history.record("probe", incarnation=inc, name=msg["name"], n=msg["n"], ctx=msg.get("ctx", {}),
                            kill=bool(msg.get("kill")), **({"mode": mode} if msg.get("kill") else {}))
        for nemesis in self.nemeses:
            nemesis.on_probe(proc, msg["name"])
        if not msg.get("kill"):
            return
        if mode == "pause":
            self._paused.set()
        elif mode == "interrupt":
            self.history.record("kill", incarnation=inc, pid=proc.pid, signal=signal.SIGINT, by="self",
                                probe=f"{msg['name']}:{msg['n']}")
        elif mode == "external":
            proc.kill("supervisor")
            self.history.record("kill", incarnation=inc, pid=proc.pid, signal=signal.SIGKILL,
                                by="supervisor", probe=f"{msg['name']}:{msg['n']}")
        else:
            self.history.record("kill", incarnation=inc, pid=proc.pid, signal=signal.SIGKILL, by="self",
                                probe=f"{msg['name']}:{msg['n']}")

    def _on_ui(self, proc: WorkerProcess, msg: dict[str, Any]) -> None:
        ui_kind = msg.get("kind")
        fields: dict[str, Any] = {"kind": ui_kind, "turn": msg.get("turn")}
        if ui_kind == "tool_complete":
            fields.update(tool_call_id=msg.get("tool_call_id"), content=msg.get("content"))
        else:
            fields["text"] = msg.get("text")
        if ui_kind == "stream_end":
            fields["outcome"] = msg.get("outcome")
        # Streamed deltas and retractions are provisional by contract (checker: stream-honesty);
        # everything else shown must already be durable, and is looked up while the worker waits.
        if ui_kind != "stream" and not (ui_kind == "stream_end" and msg.get("outcome") != "commit"):
            durable, witness = self.observer.ui(msg)
            fields.update(durable=durable, witness=witness)
        self.history.record("ui", incarnation=proc.incarnation, **fields)
        proc.send({"type": "ack", "seq": msg["seq"]})

    def _on_effect(self, proc: WorkerProcess, msg: dict[str, Any]) -> None:
        request, intent, witness = self.observer.effect(msg)
        for nemesis in self.nemeses:
            nemesis.on_effect()
        self.history.record("effect", incarnation=proc.incarnation, tool=msg.get("tool"), policy=msg.get("policy"),
                            tool_call_id=msg.get("tool_call_id"), turn=msg.get("turn"),
                            idempotency_key=msg.get("idempotency_key"), request_durable=request,
                            intent_durable=intent, witness=witness)
        proc.send({"type": "ack", "seq": msg["seq"]})

    def _on_outcome(self, proc: WorkerProcess, msg: dict[str, Any]) -> None:
        result = msg.get("result") or {}
        shown: dict[str, Any] = {}
        if result.get("outcome") == "completed" and result.get("final_response") is not None:
            # The final answer is a projection too: the worker reports it after its commit.
            durable, witness = self.observer.answer(result.get("session"), result.get("turn_id"),
                                                    result.get("final_response"))
            shown = {"durable": durable, "witness": witness}
        self.history.record("outcome", incarnation=proc.incarnation, result=result, **shown)
        if "seq" in msg:  # the worker holds its database open until this ack
            proc.send({"type": "ack", "seq": msg["seq"]})

    def _repro_flags(self) -> tuple[str, ...]:
        flags = []
        if is_generated(self.case.scenario):  # its conversation is found again by drawing the campaign's
            flags.append(f"--mode generated --seed {self.config.seed} --runs {self.config.runs}")
        if self.target.name != registry.DEFAULT:
            flags.append(f"--target {self.target.name}")
        if self.config.target_options:
            flags.append(shlex.join(as_worker_args(dict(self.config.target_options))))
        if self.config.faults:
            flags.append(f"--faults {','.join(self.config.faults)}")
        if self.config.synchronous != "FULL":
            flags.append(f"--synchronous {self.config.synchronous}")
        if self.config.call_ids != "fresh":
            flags.append(f"--call-ids {self.config.call_ids}")
        if self.config.store == POSTGRES:
            flags.append("--store postgres")
        flags += own_tools.repro_flags(self.config)
        return tuple(flags)

    # ---------------------------------------------------------------- running
    def _fault_for(self, turn: int, process: int) -> Fault | None:
        fault = self.case.fault
        while fault is not None:
            if fault.turn == turn and fault.process == process:
                return fault
            fault = fault.then
        return None

    def worker_args(self, command: str, db: Path, ledger: Path, url: str,
                     busy_budget: float = WORKER_BUSY_BUDGET_S) -> list[str]:
        timeout = WORKER_TIMEOUT_S
        for nemesis in self.nemeses:
            timeout = nemesis.worker_timeout(timeout)
        where = ["--store", self.pg.url] if self.pg is not None else ["--db", str(db)]
        args = [command, *where, "--session", SESSION, "--base-url", url, "--model", MODEL,
                "--ledger", str(ledger), "--timeout", str(timeout), "--busy-budget", str(busy_budget),
                *self.scenario.extra_args(command), *own_tools.worker_args(self.config)]
        if self.config.synchronous != "FULL":
            args += ["--synchronous", self.config.synchronous]
        if self.target.name != registry.DEFAULT:
            args += ["--target", self.target.name]
        else:  # the agent's own files (spilled results, its trajectory log) live with the case's state, on its disk
            args += ["--home", str(db.parent / AGENT_HOME), "--save-trajectories"]
        return args + as_worker_args(dict(self.config.target_options))

    def spawn(self, command: str, turn_index: int, process: int, fault: Fault | None,
               busy_budget: float = WORKER_BUSY_BUDGET_S) -> WorkerProcess:
        turn = self.scenario.turns[turn_index]
        url = self._model_url() if process >= 0 else self.base_url  # a storage-fault worker never gets far
        args = self.worker_args(command, self.db, self.ledger, url, busy_budget)
        if command == "run":
            args += [*self._message_args(turn_index, turn.message), "--turn-id", f"turn-{turn_index}"]
        if fault is not None:
            args += fault.worker_args()
        self._incarnations += 1
        inc = self._incarnations
        self._where[inc] = (turn_index, process)
        proc = self.pool.spawn(args, incarnation=inc, on_message=self._on_message, on_log=self.on_log,
                               label=self.case.case_id, cwd=self.dir)  # the tools' relative paths are the case's
        self._running.add(inc)
        self._procs[inc] = proc
        self.history.record("spawn", incarnation=inc, pid=proc.pid, create_time=proc.create_time, command=command,
                            turn_index=turn_index, turn_id=f"turn-{turn_index}", process=process,
                            kill_at=fault.point if fault else None, kill_mode=fault.kind if fault else None)
        if fault is not None and fault.kind == "timer":
            def fire() -> None:
                if proc.kill("timer"):
                    self.history.record("kill", incarnation=inc, pid=proc.pid, signal=signal.SIGKILL, by="timer",
                                        probe=None)
            timer = threading.Timer(fault.delay_ms / 1000.0, fire)
            timer.daemon = True
            timer.start()
        return proc

    def _message_args(self, turn_index: int, message: str | list[dict[str, Any]]) -> list[str]:
        """The worker arguments that give it turn `turn_index`'s message: from a private file of the
        case's directory, never the command line (which every user of the machine can read)."""
        path = self.dir / f"message-{turn_index}.{'txt' if isinstance(message, str) else 'json'}"
        if not path.exists():
            write_private(path, message if isinstance(message, str) else json.dumps(message, ensure_ascii=False))
        return ["--message-file", str(path), *([] if isinstance(message, str) else ["--message-format", "json"])]

    def _model_url(self) -> str:
        """The model endpoint for the next worker (a family may give it another: `refused`)."""
        url = self.base_url
        for nemesis in self.nemeses:
            url = nemesis.model_url(url)
        return url

    def account(self, fault: str, landed: bool, reason: str | None = None) -> None:
        """Write down what became of a planned fault of `--faults` (supervisor.chaos.nemesis.accounting)."""
        self.history.record("fault", fault=fault, landed=landed, **({"reason": reason} if reason else {}))

    def finish(self, proc: WorkerProcess, snapshot: bool = True) -> None:
        if not proc.wait(self.config.process_timeout):
            proc.kill("timeout")
            self.history.record("kill", incarnation=proc.incarnation, pid=proc.pid, signal=signal.SIGKILL,
                                by="timeout", probe=None)
            proc.wait()
        self.history.record("exit", incarnation=proc.incarnation, pid=proc.pid, returncode=proc.returncode,
                            signal=proc.signal)
        for nemesis in self.nemeses:
            nemesis.on_exit(proc)
        self._running.discard(proc.incarnation)
        self._procs.pop(proc.incarnation, None)
        cut = False
        if self._kill_hooks and death_causes(self.history.events).get(proc.incarnation) == NEMESIS:
            # Before anything reads the files again: a family may take the exit snapshot itself (a power cut).
            cut = any([nemesis.on_kill(proc) for nemesis in self._kill_hooks])
        if not self._running:
            # No connection of ours may outlive the last worker: the next worker must be the
            # database's first connection, so that it, like a restarted process in production,
            # recovers whatever the dead one committed to the WAL (a live reader would keep the
            # dead writer's wal-index, and the next writer would overwrite that last commit).
            self.observer.close()
        if proc.signal == signal.SIGKILL:
            self._sigkills += 1
        if snapshot and not cut:
            self.snapshot("exit", self._where[proc.incarnation][0])

    def snapshot(self, after: str, turn_index: int | None = None) -> None:
        """Record every row as it is now; with `turn_index`, also read that turn's state from the
        same copy, which `turn_state` then answers with while no worker has run since."""
        question = None if turn_index is None else (lambda conn: self.read_turn_state(conn, turn_index))
        self._state_seen = self._durable_seen = None
        try:
            with self.durable_state() as path:
                durable, state = snapshot_and_ask(path, question)
        except StorageError as exc:
            # The case goes on, unjudged: one database the supervisor cannot read is that case's
            # failure to observe, not the campaign's (its other cases are judged as ever).
            self.history.record("harness_error", error=f"snapshot after {after}: {exc}")
            return
        self.record_snapshot(after, durable, turn_index, state)

    def record_snapshot(self, after: str, durable: Durable, turn_index: int | None, state: Any) -> None:
        self.history.record("snapshot", after=after, rows={str(k): v for k, v in summarize_rows(durable).items()})
        if not self._running:
            self._durable_seen = (self._incarnations, durable)
            if turn_index is not None and state is not self.UNREAD:
                self._state_seen = (self._incarnations, turn_index, state)

    def read_turn_state(self, conn: sqlite3.Connection, turn_index: int) -> str | None | object:
        try:
            return self.target.turn_state(conn, SESSION, f"turn-{turn_index}")
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return None  # killed before the schema was committed: nothing has started
            return self.UNREAD  # `turn_state` reads it again, and says what is wrong

    def turn_state(self, turn_index: int) -> str | None:
        """The turn's durable state now, read from a private copy of the database: the view a
        recovering worker gets, since the observer is closed whenever a worker exits. What the
        last snapshot read while no worker ran is still what a copy would read if none has run
        since, so that one answers."""
        seen = self._state_seen
        if seen is not None and not self._running and seen[:2] == (self._incarnations, turn_index):
            return seen[2]
        with self.durable_state() as path:
            return self._read_turn_state(path, turn_index)

    def _read_turn_state(self, path: Path, turn_index: int) -> str | None:
        if not path.exists():
            return None
        try:
            conn = open_snapshot(path)
        except StorageError:
            return None  # created, not yet a database: nothing has started
        try:
            return self.target.turn_state(conn, SESSION, f"turn-{turn_index}")
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return None  # killed before the schema was committed: nothing has started
            raise
        finally:
            conn.close()

    @contextmanager
    def durable_state(self) -> Iterator[Path]:
        """The file to read the case's durable state from now: its SQLite database, or on PostgreSQL
        a fresh image of its database (removed after the block; supervisor.chaos.pgstore)."""
        if self.pg is None:
            yield self.db
            return
        with self.pg.image() as path:
            yield path

    # ------------------------------------------------------- for the nemeses
    @property
    def sigkills(self) -> int:
        """Workers of this case that died of SIGKILL so far, whatever killed them."""
        return self._sigkills

    def reporting_worker(self) -> WorkerProcess | None:
        """The worker whose report is being handled on this thread (in `on_effect`: the one that waits)."""
        return getattr(self._reporting, "proc", None)

    def running_workers(self) -> list[WorkerProcess]:
        """This case's workers not yet reaped, oldest first."""
        return [self._procs[inc] for inc in sorted(self._running)]

    def turn_of(self, incarnation: int) -> int:
        return self._where[incarnation][0]

    def next_incarnation(self) -> int:
        """A number for a process started outside the case's own workers (a twin recovery)."""
        self._incarnations += 1
        return self._incarnations

    def forget_seen(self) -> None:
        """What the last snapshot read is stale (the files changed under it)."""
        self._state_seen = self._durable_seen = None

    def _take_over_while_paused(self, old: WorkerProcess, turn_index: int, process: int) -> int:
        """SIGSTOP the paused worker, let a new one finish the turn, then SIGCONT the old one."""
        sent = old.signal_group(signal.SIGSTOP)
        self.history.record("pause", incarnation=old.incarnation, pid=old.pid, stopped=sent and _seen_stopped(old))
        newer = self.spawn("resume", turn_index, process, self._fault_for(turn_index, process))
        self.finish(newer)
        old.signal_group(signal.SIGCONT)
        old.send({"type": "continue"})
        self.history.record("cont", incarnation=old.incarnation, pid=old.pid)
        return process + 1

    # ------------------------------------------------------------------ a case
    def run(self) -> CaseResult:
        ready: list[Nemesis] = []
        try:
            for nemesis in self.nemeses:
                nemesis.setup()
                ready.append(nemesis)
            if self.config.store == POSTGRES:
                self._create_database()
            return self._run()
        finally:
            try:
                if self.pg is not None:
                    # Its final image is the case's state.db, kept with the case when it fails: the
                    # database itself would go with the campaign's server anyway.
                    self._drop_database(self.pg)
            finally:
                for nemesis in reversed(ready):  # whatever happened: mounts unmounted, storage mended
                    nemesis.teardown()

    def _create_database(self) -> None:
        """The case's own database, on a server of its own if a family gives it one (pg-restart)."""
        own = next((s for s in (n.server() for n in self.nemeses) if s is not None), None)
        if own is not None:
            pg = CaseDatabase(own, self.dir, create_database(own))
        elif self.databases is not None:
            pg = CaseDatabase(self.databases.cluster, self.dir, self.databases.take())
        else:
            raise RuntimeError("--store postgres: the campaign has no PostgreSQL server for this case")
        self.pg = pg
        self.history.record("store", engine=POSTGRES, database=pg.name)

    def _drop_database(self, pg: CaseDatabase) -> None:
        if self.databases is not None and pg.cluster is self.databases.cluster:
            pg.close_images()
            self.databases.give_back(pg.name)  # dropped on the campaign's own time
            return
        left = pg.drop()  # now: a server lent to this case is lent to another next
        if left is not None:
            self.history.record("store", engine=POSTGRES, database=pg.name, not_dropped=left)

    def _run(self) -> CaseResult:
        started = time.monotonic()
        restarts = 0
        for turn_index in range(len(self.scenario.turns)):
            restarts += self._run_turn(turn_index)
        promises = self.target.promises_for(dict(self.config.target_options))
        if promises.private_files:  # listed before the supervisor writes there (a PostgreSQL image)
            try:
                self.history.record("files", entries=list_modes(self.db.parent))
            except OSError as exc:
                self.history.record("harness_error", error=f"listing {self.db.parent.name}: {exc}")
        events = self.history.events
        # The state the last snapshot read is the final one if no worker has started since it.
        seen = self._durable_seen
        final = seen[1] if seen is not None and not self._running and seen[0] == self._incarnations else self.db
        if self.pg is not None:  # the server's state now, imaged where a SQLite case keeps its file
            final = self.pg.image_to(self.db, durable=True)
        trajectories = self.db.parent / AGENT_HOME / TRAJECTORIES if self.target.name == registry.DEFAULT else None
        verdict = check_case(final, self.ledger, events, self.scenario.expectation(), planned=self.case.fault,
                             promises=promises, trajectories=trajectories)
        self.observer.close()
        trace = [(*self._where[e["incarnation"]], e["name"], e["n"]) for e in events
                 if e["type"] == "probe" and self._where[e["incarnation"]][1] >= 0]
        fired = [f"{e['name']}:{e['n']}" for e in events if e["type"] == "probe" and e.get("kill")]
        kills, other_deaths = count_deaths(events)
        faults = account(events, self.config.faults, kills_planned=_kills_planned(self.case.fault))
        return CaseResult(self.case, verdict, kills, restarts, time.monotonic() - started, trace, fired,
                          frozenset(sys.intern(name) for (_t, _p, name, _n) in trace), self._repro_flags(),
                          _first_span_ms(events), other_deaths=other_deaths, faults=faults,
                          directory=self.dir.name, synchronous=self.config.synchronous, power=power_counts(events),
                          planned_kills=[k.to_json() for k in planned_kills(events, self.case.fault)])

    def _run_turn(self, turn_index: int) -> int:
        """Run one turn until it ends or the restarts run out; returns how many of its workers were killed."""
        process, command, attempts, restarts = 0, "run", 0, 0
        while True:
            fault = self._fault_for(turn_index, process)
            self._paused.clear()
            proc = self.spawn(command, turn_index, process, fault)
            process += 1
            if fault is not None and fault.kind == "pause":
                while not proc.exited.is_set() and not self._paused.wait(0.05):
                    pass
                if self._paused.is_set():
                    process = self._take_over_while_paused(proc, turn_index, process)
            self.finish(proc)
            killed = proc.signal == signal.SIGKILL
            restarts += killed
            state = self.turn_state(turn_index)
            if killed:  # the rounds the families play with the worker down (storage first, then recovery)
                for nemesis in self.nemeses:
                    state = nemesis.after_kill(turn_index, state)
            if state in ("done", "failed"):
                return restarts
            attempts += 1
            if attempts > self.config.max_restarts:
                return restarts  # turn-liveness reports the turn that never ended
            # Killed mid-turn, or fenced off by a newer worker: finish the turn from the database.
            # Never started (killed before its first commit): start it again.
            command = "resume" if state == "running" else "run"


def power_counts(events: list[dict[str, Any]]) -> dict[str, int]:
    """A case's power cuts: how many, how many dropped unsynced writes (a torn write's lost tail
    included), the writes dropped whole, the cuts that tore a write, the rows they lost. Empty without any."""
    cuts = [e for e in events if e["type"] == "power_cut"]
    if not cuts:
        return {}
    return {"cuts": len(cuts), "cuts_dropping": sum(1 for e in cuts if e.get("dropped_writes") or e.get("torn")),
            "dropped_writes": sum(int(e.get("dropped_writes") or 0) for e in cuts),
            "torn": sum(1 for e in cuts if e.get("torn")), "rows_lost": sum(len(e.get("lost_rows") or {}) for e in cuts)}


def _kills_planned(fault: Fault | None) -> bool:
    """Does the plan kill a worker (a pause stops one, and the faults applied after a kill never come)?"""
    while fault is not None:
        if fault.kind != "pause":
            return True
        fault = fault.then
    return False


def _seen_stopped(proc: WorkerProcess) -> bool:
    """Did the SIGSTOPped worker really stop? Its state is polled until it shows, briefly bounded."""
    deadline = time.monotonic() + PAUSE_SEEN_S
    while not proc.exited.is_set():
        try:
            if psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED:
                return True
        except psutil.Error:
            return False
        if time.monotonic() > deadline:
            return False
        proc.exited.wait(0.001)
    return False


def _first_span_ms(events: list[dict[str, Any]]) -> int:
    """How long the case's first worker lived, spawn to reaped exit, in milliseconds."""
    spawned = next((e for e in events if e["type"] == "spawn"), None)
    if spawned is None:
        return 0
    ended = next((e for e in events if e["type"] == "exit" and e.get("incarnation") == spawned["incarnation"]), None)
    return int(round(((ended or spawned)["t"] - spawned["t"]) * 1000))
