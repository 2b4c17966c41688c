"""Chaos campaigns: enumerate cases, run each (run until killed -> restart -> resume -> check).

A case is one scenario run in a fresh directory (its own state.db and effects
ledger) with at most one fault plan. Modes:

    exhaustive  a fault-free run records every probe hit; one case per hit
    double      each exhaustive kill, paired with each kill point of its recovery
    random      seeded: probe kills drawn from the traces, and timer kills
    pause       SIGSTOP at each distinct probe, a new worker takes over, SIGCONT

Cases run on a thread pool (`jobs`); each case's worker processes are real OS
processes. Results stream to history.jsonl; only running cases stay in memory.
"""
from __future__ import annotations

import dataclasses
import json
import random
import shutil
import signal
import socket
import sqlite3
import sys
import tempfile
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import psutil

from hermes.state import StorageError, open_snapshot
from supervisor import observe
from supervisor.checker import NO_KILL, UNFIRED, Verdict, check_case, load_durable, twin_transcript
from supervisor.history import CaseHistory, HistoryWriter, snapshot_rows
from supervisor.modelserver import Reply, Script, ScriptedModelServer, request_key
from supervisor.nemesis import Fault, aimed_delay_ms, timer_fractions
from supervisor.pool import Pool, WorkerProcess
from supervisor.scenarios import SCENARIOS, Scenario, campaign_script
from supervisor.storage_faults import KINDS as STORAGE_FAULT_KINDS
from supervisor.storage_faults import STORAGE_FAULTS, StorageFault
from supervisor.targets import PROMISES

MODES = ("exhaustive", "double", "random", "pause")
# Faults added to every case on top of its kill plan (``--faults``).
# Model faults: the scripted model answers each distinct request wrongly once, the fault
# picked from the chosen ones by the request's content (so a case and its baseline meet the
# same faults). http500, http429, truncate (a cut body) and stall (no answer within the
# worker's timeout) are transient: the SDK's retries must absorb them without a duplicate
# row. not_json and empty_choices are not retried: the turn must end `failed` with its
# reason recorded and the transcript well-formed, and the next turn runs normally.
# `refused`: the first worker restarted after a kill finds the model endpoint refusing
# connections; its turn must end failed, named `model_error:connection`, nothing lost.
# `locked`: at the first tool effect of a case, another connection holds the database's write
# lock past the worker's patience, so its next flush fails closed as `locked`; the case must
# still end with the turn resumed and the transcript whole.
# Storage faults (disk, readonly, corrupt): see supervisor.storage_faults.
# `concurrent-resume`: after the first landed kill, CROWD resume workers start at once on the
# interrupted turn (checker: consume-once). `twin-recovery`: after the first landed kill, two
# byte-identical copies of the crashed state are each resumed by a worker of their own and
# must give the same transcript (checker: recovery-determinism).
MODEL_FAULTS = ("http500", "http429", "truncate", "stall", "not_json", "empty_choices")
RECOVERY_FAULTS = ("concurrent-resume", "twin-recovery")
FAULT_OPTIONS = (*MODEL_FAULTS, "refused", "locked", *STORAGE_FAULTS, *RECOVERY_FAULTS)
CROWD = 4
CROWD_BUSY_BUDGET_S = 10.0  # k writers contend for one lock: patience is not what is being tested
PAUSE_SEEN_S = 5.0  # how long a SIGSTOPped worker may take to show as stopped
STALL_WORKER_TIMEOUT_S = 1.0  # the worker's request timeout when `stall` is on (else 20 s)
STALL_S = 1.5  # how long a stalled request hangs: past that timeout, so the SDK retries
WORKER_BUSY_BUDGET_S = 2.0
SESSION = "chaos-session"
MODEL_REQUEST_LOG = 64  # requests the campaign's model server remembers (the checker reads the database)
MODEL = "scripted-model"


_refuser: socket.socket | None = None
_refuser_lock = threading.Lock()


def refusing_url() -> str:
    """A loopback model URL that refuses every connection: a port this process keeps bound
    (so nothing else can take it) and never listens on."""
    global _refuser
    with _refuser_lock:
        if _refuser is None:
            _refuser = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            _refuser.bind(("127.0.0.1", 0))
        port = _refuser.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def _claim_dir(root: Path, stem: str) -> Path:
    """A new directory for one run of a case: `stem`, or `stem~N` when that case already
    ran (random mode may draw a case twice; two runs must never share files)."""
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    for n in range(1, 1_000_000):
        path = root / (stem if n == 1 else f"{stem}~{n}")
        try:
            path.mkdir(mode=0o700)
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"no free directory for case {stem} under {root}")


def case_file_stem(case_id: str) -> str:
    """A file name for a case: stable, readable, and free of path separators."""
    return case_id.replace("/", "__").replace(":", "_")


@dataclass(frozen=True, slots=True)
class Case:
    scenario: str
    fault: Fault | None = None

    @property
    def case_id(self) -> str:
        return f"{self.scenario}/{self.fault.label() if self.fault else 'fault-free'}"

    def repro(self) -> str:
        return f"hermes-supervisor chaos --case '{self.case_id}'"

    @classmethod
    def parse(cls, case_id: str) -> "Case":
        scenario, _, label = case_id.partition("/")
        if scenario not in SCENARIOS:
            raise ValueError(f"case {case_id!r}: unknown scenario {scenario!r}")
        return cls(scenario, None if label in ("", "fault-free") else Fault.parse(label))


@dataclass(slots=True)
class CaseResult:
    case: Case
    verdict: Verdict
    kills: int
    restarts: int
    seconds: float
    # (turn, process, probe, n) of every probe hit, for enumerating further cases.
    trace: list[tuple[int, int, str, int]] = field(default_factory=list)
    fired: list[str] = field(default_factory=list)
    reached: frozenset[str] = frozenset()  # probe names this case hit (kept when the trace is dropped)
    flags: tuple[str, ...] = ()  # campaign options the case depends on (target, faults), for its repro
    span_ms: int = 0  # how long the case's first worker lived (a baseline's span aims timer kills)

    @property
    def no_kill(self) -> bool:
        """The case planned a fault that did not land (or never fired): it tested nothing."""
        return bool({NO_KILL, UNFIRED} & set(self.verdict.reasons))

    def repro(self) -> str:
        return " ".join((self.case.repro(), *self.flags))

    def to_json(self) -> dict[str, Any]:
        return {"case": self.case.case_id, "scenario": self.case.scenario,
                "fault": self.case.fault.label() if self.case.fault else None,
                "verdict": self.verdict.to_json(), "kills": self.kills, "no_kill": self.no_kill,
                "restarts": self.restarts, "seconds": round(self.seconds, 3), "fired": self.fired,
                "repro": self.repro()}


@dataclass
class CampaignConfig:
    scenarios: list[str]
    mode: str = "exhaustive"
    seed: int = 0
    runs: int = 50
    jobs: int = 2
    shard: tuple[int, int] = (1, 1)
    kill_modes: tuple[str, ...] = ("self",)
    workdir: Path | None = None
    keep: bool = False
    max_restarts: int = 8
    process_timeout: float = 60.0
    limit: int | None = None
    case_ids: tuple[str, ...] = ()
    forkserver: bool = True
    faults: tuple[str, ...] = ()  # extra nemesis faults on every case: see FAULT_OPTIONS
    case_files: Path | None = None  # when set, each case's result and history is written here as JSON
    probes: tuple[str, ...] = ()  # only derive cases whose first fault is at one of these probes
    target: str = "hermes"  # the agent under test: "hermes" (ours) or "hermes-agent" (upstream, worker.upstream)


class CaseRunner:
    """Runs one case against a shared model server and process pool."""

    def __init__(self, case: Case, root: Path, base_url: str, pool: Pool, sink: HistoryWriter | None,
                 config: CampaignConfig, on_log: Callable[[WorkerProcess, bytes], None] | None = None) -> None:
        self.case = case
        self.scenario: Scenario = SCENARIOS[case.scenario]
        self.dir = _claim_dir(root, case_file_stem(case.case_id))
        self.db = self.dir / "state.db"
        self.ledger = self.dir / "effects.db"
        self.base_url = base_url
        self.pool = pool
        self.config = config
        self.on_log = on_log
        self.history = CaseHistory(case.case_id, sink)
        self._conn_lock = threading.Lock()
        self._conn: Any = None
        self._incarnations = 0
        self._where: dict[int, tuple[int, int]] = {}  # incarnation -> (turn, process)
        self._paused = threading.Event()
        self._lock_fault_fired = False
        # Storage faults (see supervisor.storage_faults): one round each, after the first kill.
        self._storage_faults: list[StorageFault] = [STORAGE_FAULT_KINDS[name](self.dir) for name in config.faults
                                                    if name in STORAGE_FAULT_KINDS]
        self._storage_rounds_done = False
        self._refused_done = False
        self._crowd_done = False
        self._twin_done = False
        self._running: set[int] = set()  # incarnations of this case's workers not yet reaped
        self.kills = 0

    # -------------------------------------------------------------- observing
    def _readonly(self) -> Any:
        """The live reader (kept), or, at an instant it cannot be opened (a worker closing the
        database removes its -shm before its WAL), a one-off copy of the database as it is."""
        if self._conn is None:
            self._conn = observe.open_readonly(self.db)
        return self._conn if self._conn is not None else observe.open_copy(self.db)

    def _close_observer(self) -> None:
        with self._conn_lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _on_message(self, proc: WorkerProcess, msg: dict[str, Any]) -> None:
        try:
            self._observe(proc, msg)
        except Exception as exc:  # a harness failure must neither hang the worker nor pass unseen
            self.history.record("harness_error", incarnation=proc.incarnation, message_type=msg.get("type"),
                                error=f"{type(exc).__name__}: {exc}")
            if "seq" in msg:
                proc.send({"type": "ack", "seq": msg["seq"]})

    def _observe(self, proc: WorkerProcess, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        inc = proc.incarnation
        if kind == "hello":
            self.history.record("hello", incarnation=inc, pid=msg.get("pid"))
        elif kind == "probe":
            self.history.record("probe", incarnation=inc, name=msg["name"], n=msg["n"], ctx=msg.get("ctx", {}),
                                kill=bool(msg.get("kill")))
            if msg.get("kill"):
                mode = msg.get("mode")
                if mode == "pause":
                    self._paused.set()
                elif mode == "external":
                    proc.kill("supervisor")
                    self.history.record("kill", incarnation=inc, pid=proc.pid, signal=signal.SIGKILL,
                                        by="supervisor", probe=f"{msg['name']}:{msg['n']}")
                else:
                    self.history.record("kill", incarnation=inc, pid=proc.pid, signal=signal.SIGKILL, by="self",
                                        probe=f"{msg['name']}:{msg['n']}")
        elif kind == "ui":
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
                with self._conn_lock:
                    durable, witness = observe.ui_durability(self._readonly(), msg)
                fields.update(durable=durable, witness=witness)
            self.history.record("ui", incarnation=inc, **fields)
            proc.send({"type": "ack", "seq": msg["seq"]})
        elif kind == "effect":
            with self._conn_lock:
                request, intent, witness = observe.effect_durability(self._readonly(), msg)
            if "locked" in self.config.faults and not self._lock_fault_fired:
                self._lock_fault_fired = True
                self._hold_write_lock(WORKER_BUSY_BUDGET_S + 1.0)
            self.history.record("effect", incarnation=inc, tool=msg.get("tool"), policy=msg.get("policy"),
                                tool_call_id=msg.get("tool_call_id"), turn=msg.get("turn"),
                                idempotency_key=msg.get("idempotency_key"), request_durable=request,
                                intent_durable=intent, witness=witness)
            proc.send({"type": "ack", "seq": msg["seq"]})
        elif kind == "outcome":
            result = msg.get("result") or {}
            shown: dict[str, Any] = {}
            if result.get("outcome") == "completed" and result.get("final_response") is not None:
                # The final answer is a projection too: the worker reports it after its commit.
                with self._conn_lock:
                    durable, witness = observe.answer_durability(self._readonly(), result.get("session"),
                                                                 result.get("turn_id"), result.get("final_response"))
                shown = {"durable": durable, "witness": witness}
            self.history.record("outcome", incarnation=inc, result=result, **shown)

    def _repro_flags(self) -> tuple[str, ...]:
        flags = []
        if self.config.target != "hermes":
            flags.append(f"--target {self.config.target}")
        if self.config.faults:
            flags.append(f"--faults {','.join(self.config.faults)}")
        return tuple(flags)

    def _hold_write_lock(self, seconds: float) -> None:
        """Take the database's write lock now (before acking), and release it `seconds` later."""
        holder = sqlite3.connect(self.db, isolation_level=None, timeout=5.0, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")
        self.history.record("storage_fault", fault="locked", seconds=seconds)

        def release() -> None:
            holder.execute("ROLLBACK")
            holder.close()

        timer = threading.Timer(seconds, release)
        timer.daemon = True
        timer.start()

    # ---------------------------------------------------------------- running
    def _fault_for(self, turn: int, process: int) -> Fault | None:
        fault = self.case.fault
        while fault is not None:
            if fault.turn == turn and fault.process == process:
                return fault
            fault = fault.then
        return None

    def _worker_args(self, command: str, db: Path, ledger: Path, url: str,
                     busy_budget: float = WORKER_BUSY_BUDGET_S) -> list[str]:
        timeout = STALL_WORKER_TIMEOUT_S if "stall" in self.config.faults else 20.0
        args = [command, "--db", str(db), "--session", SESSION, "--base-url", url, "--model", MODEL,
                "--ledger", str(ledger), "--timeout", str(timeout), "--busy-budget", str(busy_budget),
                *self.scenario.extra_args(command)]
        if self.config.target != "hermes":
            args += ["--target", self.config.target]
        return args

    def _spawn(self, command: str, turn_index: int, process: int, fault: Fault | None,
               busy_budget: float = WORKER_BUSY_BUDGET_S) -> WorkerProcess:
        turn = self.scenario.turns[turn_index]
        url = self._model_url() if process >= 0 else self.base_url  # a storage-fault worker never gets far
        args = self._worker_args(command, self.db, self.ledger, url, busy_budget)
        if command == "run":
            args += ["--message", turn.message, "--turn-id", f"turn-{turn_index}"]
        if fault is not None:
            args += fault.worker_args()
        self._incarnations += 1
        inc = self._incarnations
        self._where[inc] = (turn_index, process)
        proc = self.pool.spawn(args, incarnation=inc, on_message=self._on_message, on_log=self.on_log,
                               label=self.case.case_id)
        self._running.add(inc)
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

    def _model_url(self) -> str:
        """The model endpoint for the next worker: under `refused`, the first one restarted
        after a kill gets a loopback port that nothing listens on."""
        if "refused" not in self.config.faults or self.kills == 0 or self._refused_done:
            return self.base_url
        self._refused_done = True
        url = refusing_url()
        self.history.record("model_fault", fault="refused", url=url)
        return url

    def _finish(self, proc: WorkerProcess, snapshot: bool = True) -> None:
        if not proc.wait(self.config.process_timeout):
            proc.kill("timeout")
            self.history.record("kill", incarnation=proc.incarnation, pid=proc.pid, signal=signal.SIGKILL,
                                by="timeout", probe=None)
            proc.wait()
        self.history.record("exit", incarnation=proc.incarnation, pid=proc.pid, returncode=proc.returncode,
                            signal=proc.signal)
        self._running.discard(proc.incarnation)
        if not self._running:
            # No connection of ours may outlive the last worker: the next worker must be the
            # database's first connection, so that it, like a restarted process in production,
            # recovers whatever the dead one committed to the WAL (a live reader would keep the
            # dead writer's wal-index, and the next writer would overwrite that last commit).
            self._close_observer()
        if proc.signal == signal.SIGKILL:
            self.kills += 1
        if snapshot:
            self._snapshot("exit")

    def _snapshot(self, after: str) -> None:
        self.history.record("snapshot", after=after, rows={str(k): v for k, v in snapshot_rows(self.db).items()})

    def _storage_fault_rounds(self, command: str, turn_index: int) -> None:
        """With the worker down: per storage fault, break the storage, start a worker that must
        fail closed on it (checker: fails-closed), then mend the storage exactly as it was."""
        self._storage_rounds_done = True
        for fault in self._storage_faults:
            if not self.db.exists():
                self.history.record("storage_fault", fault=fault.cause, phase="skipped",
                                    reason="the killed worker had not created the database yet")
                continue
            # Our own observer connection must not be open across the break: a worker that finds
            # itself the file's last connection checkpoints and deletes the WAL index, and a
            # connection that outlived that keeps reading a stale, unlinked copy of it.
            self._close_observer()
            what = fault.break_storage(self.db)
            # Process index -1: no kill plan is ever aimed at this worker (see _fault_for), and
            # its probe hits stay out of the traces further cases are derived from.
            proc = self._spawn(command, turn_index, -1, None)
            self.history.record("storage_fault", fault=fault.cause, phase="broken", what=what,
                                incarnation=proc.incarnation,
                                expect=f"session_persistence_failed:{fault.cause}")
            try:
                self._finish(proc, snapshot=False)  # a corrupt file cannot be snapshotted: after mending
            finally:
                fault.mend(self.db)
            self.history.record("storage_fault", fault=fault.cause, phase="mended", incarnation=proc.incarnation)
            self._snapshot("mend")

    def _turn_state(self, turn_index: int) -> str | None:
        """The turn's durable state now, read from a private copy of the database: the view a
        recovering worker gets, since the observer is closed whenever a worker exits."""
        if not self.db.exists():
            return None
        try:
            conn = open_snapshot(self.db)
        except StorageError:
            return None  # created, not yet a database: nothing has started
        try:
            if self.config.target == "hermes-agent":  # upstream's schema has no turns table
                from supervisor import upstream_schema
                return upstream_schema.turn_state(conn, SESSION, f"turn-{turn_index}")
            row = conn.execute("SELECT state FROM turns WHERE id = ?", (f"turn-{turn_index}",)).fetchone()
            return row[0] if row else None
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return None  # killed before the schema was committed: nothing has started
            raise
        finally:
            conn.close()

    def _take_over_while_paused(self, old: WorkerProcess, turn_index: int, process: int) -> int:
        """SIGSTOP the paused worker, let a new one finish the turn, then SIGCONT the old one."""
        sent = old.signal_group(signal.SIGSTOP)
        self.history.record("pause", incarnation=old.incarnation, pid=old.pid, stopped=sent and _seen_stopped(old))
        newer = self._spawn("resume", turn_index, process, self._fault_for(turn_index, process))
        self._finish(newer)
        old.signal_group(signal.SIGCONT)
        old.send({"type": "continue"})
        self.history.record("cont", incarnation=old.incarnation, pid=old.pid)
        return process + 1

    def _crowd_round(self, turn_index: int) -> None:
        """Start CROWD resume workers at once on the interrupted turn, and wait for all of them
        (checker: consume-once). Process index -1: no kill plan aims at them, and their probe
        hits stay out of the traces further cases derive from."""
        self._crowd_done = True
        crowd = [self._spawn("resume", turn_index, -1, None, busy_budget=CROWD_BUSY_BUDGET_S) for _ in range(CROWD)]
        self.history.record("crowd", turn_id=f"turn-{turn_index}", incarnations=[p.incarnation for p in crowd])
        for proc in crowd:
            self._finish(proc, snapshot=False)
        self._snapshot("crowd")

    def _twin_round(self, turn_index: int) -> None:
        """Resume two byte-identical copies of the crashed state, each with a worker of its own,
        and record both transcripts (checker: recovery-determinism). The twins' workers report
        to nobody: their projections and effects concern copies, not this case's database."""
        self._twin_done = True
        transcripts: list[list[Any]] = []
        try:
            for name in ("twin-a", "twin-b"):
                twin = self.dir / name
                twin.mkdir(mode=0o700)
                for source in (self.db, self.ledger):
                    for suffix in ("", "-wal"):
                        original = Path(f"{source}{suffix}")
                        if original.exists():
                            shutil.copyfile(original, twin / original.name)
                args = self._worker_args("resume", twin / self.db.name, twin / self.ledger.name, self.base_url)
                self._incarnations += 1
                proc = self.pool.spawn(args, incarnation=self._incarnations, on_message=_ack_only,
                                       on_log=self.on_log, label=f"{self.case.case_id} {name}")
                if not proc.wait(self.config.process_timeout):
                    proc.kill("timeout")
                    proc.wait()
                    raise RuntimeError(f"the {name} recovery did not finish in {self.config.process_timeout:.0f}s")
                durable = load_durable(twin / self.db.name)
                if durable.error:
                    raise RuntimeError(f"the {name} recovery left an unreadable database: {durable.error}")
                transcripts.append(twin_transcript(durable))
        except (OSError, RuntimeError) as exc:
            self.history.record("twin", turn_id=f"turn-{turn_index}", error=str(exc))
            return
        self.history.record("twin", turn_id=f"turn-{turn_index}", a=transcripts[0], b=transcripts[1])

    def run(self) -> CaseResult:
        try:
            for fault in self._storage_faults:
                fault.prepare()
            return self._run()
        finally:
            for fault in self._storage_faults:
                fault.release()

    def _run(self) -> CaseResult:
        started = time.monotonic()
        restarts = 0
        for turn_index in range(len(self.scenario.turns)):
            process, command, attempts = 0, "run", 0
            while True:
                fault = self._fault_for(turn_index, process)
                self._paused.clear()
                proc = self._spawn(command, turn_index, process, fault)
                process += 1
                if fault is not None and fault.kind == "pause":
                    while not proc.exited.is_set() and not self._paused.wait(0.05):
                        pass
                    if self._paused.is_set():
                        process = self._take_over_while_paused(proc, turn_index, process)
                self._finish(proc)
                killed = proc.signal == signal.SIGKILL
                restarts += killed
                state = self._turn_state(turn_index)
                if killed and state == "running":
                    if "twin-recovery" in self.config.faults and not self._twin_done:
                        self._twin_round(turn_index)
                    if "concurrent-resume" in self.config.faults and not self._crowd_done:
                        self._crowd_round(turn_index)
                        state = self._turn_state(turn_index)
                if state in ("done", "failed"):
                    break
                attempts += 1
                if attempts > self.config.max_restarts:
                    break  # turn-liveness reports the turn that never ended
                # Killed mid-turn, or fenced off by a newer worker: finish the turn from the database.
                # Never started (killed before its first commit): start it again.
                command = "resume" if state == "running" else "run"
                if killed and self._storage_faults and not self._storage_rounds_done:
                    self._storage_fault_rounds(command, turn_index)
        events = self.history.events
        verdict = check_case(self.db, self.ledger, events, self.scenario.expectation(), planned=self.case.fault,
                             promises=PROMISES[self.config.target])
        self._close_observer()
        trace = [(*self._where[e["incarnation"]], e["name"], e["n"]) for e in events
                 if e["type"] == "probe" and self._where[e["incarnation"]][1] >= 0]
        fired = [f"{e['name']}:{e['n']}" for e in events if e["type"] == "probe" and e.get("kill")]
        return CaseResult(self.case, verdict, self.kills, restarts, time.monotonic() - started, trace, fired,
                          frozenset(sys.intern(name) for (_t, _p, name, _n) in trace), self._repro_flags(),
                          _first_span_ms(events))


def _ack_only(proc: WorkerProcess, msg: dict[str, Any]) -> None:
    """A control-channel handler that lets a worker go on without observing it."""
    if "seq" in msg:
        proc.send({"type": "ack", "seq": msg["seq"]})


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


def enumerate_cases(mode: str, scenario: str, baseline: CaseResult, config: CampaignConfig,
                    recoveries: dict[str, CaseResult] | None = None) -> list[Case]:
    """The cases a mode derives from a scenario's fault-free trace (and, for double, recoveries)."""
    points = sorted(set(baseline.trace))
    if mode == "exhaustive":
        return [Case(scenario, Fault("probe", t, p, probe=name, n=n, mode=km))
                for (t, p, name, n) in points for km in config.kill_modes]
    if mode == "pause":
        # Pause once at the first hit of each distinct probe of the first process of each turn.
        firsts = {(t, name): (t, p, name, n) for (t, p, name, n) in reversed(points) if p == 0 and n == 1}
        return [Case(scenario, Fault("pause", t, p, probe=name, n=n)) for (t, p, name, n) in sorted(firsts.values())]
    if mode == "double":
        cases = []
        for first_id, result in sorted((recoveries or {}).items()):
            first = Case.parse(first_id).fault
            assert first is not None
            recovery = first.process + 1
            for (t, p, name, n) in sorted(set(result.trace)):
                if t == first.turn and p == recovery:
                    second = Fault("probe", t, p, probe=name, n=n)
                    cases.append(Case(scenario, Fault(first.kind, first.turn, first.process, first.probe, first.n,
                                                      first.mode, then=second)))
        return cases
    raise ValueError(f"mode {mode!r} has no enumeration")


def random_cases(config: CampaignConfig, baselines: dict[str, CaseResult]) -> list[Case]:
    """Seeded: half timer kills, aimed inside the live span of the scenario's first worker as
    its fault-free baseline measured it, and half probe kills drawn from the baseline's trace."""
    rng = random.Random(config.seed)
    fractions = timer_fractions(config.seed, config.runs)
    names = sorted(baselines)
    cases = []
    for i in range(config.runs):
        scenario = names[i % len(names)]
        if rng.random() < 0.5:
            delay = aimed_delay_ms(fractions[i], baselines[scenario].span_ms)
            cases.append(Case(scenario, Fault("timer", 0, 0, delay_ms=delay)))
        else:
            t, p, name, n = rng.choice(sorted(set(baselines[scenario].trace)))
            cases.append(Case(scenario, Fault("probe", t, p, probe=name, n=n, mode=rng.choice(config.kill_modes))))
    return cases


def with_model_faults(script: Script, faults: list[str]) -> Script:
    """`script`, but each distinct request is first answered with one of `faults`, once.

    Which fault a request meets depends on its content only, never on arrival order, so the
    fault-free baseline of a scenario and every case derived from it see the same faults.
    """
    if not faults:
        return script

    def faulty(messages: list[dict[str, Any]]) -> Reply:
        reply = script(messages)
        fault = faults[zlib.crc32(request_key(messages).encode()) % len(faults)]
        # The server serves a fault `fault_times` times for one exact request, then answers.
        return dataclasses.replace(reply, fault=fault, fault_times=1, retry_after=0.05, stall_seconds=STALL_S)

    return faulty


def in_shard(case: Case, shard: tuple[int, int]) -> bool:
    index, count = shard
    return zlib.crc32(case.case_id.encode()) % count == index - 1


class Campaign:
    def __init__(self, config: CampaignConfig, progress: Callable[[str], None] | None = None,
                 history_path: Path | None = None, log_sink: Callable[[WorkerProcess, bytes], None] | None = None
                 ) -> None:
        self.config = config
        self.progress = progress or (lambda line: None)
        # The fork-server template preloads our runtime; upstream workers start as fresh interpreters.
        self.pool = Pool(forkserver=config.forkserver and config.target == "hermes")
        self.history = HistoryWriter(history_path) if history_path else None
        self.log_sink = log_sink
        self.results: list[CaseResult] = []
        self.baselines: dict[str, CaseResult] = {}
        self._shared: dict[Any, Any] = {}
        self._shared_lock = threading.Lock()

    def _share(self, key: Any, make: Callable[[], Any] | None = None) -> Any:
        """One shared instance per equal value (made by `make`, else the key itself), so the
        per-case summaries a long campaign keeps hold references, not copies."""
        with self._shared_lock:
            if key not in self._shared:
                self._shared[key] = make() if make is not None else key
            return self._shared[key]

    def _run_cases(self, cases: list[Case], root: Path, base_url: str,
                   keep_traces: bool = False) -> list[CaseResult]:
        """Run `cases`; only summaries stay in memory (traces only where further cases derive from them)."""
        def one(case: Case) -> CaseResult:
            runner = CaseRunner(case, root, base_url, self.pool, self.history, self.config, self.log_sink)
            result = runner.run()
            if self.config.case_files is not None:
                # The case's whole history goes to disk now; the campaign keeps only its summary.
                self.config.case_files.mkdir(mode=0o700, parents=True, exist_ok=True)
                write_json(self.config.case_files / f"{case_file_stem(case.case_id)}.json",
                           dict(result.to_json(), events=runner.history.events))
            if not self.config.keep and result.verdict.valid is True:
                shutil.rmtree(runner.dir, ignore_errors=True)
            if not keep_traces:
                result.trace = []
            if result.verdict.valid is True:  # a pass needs no per-invariant detail in memory
                result.verdict = self._share(("pass", result.verdict.name),
                                             lambda: Verdict(True, [], {}, result.verdict.name))
            # Thousands of cases reach the same probes with the same flags: one copy of each.
            result.reached = self._share(result.reached)
            result.flags = self._share(result.flags)
            mark = {True: "ok", False: "VIOLATION"}.get(result.verdict.valid, "unknown")  # type: ignore[arg-type]
            self.progress(f"{mark:9} {case.case_id} ({result.seconds:.2f}s, {result.kills} kills)")
            return result

        with ThreadPoolExecutor(max_workers=max(1, self.config.jobs)) as pool:
            return list(pool.map(one, cases))

    def run(self) -> list[CaseResult]:
        config = self.config
        root = Path(config.workdir or tempfile.mkdtemp(prefix="hermes-chaos-"))
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        scenarios = [SCENARIOS[name] for name in config.scenarios]
        try:
            script = with_model_faults(campaign_script(scenarios), [f for f in config.faults if f in MODEL_FAULTS])
            with ScriptedModelServer(script, model=MODEL, request_log=MODEL_REQUEST_LOG) as server:
                if config.case_ids:
                    self.results = self._run_cases([Case.parse(c) for c in config.case_ids], root, server.base_url)
                    return self.results
                baselines = self._run_cases([Case(s.name) for s in scenarios], root, server.base_url,
                                            keep_traces=True)
                self.baselines = {r.case.scenario: r for r in baselines}
                cases = self._derive(root, server.base_url)
                cases = [c for c in cases if in_shard(c, config.shard) and self._selected(c)]
                if config.limit is not None:
                    cases = cases[: config.limit]
                self.progress(f"{len(cases)} cases ({config.mode}) over {len(scenarios)} scenario(s)")
                # Double mode already holds its first-kill cases in self.results; keep them.
                self.results = baselines + self.results + self._run_cases(cases, root, server.base_url)
        finally:
            self.pool.close()
            if self.history is not None:
                self.history.close()
            if not config.keep and config.workdir is None:
                shutil.rmtree(root, ignore_errors=True)
        return self.results

    def _selected(self, case: Case) -> bool:
        wanted = self.config.probes
        return not wanted or (case.fault is not None and case.fault.probe in wanted)

    def _derive(self, root: Path, base_url: str) -> list[Case]:
        config = self.config
        if config.mode == "random":
            return random_cases(config, self.baselines)
        if config.mode == "double":
            firsts = [c for s, b in self.baselines.items() for c in enumerate_cases("exhaustive", s, b, config)]
            firsts = [c for c in firsts if in_shard(c, config.shard) and self._selected(c)]
            if config.limit is not None:
                firsts = firsts[: config.limit]
            recoveries = self._run_cases(firsts, root, base_url, keep_traces=True)
            self.results.extend(recoveries)
            by_scenario: dict[str, dict[str, CaseResult]] = {}
            for result in recoveries:
                by_scenario.setdefault(result.case.scenario, {})[result.case.case_id] = result
            return [c for s, b in self.baselines.items()
                    for c in enumerate_cases("double", s, b, config, by_scenario.get(s, {}))]
        return [c for s, b in self.baselines.items() for c in enumerate_cases(config.mode, s, b, config)]


def summarize(results: list[CaseResult]) -> dict[str, Any]:
    """The campaign's report data: cases, landed kills, violations by class, what was not
    judged and why, and per kill point what happened."""
    from hermes.probes import POINTS

    points: dict[str, dict[str, Any]] = {p: {"hit": False, "cases": 0, "violations": 0} for p in POINTS}
    violations = []
    unknown = []
    seen_in_trace: set[str] = set()
    for result in results:
        seen_in_trace.update(result.reached)
        fault = result.case.fault
        targeted = []
        while fault is not None:
            if fault.probe:
                targeted.append(fault)
            fault = fault.then
        for f in targeted:
            entry = points.setdefault(f.probe, {"hit": False, "cases": 0, "violations": 0})
            entry["cases"] += 1
            if f.point in result.fired:
                entry["hit"] = True
            if result.verdict.valid is False:
                entry["violations"] += 1
        for v in result.verdict.violations:
            violations.append({"invariant": v.invariant, "class": v.kind, "case": result.case.case_id,
                               "probe": result.case.fault.point if result.case.fault else None,
                               "message": v.message, "witness": v.witness, "repro": result.repro()})
        if result.verdict.valid not in (True, False):
            unknown.append({"case": result.case.case_id, "reasons": list(result.verdict.reasons),
                            "message": result.verdict.message, "repro": result.repro()})
    by_class = {kind: sum(1 for v in violations if v["class"] == kind) for kind in ("damage", "contract")}
    return {"ok": not violations and not unknown, "cases": len(results),
            "kills": sum(r.kills for r in results), "no_kill": sum(1 for r in results if r.no_kill),
            "violations": violations, "violations_by_class": by_class, "unknown": unknown,
            "unfired": [u["case"] for u in unknown if UNFIRED in u["reasons"]],
            "no_kill_cases": [u["case"] for u in unknown if NO_KILL in u["reasons"]],
            "points": points, "reached": sorted(seen_in_trace),
            "seconds": round(sum(r.seconds for r in results), 3)}


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False, default=str), encoding="utf-8")
    path.chmod(0o600)
