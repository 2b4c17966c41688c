"""A campaign while it runs: what it prints, what it records as it goes, and how it stops.

`Console` is what a person sees. On a terminal, one live line (cases done of planned, landed
kills, violations, cases not judged, cases/s, ETA) instead of a line per case; without one
(CI), that line every `every` seconds. `verbose` prints a line per finished case as well (and
no live line). The first violation is printed at once, with its repro line.

`Record` is what survives the campaign's process: each finished case's report.json entry is
appended to DIR/results.jsonl the moment it finishes (one line each, written whole), and once
the plan is known DIR/report.json says the campaign is running (`"state": "running"`,
`"complete": false`, its campaign and planned cases). The final report.json replaces it, each
report file written whole (supervisor.chaos.history.write_private_atomic), report.json last.

`Interrupts` handles SIGINT and SIGTERM. The first one stops the campaign: no case starts any
more, the live workers are SIGKILLed by their recorded pids and reaped, the cases they were
running are dropped (cut short by the stop, they test nothing), and the report is written as
usual, marked `"complete": false` with the planned cases that did not run; the campaign then
exits with EXIT_INTERRUPTED. A second one exits at once (128 + the signal's number) after
SIGKILLing the live workers and whatever the fault families keep running for the campaign (each
resource's `kill_now`: the lazy file system servers, their mounts detached), with SIGINT and
SIGTERM blocked from then on, so that a third signal cannot cut that short: results.jsonl
holds every case finished until then, and report.json is the running one (or the final one,
whole); `hermes-supervisor merge OUT DIR` makes a complete partial report of them. The
campaign's own temporary working directory is not removed then (its workers may still be dying
in it); the message names it.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable

from hermes.private_files import make_private_dirs, open_private_fd
from supervisor.chaos.history import write_json
from supervisor.chaos.plan import not_run

if TYPE_CHECKING:
    from supervisor.chaos.campaign import Campaign
    from supervisor.chaos.plan import Plan
    from supervisor.chaos.runner import CaseResult

RESULTS_FILE = "results.jsonl"
EXIT_INTERRUPTED = 3  # the campaign was stopped by SIGINT or SIGTERM: its report is partial
CASE_MARKS = ("ok", "VIOLATION", "unknown")  # first word of the campaign's line for a finished case


def entry(result: CaseResult) -> dict[str, Any]:
    """A finished case as results.jsonl records it: its report.json entry and the probes it reached."""
    return dict(result.to_json(), reached=sorted(result.reached))


# ---------------------------------------------------------------------------- the console
def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class Console:
    def __init__(self, stream: IO[str] | None = None, *, verbose: bool = False, every: float = 30.0,
                 clock: Callable[[], float] = time.monotonic, tty: bool | None = None) -> None:
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty() if tty is None else tty
        self.verbose = verbose
        self.live = self.tty and not verbose
        self.clock = clock
        self.started = clock()
        self.total, self.known = 0, False
        self.done = self.kills = self.violations = self.unknown = 0
        self.first_violation: str | None = None
        self._lock = threading.Lock()
        self._shown = False  # the live line is on the screen
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if not self.tty and every > 0:
            self._ticker = threading.Thread(target=self._tick_every, args=(every,), daemon=True, name="progress")
            self._ticker.start()

    def planned(self, total: int, known: bool = True) -> None:
        """`total` cases planned (fault-free runs included); `known`: the plan is derived, not only its start."""
        with self._lock:
            self.total, self.known = total, known
            self._redraw()

    def line(self, text: str) -> None:
        """The campaign's progress callback: a finished case's line only when verbose, anything else always."""
        if text.split(" ", 1)[0] in CASE_MARKS and not self.verbose:
            return
        with self._lock:
            self._print(text)

    def result(self, result: CaseResult) -> None:
        """A case finished: count it; the first violation is printed at once, with its repro line."""
        with self._lock:
            self.done += 1
            self.kills += result.kills
            valid = result.verdict.valid
            if valid is False:
                self.violations += len(result.verdict.violations) or 1
                if self.first_violation is None:
                    v = result.verdict.violations[0] if result.verdict.violations else None
                    what = f"{v.invariant} ({v.kind})" if v else "a violation"
                    self.first_violation = result.case.case_id
                    self._print(f"first violation: {what} in {result.case.case_id}: {v.message if v else ''}\n"
                                f"  repro: {result.repro()}")
            elif valid is not True:
                self.unknown += 1
            self._redraw()

    def status(self) -> str:
        elapsed = max(self.clock() - self.started, 1e-9)
        rate = self.done / elapsed
        total = f"{self.total}" if self.known else f"{max(self.total, self.done)}+"
        left = self.total - self.done
        eta = _duration(left / rate) if self.known and rate > 0 and left > 0 else "-"
        return (f"{self.done}/{total} cases, {self.kills} kills landed, {self.violations} violations, "
                f"{self.unknown} not judged, {rate:.2f} cases/s, ETA {eta}")

    def tick(self) -> None:
        """The periodic line of a run without a terminal."""
        with self._lock:
            self._print(f"progress: {self.status()}")

    def finish(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=5)
        with self._lock:
            if self._shown:
                self.stream.write("\n")
                self.stream.flush()
                self._shown = False

    # Callers hold self._lock.
    def _print(self, text: str) -> None:
        if self._shown:
            self.stream.write("\r\033[K")
        self.stream.write(text + "\n")
        self._shown = False
        self._redraw()

    def _redraw(self) -> None:
        if not self.live or not (self.total or self.done):  # nothing planned yet: nothing to show
            self.stream.flush()
            return
        width = shutil.get_terminal_size((100, 20)).columns - 1
        self.stream.write("\r\033[K" + self.status()[:width])
        self.stream.flush()
        self._shown = True

    def _tick_every(self, every: float) -> None:
        while not self._stop.wait(every):
            self.tick()


# ---------------------------------------------------------------------------- the record
class Record:
    """DIR/results.jsonl, a line per finished case, and DIR/report.json while the campaign runs."""

    def __init__(self, directory: Path) -> None:
        self.directory = make_private_dirs(directory)
        self.path = self.directory / RESULTS_FILE
        # O_APPEND and one write() per line: a process killed between two lines leaves whole lines.
        self._fd = open_private_fd(self.path, os.O_WRONLY | os.O_TRUNC | os.O_APPEND)
        self._lock = threading.Lock()

    def add(self, result: CaseResult) -> None:
        data = (json.dumps(entry(result), default=str) + "\n").encode("utf-8", "backslashreplace")
        with self._lock:
            if self._fd < 0:
                return
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]

    def running(self, plan: Plan) -> None:
        """report.json saying the campaign runs: its campaign and plan, no results yet."""
        from supervisor.chaos.campaign import summarize

        record = plan.record()
        write_json(self.directory / "report.json",
                   dict(summarize([]), ok=False, state="running", complete=False, interrupted=None, campaign=record,
                        not_run=not_run(record, ()), results=[]), atomic=True)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def report_fields(campaign: Campaign, results: list[CaseResult]) -> dict[str, Any]:
    """What a report says of its campaign besides the summary: campaign and plan, whether every
    planned case ran, which did not, and what stopped it."""
    record = campaign.plan.record() if campaign.plan is not None else None
    missing = not_run(record, (r.case.case_id for r in results)) if record is not None else []
    return {"state": "done", "complete": campaign.stopped is None and not missing,
            "interrupted": campaign.stopped, "campaign": record, "not_run": missing}


# ---------------------------------------------------------------------------- signals
def _say(text: str) -> None:
    """To stderr from a signal handler: one write(2), no lock a handler could find held."""
    try:
        os.write(2, text.encode("utf-8", "replace"))
    except OSError:
        pass


class Interrupts:
    """SIGINT and SIGTERM for the whole process (installed once, from the main thread); the
    campaign attached at the time is the one a signal stops."""

    _installed: Interrupts | None = None

    def __init__(self) -> None:
        self.campaign: Campaign | None = None
        self.reason: str | None = None  # the first signal's name, once one came
        self.count = 0

    @classmethod
    def install(cls) -> Interrupts:
        if cls._installed is None:
            guard = cls()
            if threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGINT, signal.SIGTERM):
                    signal.signal(sig, guard._handle)
            cls._installed = guard
        return cls._installed

    def attach(self, campaign: Campaign | None) -> None:
        self.campaign = campaign
        if campaign is not None and self.reason is not None:
            campaign.stop(self.reason)  # the stop came before this campaign started: it runs nothing

    def _handle(self, signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        self.count += 1
        campaign = self.campaign
        if self.count == 1:
            self.reason = name
            _say(f"\nhermes-supervisor: {name}: stopping: no new case starts, running workers are killed, "
                 f"the report will be partial ({name} again to quit at once)\n")
            if campaign is not None:
                # Not here: the handler runs in the main thread, which may hold a lock stop() takes.
                threading.Thread(target=campaign.stop, args=(name,), daemon=True, name="stop").start()
            return
        # Whatever signal comes next must not cut the cleanup below short: it waits, then dies with us.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        scratch = campaign.scratch_dir if campaign is not None else None
        _say(f"hermes-supervisor: {name} again: quitting at once; the finished cases are in {RESULTS_FILE} "
             f"(hermes-supervisor merge OUT DIR makes a report of them)"
             + (f"; the case directories are left in {scratch}" if scratch is not None else "") + "\n")
        if campaign is not None:
            campaign.pool.kill_now("exit")
            for resource in list(campaign.resources.values()):  # e.g. lazy file system servers and mounts
                kill_now = getattr(resource, "kill_now", None)
                if kill_now is not None:
                    kill_now()
        os._exit(128 + signum)
