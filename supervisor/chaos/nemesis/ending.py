"""`cancel`, `give-up`: the daemon ends a killed worker's turn instead of resuming it.

A daemon ends a turn it will not run again (a cancel request; a crash loop or a limit, and it
gives the turn up) with `supervisor.daemon.giving_up.end_turn`: 'failed' with the reason, and in
the same transaction every call of the turn left without a result is answered (hermes.outcomes):
one whose dispatch intent is durable may have run, and its result says the outcome is unknown;
one never dispatched says it was not run. This family does exactly that, with no worker running,
at the first kill the plan made that leaves a turn running (a scenario's own kill, like
self-kill's restart, is resumed as ever); the case then goes on with its next turn. What is
judged: the turn ended with its reason (turn-liveness), each answer's words against the call's
dispatch intents (result-fidelity), and what the killed worker streamed ends with the turn
(stream-honesty). The two faults end a turn two ways, so a campaign takes one of them.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from hermes.outcomes import CANCELLED
from supervisor.chaos.nemesis.family import FaultUnavailable, Nemesis

# What a turn given up is failed with: the daemon's own reasons name the limit or the crash loop.
GIVE_UP_REASON = "crash_loop: the chaos supervisor gave the turn up after its worker was killed"
OWNER = "chaos-daemon"  # the lease owner the ending takes the session with, fencing off any straggler
# The ending runs in a process of its own on the code the case's workers run (the pool's REPO_ROOT):
# under mutation testing that is the mutated tree, whose store is what is measured, not this
# supervisor's copy of it. It prints whether the turn was ended; an exception is its finding.
_END_TURN = """
import json, sys
from hermes.state import SessionDB
from supervisor.daemon.giving_up import end_turn
db, turn_id, reason, owner = sys.argv[1:]
with SessionDB(db) as store:
    print(json.dumps(end_turn(store, turn_id, reason, owner=owner)))
"""


class EndedTurns(Nemesis):
    FAULTS = ("cancel", "give-up")
    NEVER_REACHED = "no planned kill left its turn running"
    WHY_NOT_ON = "it ends the turn in the case's SQLite database, as the daemon does"

    done = False
    planned_kill = False  # the last kill was the plan's (a scenario's own, like self-kill's restart, is resumed)

    @classmethod
    def check_available(cls, chosen: tuple[str, ...], faults: tuple[str, ...], workdir: Path) -> None:
        if len(chosen) > 1:
            raise FaultUnavailable("--faults cancel and give-up end the same turn two ways: run them in two campaigns")

    @classmethod
    def check_target(cls, chosen: tuple[str, ...], target: str) -> None:
        from targetkit import registry

        if target != registry.DEFAULT:
            raise FaultUnavailable(f"--faults {','.join(chosen)} ends turns as our daemon does, in our runtime's store: "
                                   f"--target {target} keeps its turns elsewhere")

    def on_kill(self, killed: Any) -> bool:
        self.planned_kill = True
        return False

    def after_kill(self, turn_index: int, state: str | None) -> str | None:
        planned, self.planned_kill = self.planned_kill, False
        if state != "running" or self.done or not planned:
            return state
        self.done = True
        (fault,) = self.chosen
        reason = CANCELLED if fault == "cancel" else GIVE_UP_REASON
        turn_id = f"turn-{turn_index}"
        ended, error = _end_turn(self.case.db, turn_id, reason, self.case.config.process_timeout)
        self.case.history.record("turn_ended", turn_id=turn_id, fault=fault, reason=reason, ended=ended,
                                 **({"error": error} if error else {}))
        self.case.account(fault, landed=ended, reason=None if ended else error or "the store said the turn had ended")
        self.case.snapshot("ended")
        return "failed" if ended else state


def _end_turn(db: Path, turn_id: str, reason: str, timeout: float) -> tuple[bool, str | None]:
    """(ended, why it could not be): `end_turn` run by a child on the workers' code."""
    from supervisor.procs import pool

    try:
        done = subprocess.run([sys.executable, "-c", _END_TURN, str(db), turn_id, reason, OWNER],
                              env=pool.child_env(), cwd=pool.REPO_ROOT, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired:  # killed by its pid, and reaped, by subprocess.run
        return False, f"ending the turn took longer than {timeout:.0f} s"
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return False, lines[-1] if lines else f"exit status {done.returncode}"
    return json.loads(done.stdout) is True, None
