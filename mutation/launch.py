"""Run given campaign cases, with the workers importing another tree.

`run_group` runs them in this process, which is the supervisor: it imports the harness and its
checker from wherever it was started (the pristine copy), and points the process pool at
`worker_tree`, so the worker template, every forked worker and every resumed worker import the
runtime from there (the pool puts its REPO_ROOT first on the workers' PYTHONPATH and starts them
in it). `run_group_in` runs them in a child process started in another tree, so that the
supervisor, its checker included, imports that tree too: the case map measures what the checker
runs of the core that way, and the oracle judges a mutant of a line only the checker runs.

    python -m mutation.launch REQUEST OUTCOME --driver PID   (the child; run_group_in starts it)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

# The campaigns of the oracle, cheapest first: every exhaustive case on SQLite, the pause mode, a
# Ctrl-C at every point (the code that answers an interrupted batch runs only then), the daemon
# giving the killed worker's turn up (the words that answer an ended turn's calls run only then),
# drawn conversations (what no fixed scenario does: a streamed answer in a later turn, an empty
# streamed answer, compaction, a result spilled to a file, call ids across turns; seed and count
# fixed, so that a case id names the same conversation in every run) from a model that numbers its
# calls per response, so ids repeat across rounds and turns, power cuts (the code only a lost
# unsynced write exercises), the PostgreSQL engine, alone and with its server failing under it
# (the engine's error classification and statement deadlines run only then), and storage faults
# (a locked, read-only or corrupt session database at each point: the code that fails a turn
# closed runs only then; the disk fault is left out, it needs the right to mount). A storage case
# spends most of its time waiting (on a locked database, out the worker's busy budget), so that
# group runs more cases at once (`jobs`: at least). Power cuts run at both durability levels: at FULL every commit is synced,
# so only at NORMAL can a cut see a barrier (a dispatch intent, a turn's start) that was not. There
# the lost suffix of commits is the level's documented cost, reported as a `durability-cost`
# violation by the original as much as by a mutant, so that class is `excused`: a case fails on
# damage, a broken contract, or when it could not be judged.
GROUPS: dict[str, dict[str, Any]] = {
    "sqlite": {"mode": "exhaustive"},
    "pause": {"mode": "pause"},
    "interrupt": {"mode": "interrupt"},
    "give-up": {"mode": "exhaustive", "faults": ("give-up",)},
    "generated": {"mode": "generated", "seed": 1, "runs": 40, "call_ids": "numbered"},
    "power-loss": {"mode": "exhaustive", "faults": ("power-loss",)},
    "power-loss-normal": {"mode": "exhaustive", "faults": ("power-loss",), "synchronous": "NORMAL",
                          "excused": ("durability-cost",)},
    "postgres": {"mode": "exhaustive", "store": "postgres"},
    "postgres-faults": {"mode": "exhaustive", "store": "postgres",
                        "faults": ("pg-terminate", "pg-restart", "pg-hang")},
    "storage": {"mode": "exhaustive", "faults": ("locked", "readonly", "corrupt"), "jobs": 6},
}


class _Stoppable(Protocol):
    def stop(self, reason: str) -> None: ...


_running: list[_Stoppable] = []  # the campaign under way (or the child running one), for stop_running
_spawned: list[int] = []  # every worker pid run_group's campaigns started, in this process
_stopped: list[str] = []  # why this process was told to stop: no campaign starts after that


def stop_running(reason: str) -> None:
    """Stop the campaign under way and every one after it (from a signal handler or a watcher
    thread): its workers are killed by pid."""
    _stopped.append(reason)
    for campaign in list(_running):
        campaign.stop(reason)


def workers_spawned() -> int:
    """How many workers (each running the measured tree) this process's campaigns have started."""
    return len(_spawned)


def stopped() -> str | None:
    """Why this process was told to stop, or None."""
    return _stopped[0] if _stopped else None


@dataclass
class Outcome:
    """What the cases of one group said about the code the workers ran."""
    ran: list[str] = field(default_factory=list)
    failed: str | None = None        # the first case whose campaign would fail
    failures: list[str] = field(default_factory=list)  # every such case, in the order they ended
    why: list[str] = field(default_factory=list)  # its violated invariants, or why it was not judged
    spawned: list[tuple[int, str]] = field(default_factory=list)  # (worker pid, case id)
    case_seconds: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    timed_out: bool = False
    runner_pid: int | None = None  # the child that ran the supervisor (run_group_in), else None


def run_group(worker_tree: Path, group: str, case_ids: list[str], *, stop_on_fail: bool = True,
              deadline: float | None = None, jobs: int = 2,
              scenarios: list[str] | None = None) -> Outcome:
    """Run `case_ids` of `group` (an empty list: the group's whole campaign); stop at the first
    case that fails when `stop_on_fail`, and at `deadline` (time.monotonic()) in any case."""
    if stopped():  # before its work directory is made: a stopped run leaves nothing behind
        return Outcome(timed_out=True)  # told to stop before it began: nothing was judged
    from supervisor.chaos.campaign import Campaign
    from supervisor.chaos.config import CampaignConfig
    from supervisor.chaos.scenarios import SCENARIOS
    from supervisor.procs import pool
    from supervisor.procs.pool import Pool

    spec = GROUPS[group]
    outcome = Outcome()
    lock = threading.Lock()
    real_spawn = Pool.spawn

    def spawn(self: Pool, args: list[str], **kwargs: Any) -> Any:
        proc = real_spawn(self, args, **kwargs)
        with lock:
            outcome.spawned.append((proc.pid, kwargs.get("label") or ""))
            _spawned.append(proc.pid)
        return proc

    config = CampaignConfig(scenarios=scenarios or sorted(SCENARIOS), mode=spec["mode"],
                            jobs=max(jobs, spec.get("jobs", 0)),
                            seed=spec.get("seed", 0), runs=spec.get("runs", CampaignConfig.runs),
                            case_ids=tuple(case_ids), faults=tuple(spec.get("faults", ())),
                            store=spec.get("store", "sqlite"), call_ids=spec.get("call_ids", "fresh"),
                            synchronous=spec.get("synchronous", "FULL"))
    excused = frozenset(spec.get("excused", ()))
    holder: dict[str, Campaign] = {}

    def on_result(result: Any) -> None:
        with lock:
            outcome.ran.append(result.case.case_id)
            outcome.case_seconds[result.case.case_id] = round(result.seconds, 3)
            valid = result.verdict.valid
            if valid is False and all(v.kind in excused for v in result.verdict.violations):
                valid = True
            if valid is not True:
                outcome.failures.append(result.case.case_id)
            if valid is True or outcome.failed is not None:
                return
            outcome.failed = result.case.case_id
            if valid is False:
                outcome.why = sorted({v.invariant for v in result.verdict.violations if v.kind not in excused})
            else:
                outcome.why = ["unjudged:" + ",".join(sorted(str(r) for r in result.verdict.reasons) or ["unknown"])]
        if stop_on_fail:
            holder["campaign"].stop("mutant killed")

    started = time.monotonic()
    # child_env and the pool read REPO_ROOT at each start: the workers' PYTHONPATH and directory.
    repo_root, pool.REPO_ROOT = pool.REPO_ROOT, worker_tree
    Pool.spawn = spawn  # type: ignore[method-assign]
    watchdog: threading.Timer | None = None
    workdir = Path(tempfile.mkdtemp(prefix="hermes-mutation-"))  # the last step before the try that removes it
    try:
        campaign = holder["campaign"] = Campaign(replace(config, workdir=workdir), on_result=on_result)
        _running.append(campaign)
        if deadline is not None:
            def expire() -> None:
                outcome.timed_out = True
                campaign.stop("deadline")
            watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), expire)
            watchdog.daemon = True
            watchdog.start()
        campaign.run()
    finally:
        if watchdog is not None:
            watchdog.cancel()
        _running.clear()
        Pool.spawn = real_spawn  # type: ignore[method-assign]
        pool.REPO_ROOT = repo_root
        shutil.rmtree(workdir, ignore_errors=True)
    outcome.seconds = time.monotonic() - started
    return outcome


class CampaignCrashed(RuntimeError):
    """The child's campaign raised (or the child died) before an outcome."""


# How long a child told to stop may take to stop its campaign (its workers are killed by pid,
# its directory removed) before it is killed itself.
CHILD_STOP_S = 60.0


class _Child:
    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    def stop(self, reason: str) -> None:
        del reason  # the child learns only that it must stop: it stops as its own driver would
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)


def run_group_in(tree_root: Path, group: str, case_ids: list[str], *, stop_on_fail: bool = True,
                 deadline: float | None = None, jobs: int = 2, scenarios: list[str] | None = None) -> Outcome:
    """`run_group` in a child process started in `tree_root`, which then runs the supervisor and
    the workers alike. The child inherits this environment (the case map's coverage settings
    included), stops when told to (`stop_running`) or when this process is gone, and keeps the
    deadline itself. Raises CampaignCrashed when it ends without an outcome."""
    if stopped():
        return Outcome(timed_out=True)
    from supervisor.procs import pool

    with tempfile.TemporaryDirectory(prefix="hermes-campaign-child-") as scratch:
        request, result = Path(scratch) / "request.json", Path(scratch) / "outcome.json"
        request.write_text(json.dumps({
            "group": group, "cases": case_ids, "stop_on_fail": stop_on_fail, "jobs": jobs, "scenarios": scenarios,
            "seconds": None if deadline is None else max(0.0, deadline - time.monotonic())}))
        env = dict(os.environ, PYTHONPATH=str(tree_root), PYTHONDONTWRITEBYTECODE="1",
                   NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
        with pool.starting_child():
            proc = subprocess.Popen([sys.executable, "-m", "mutation.launch", str(request), str(result),
                                     "--driver", str(os.getpid())], cwd=tree_root, env=env, start_new_session=True)
            pool.claim_child(proc.pid)
        child = _Child(proc)
        _running.append(child)
        try:
            proc.wait()
        finally:
            _running.remove(child)
            if proc.poll() is None:  # this process is unwinding: the child stops its campaign first
                child.stop("unwinding")
                try:
                    proc.wait(timeout=CHILD_STOP_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            pool.release_child(proc.pid)
        try:
            answer = json.loads(result.read_text())
        except (OSError, ValueError):
            raise CampaignCrashed(f"the {group} campaign's process ended ({proc.returncode}) with no outcome") from None
    if "crashed" in answer:
        raise CampaignCrashed(answer["crashed"])
    fields = answer["outcome"]
    fields["spawned"] = [(int(pid), label) for pid, label in fields["spawned"]]
    return Outcome(**dict(fields, runner_pid=proc.pid))


def main(argv: list[str] | None = None) -> int:
    """The child of run_group_in: run the request's cases from this tree, write the outcome."""
    from hermes.private_files import replace_file_durably
    from mutation.oracle import stop_with_driver

    parser = argparse.ArgumentParser(prog="python -m mutation.launch")
    parser.add_argument("request", type=Path)
    parser.add_argument("outcome", type=Path)
    parser.add_argument("--driver", type=int, required=True)
    args = parser.parse_args(argv)
    stop_with_driver(args.driver)
    asked = json.loads(args.request.read_text())
    deadline = None if asked["seconds"] is None else time.monotonic() + asked["seconds"]
    answer: dict[str, Any]
    try:
        outcome = run_group(Path(__file__).resolve().parents[1], asked["group"], asked["cases"],
                            stop_on_fail=asked["stop_on_fail"], deadline=deadline, jobs=asked["jobs"],
                            scenarios=asked["scenarios"])
        answer = {"outcome": asdict(outcome)}
    except Exception as exc:  # noqa: BLE001 - the parent decides what a crash says of the tree
        answer = {"crashed": f"{type(exc).__name__}: {exc}"[:2000]}
    replace_file_durably(args.outcome, json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
