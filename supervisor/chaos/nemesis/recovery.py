"""Recovery faults: more than one recovery of one crashed state.

* `concurrent-resume` (`ConcurrentResume`): after the first kill that leaves a turn running,
  `CROWD` resume workers start at once on it (checker: consume-once);
* `twin-recovery` (`TwinRecovery`): two byte-identical copies of the crashed state are each
  resumed by a worker of their own and must give the same transcript (checker:
  recovery-determinism).
"""
from __future__ import annotations

import shutil
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermes.private_files import open_private
from supervisor.chaos.nemesis.family import Nemesis

if TYPE_CHECKING:
    from supervisor.procs.pool import WorkerProcess

CROWD = 4  # resume workers started at once by concurrent-resume
CROWD_BUSY_BUDGET_S = 10.0  # k writers contend for one lock: patience is not what is being tested
NOT_RUNNING = "no worker was killed while its turn was running"


class ConcurrentResume(Nemesis):
    FAULTS = ("concurrent-resume",)
    NEVER_REACHED = NOT_RUNNING
    STORES = ("sqlite", "postgres")  # it starts workers, whatever store they resume from

    done = False

    def after_kill(self, turn_index: int, state: str | None) -> str | None:
        """Start CROWD resume workers at once on the interrupted turn, and wait for all of them.
        Process index -1: no kill plan aims at them, and their probe hits stay out of the traces
        further cases derive from."""
        if state != "running" or self.done:
            return state
        self.done = True
        case = self.case
        crowd = [case.spawn("resume", turn_index, -1, None, busy_budget=CROWD_BUSY_BUDGET_S) for _ in range(CROWD)]
        case.history.record("crowd", turn_id=f"turn-{turn_index}", incarnations=[p.incarnation for p in crowd])
        case.account("concurrent-resume", landed=True)
        for proc in crowd:
            case.finish(proc, snapshot=False)
        case.snapshot("crowd")
        return case.turn_state(turn_index)


class TwinRecovery(Nemesis):
    FAULTS = ("twin-recovery",)
    NEVER_REACHED = NOT_RUNNING
    WHY_NOT_ON = "it copies the case's SQLite files byte for byte, and resumes each copy"

    done = False

    def after_kill(self, turn_index: int, state: str | None) -> str | None:
        """Resume two byte-identical copies of the crashed state, each with a worker of its own,
        and record both transcripts. The twins' workers report to nobody: their projections and
        effects concern copies, not this case's database."""
        if state != "running" or self.done:
            return state
        self.done = True
        history = self.case.history
        try:
            recovered = [self._recover(name) for name in ("twin-a", "twin-b")]
        except (OSError, RuntimeError) as exc:
            history.record("twin", turn_id=f"turn-{turn_index}", error=str(exc))
            self.case.account("twin-recovery", landed=False, reason=f"a twin recovery did not finish: {exc}")
            return state
        (a, structure_a), (b, structure_b) = recovered
        history.record("twin", turn_id=f"turn-{turn_index}", a=a, b=b,
                       structure={"twin-a": structure_a, "twin-b": structure_b})
        self.case.account("twin-recovery", landed=True)
        return state

    def _recover(self, name: str) -> tuple[list[list[Any]], dict[str, Any]]:
        """Copy the database and the ledger (with their WALs) into `name`/, resume it, read it back:
        its transcript, and the verdict of the structural invariants on what it left (each twin is a
        recovery run of its own, judged like one)."""
        from supervisor.chaos.checker import check_structure, load_durable, twin_transcript

        case = self.case
        twin = case.dir / name
        twin.mkdir(mode=0o700)
        for source in (case.db, case.ledger):
            for suffix in ("", "-wal"):
                original = Path(f"{source}{suffix}")
                try:
                    with original.open("rb") as src, open_private(twin / original.name, "wb") as dst:
                        shutil.copyfileobj(src, dst)  # a copy of a transcript is as private as the transcript
                except FileNotFoundError:
                    pass  # no WAL (or no ledger yet): the state is the main file alone
        args = case.worker_args("resume", twin / case.db.name, twin / case.ledger.name, case.base_url)
        last: dict[str, Any] = {}  # what the twin last reported, which says why it died if it does

        def ack_and_remember(proc: WorkerProcess, msg: dict[str, Any]) -> None:
            last.update(type=msg.get("type"), tool=msg.get("tool"))
            proc.acknowledge(msg)

        proc = case.pool.spawn(args, incarnation=case.next_incarnation(), on_message=ack_and_remember,
                               on_log=case.on_log, label=f"{case.case.case_id} {name}", cwd=twin)
        timed_out = not proc.wait(case.config.process_timeout)
        if timed_out:
            proc.kill("timeout")
            case.history.record("kill", incarnation=proc.incarnation, pid=proc.pid, signal=signal.SIGKILL,
                                by="timeout", probe=None)
            proc.wait()
        case.history.record("twin_run", name=name, incarnation=proc.incarnation, pid=proc.pid,
                            returncode=proc.returncode, signal=proc.signal, last_report=dict(last) or None)
        if timed_out:
            raise RuntimeError(f"the {name} recovery did not finish in {case.config.process_timeout:.0f}s")
        durable = load_durable(twin / case.db.name)
        if durable.error:
            raise RuntimeError(f"the {name} recovery left an unreadable database: {durable.error}")
        return twin_transcript(durable), check_structure(twin / case.db.name).to_json()
