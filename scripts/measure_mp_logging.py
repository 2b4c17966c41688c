#!/usr/bin/env python3
"""Measure multiprocessing-logging, the log transport the design brief named and we rejected.

    python scripts/measure_mp_logging.py [--kills 40] [--seconds 90] [--quiet 3]

The experiment is the one the merged log survives (see tests/test_logs.py): workers log as
fast as they can, one is SIGKILLed, a new one is started, and we look at whether records
keep arriving. Here the workers are forked and send their records through the package's
one multiprocessing queue, whose write lock a worker holds while it writes to the pipe.

A harness process (its own session, a hard alarm) installs the package on its root logger,
forks four bursting workers (each in its own session, with PR_SET_PDEATHSIG) and then, up
to --kills times, SIGKILLs the oldest worker, aiming for a moment when the write lock is
taken, and forks a replacement. After each kill it waits for a record created after the
kill from every other live worker ("flowing"), or for --quiet seconds without any record
at all ("wedged"). A wedge is then released from outside, by releasing the lock the dead
worker held, and the run goes on if delivery resumes. Each worker holds back while its own
unsent backlog is long, so delivery latency stays small and "flowing" is decided in
milliseconds rather than drowned behind an ever-growing queue.

The harness also asks whether the package accepts the spawn and forkserver start methods.
This process reads the harness's events (one JSON line each), kills every process it
reported by pid (checked against its start time) and the harness's process group at the
end, and prints one table. Exit 0 when the experiment ran; 1 if it could not run or
produced no result; 2 when the package is not installed (it is in the project's `test`
extra). Linux only.
"""
from __future__ import annotations

import argparse
import ctypes
import importlib.metadata
import importlib.util
import json
import logging
import multiprocessing as mp
import os
import queue
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from typing import Any

PACKAGE, MODULE = "multiprocessing-logging", "multiprocessing_logging"
WORKERS = 4
FLOW_DEADLINE = 5.0  # seconds a kill may take to be decided either way
BACKLOG = 20  # records a worker may have queued but not yet written to the pipe
PAD = "x" * 200


# ------------------------------------------------------------------ in the harness
def _out(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def _start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat: with the pid, it names one process for good."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    if fields[0] in (b"Z", b"X"):  # a zombie is dead, whatever its parent does about it
        return None
    return int(fields[19])


def _own_session(parent: int) -> None:
    """First thing in a forked child: die with the harness, then leave its session."""
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the harness died before the line above
        os._exit(1)
    os.setsid()


class _Received(logging.Handler):
    """The handler the package wraps: runs in the harness's receiving thread."""

    def __init__(self) -> None:
        super().__init__()
        self.newest: dict[int, float] = {}  # pid -> creation time of its newest record here
        self.count = 0
        self.last_arrival = 0.0

    def emit(self, record: logging.LogRecord) -> None:
        pid = record.process or 0
        if record.created > self.newest.get(pid, 0.0):
            self.newest[pid] = record.created
        self.count += 1
        self.last_arrival = time.time()

    def senders_since(self, t: float) -> set[int]:
        return {pid for pid, created in dict(self.newest).items() if created > t}


def _probe(parent: int) -> None:
    _own_session(parent)
    logging.getLogger("probe").warning("hello from a child")


def _burst(parent: int, seconds: float) -> None:
    _own_session(parent)
    log = logging.getLogger("burst")
    unsent = logging.getLogger().handlers[0].queue._buffer  # this process's feeder backlog
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        log.info("burst %d %s", n, PAD)
        n += 1
        while len(unsent) > BACKLOG and time.monotonic() < end:
            time.sleep(0.0005)


def _start_methods(mpl: Any, root: logging.Logger) -> dict[str, str]:
    """For spawn and forkserver: refused at install, or does a child's record arrive?"""
    result = {}
    for method in ("spawn", "forkserver"):
        mp.set_start_method(method, force=True)
        received = _Received()
        root.handlers[:] = [received]
        try:
            mpl.install_mp_handler(root)
        except Exception as exc:
            result[method] = f"refused ({type(exc).__name__})"
            continue
        child = mp.Process(target=_probe, args=(os.getpid(),))
        child.start()
        _out(event="child", pid=child.pid, start=_start_time(child.pid))
        child.join(10)
        deadline = time.time() + 2
        while not received.count and time.time() < deadline:
            time.sleep(0.01)
        result[method] = "accepted, records arrive" if received.count else "accepted, records lost"
        mpl.uninstall_mp_handler(root)
    mp.set_start_method("fork", force=True)
    root.handlers[:] = []
    return result


def harness(kills: int, seconds: float, quiet: float) -> None:
    import multiprocessing_logging as mpl

    signal.alarm(int(seconds) + 30)  # the outer process kills us earlier; this is in case it died
    warnings.filterwarnings("ignore", message=".*fork.*", category=DeprecationWarning)  # 3.12+
    stop_at = time.monotonic() + seconds
    me = os.getpid()
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    _out(event="start_methods", result=_start_methods(mpl, root))

    received = _Received()
    root.handlers[:] = [received]
    mpl.install_mp_handler(root)
    write_lock = root.handlers[0].queue._wlock._semlock  # taken by every writer for every record
    live: list[mp.Process] = []

    def start() -> None:
        proc = mp.Process(target=_burst, args=(me, seconds + 20), daemon=True)
        proc.start()
        live.append(proc)
        _out(event="child", pid=proc.pid, start=_start_time(proc.pid))  # unreaped: still ours

    for _ in range(WORKERS):
        start()
    deadline = time.time() + 10
    while len(received.senders_since(0)) < WORKERS and time.time() < deadline:
        time.sleep(0.005)
    for n in range(1, kills + 1):
        if time.monotonic() + FLOW_DEADLINE + quiet + FLOW_DEADLINE > stop_at:
            _out(event="out_of_time", kills=n - 1)
            break
        time.sleep(random.uniform(0.01, 0.05))
        aim = time.time() + 0.05
        while write_lock._get_value() != 0 and time.time() < aim:
            pass  # someone is writing right now: kill while the lock is taken, if we can
        victim = live.pop(0)
        os.kill(victim.pid, signal.SIGKILL)  # our unreaped child: the pid is still its own
        killed_at = time.time()
        victim.join()
        start()  # forked after the kill: it shares the same queue
        others = {p.pid for p in live}
        held_throughout, outcome = True, "undecided"
        while time.time() - killed_at < FLOW_DEADLINE:
            if received.senders_since(killed_at) >= others:
                outcome = "flowing"
                break
            held_throughout = held_throughout and write_lock._get_value() == 0
            if time.time() - max(received.last_arrival, killed_at) > quiet:
                outcome = "wedged"
                break
            time.sleep(0.005)
        event: dict[str, Any] = dict(event="kill", n=n, outcome=outcome,
                                     seconds=round(time.time() - killed_at, 3))
        if outcome != "wedged":
            _out(**event)
            continue
        event.update(silent=round(time.time() - max(received.last_arrival, killed_at), 3),
                     senders_after_kill=len(received.senders_since(killed_at)),
                     alive=sum(p.is_alive() for p in live), workers=len(live),
                     lock_held_throughout=held_throughout, resumed=False)
        if held_throughout:  # free the dead worker's hold on the lock from here
            write_lock.release()
            freed_at = time.time()
            while time.time() - freed_at < FLOW_DEADLINE:
                if received.senders_since(killed_at) >= others:
                    event.update(resumed=True, resume_seconds=round(time.time() - freed_at, 3))
                    break
                time.sleep(0.005)
        _out(**event)
        if not event["resumed"]:
            break  # nothing more can be learnt from a queue that stays stopped
    for proc in live:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
    # Records the killed workers had counted into the queue but never sent would make
    # logging.shutdown() wait in the package's close() for its full timeout: skip it.
    _out(event="done")
    os._exit(0)


# ------------------------------------------------------------- in the outer process
def run(kills: int, seconds: float, quiet: float) -> tuple[list[dict[str, Any]], str, int]:
    """Run the harness; return its events, the tail of its stderr, processes left alive."""
    stderr = tempfile.TemporaryFile()
    harness_proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--harness", str(kills), str(seconds), str(quiet)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, start_new_session=True)
    lines: queue.Queue[dict[str, Any] | None] = queue.Queue()

    def read() -> None:
        assert harness_proc.stdout is not None
        for raw in harness_proc.stdout:
            try:
                lines.put(json.loads(raw))
            except ValueError:
                pass
        lines.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    events: list[dict[str, Any]] = []
    children: list[tuple[int, int]] = []  # (pid, start time) as the harness reported them
    try:
        deadline = time.monotonic() + seconds + 20
        while True:
            try:
                event = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                events.append({"event": "outer_timeout"})
                break
            if event is None:
                break
            events.append(event)
            if event["event"] == "child" and event.get("start") is not None:
                children.append((event["pid"], event["start"]))
    finally:
        for pid, start in children:  # each in its own session: by pid, if still that process
            if _start_time(pid) == start:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if harness_proc.poll() is None:  # unreaped, so its pid (and group id) is still its own
            os.killpg(harness_proc.pid, signal.SIGKILL)
        harness_proc.wait(timeout=10)
        reader.join(timeout=10)
        assert harness_proc.stdout is not None
        harness_proc.stdout.close()
        for pid, _ in children:  # ours only if we are a child subreaper; then reap them
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
    gone_by = time.monotonic() + 5
    while (left := [p for p, s in children if _start_time(p) == s]) and time.monotonic() < gone_by:
        time.sleep(0.05)
    stderr.seek(0)
    tail = stderr.read().decode(errors="replace")[-2000:]
    stderr.close()
    return events, tail, len(left)


def _span(values: list[float]) -> str:
    if not values:
        return "-"
    return f"median {statistics.median(values):.3f} s, max {max(values):.3f} s"


def table(events: list[dict[str, Any]], wall: float, left: int, version: str) -> str:
    kills = [e for e in events if e["event"] == "kill"]
    flowing = [e for e in kills if e["outcome"] == "flowing"]
    wedged = [e for e in kills if e["outcome"] == "wedged"]
    undecided = [e for e in kills if e["outcome"] == "undecided"]
    methods = next((e["result"] for e in events if e["event"] == "start_methods"), {})
    clean = [e for e in wedged if e["senders_after_kill"] == 0 and e["alive"] == e["workers"]
             and e["lock_held_throughout"]]
    resumed = [e for e in wedged if e["resumed"]]
    end = next((e["event"] for e in events if e["event"] in ("done", "outer_timeout")), "crashed")
    rows = [
        ("package", f"{PACKAGE} {version}, Python {sys.version.split()[0]}, {WORKERS} workers forked"),
        ("start methods", "; ".join(["fork: accepted", *(f"{m}: {r}" for m, r in methods.items())])),
        ("kills tried", f"{len(kills)} in {wall:.1f} s" + ("" if end == "done" else f" (harness: {end})")),
        ("kept flowing", f"{len(flowing)}: a new record from every other worker after "
                         f"{_span([e['seconds'] for e in flowing])}"),
        ("wedged delivery", f"{len(wedged)}: no record at all for {_span([e['silent'] for e in wedged])}"),
        ("  of which", f"{len(clean)} with all other workers alive (one forked after the kill), "
                       "none delivering, the write lock taken throughout"),
        ("undecided", f"{len(undecided)}: neither within {FLOW_DEADLINE:.0f} s"),
        ("lock freed outside", f"delivery resumed after {len(resumed)} of {len(wedged)} wedges, "
                               f"within {_span([e['resume_seconds'] for e in resumed])}"),
        ("processes left", str(left)),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Measure whether multiprocessing-logging survives "
                                                 "SIGKILLed workers.")
    parser.add_argument("--kills", type=int, default=40, help="most kills to try (default 40)")
    parser.add_argument("--seconds", type=float, default=90.0, help="time budget (default 90)")
    parser.add_argument("--quiet", type=float, default=3.0,
                        help="seconds without any record that count as wedged (default 3)")
    parser.add_argument("--json", action="store_true", help="print the harness's events as well")
    args = parser.parse_args(argv)
    if not sys.platform.startswith("linux"):
        print("measure_mp_logging: needs Linux (fork, /proc, PR_SET_PDEATHSIG)", file=sys.stderr)
        return 1
    if importlib.util.find_spec(MODULE) is None:
        print(f"measure_mp_logging: {PACKAGE} is not installed; it is in the project's test extra:\n"
              "    pip install -e '.[test]'\n"
              f"or on its own: pip install '{PACKAGE}>=0.3.4,<0.5'", file=sys.stderr)
        return 2
    version = importlib.metadata.version(PACKAGE)
    began = time.monotonic()
    events, stderr_tail, left = run(max(1, args.kills), max(15.0, args.seconds), max(0.5, args.quiet))
    wall = time.monotonic() - began
    if args.json:
        for event in events:
            print(json.dumps(event))
    if not any(e["event"] == "kill" for e in events):
        print("measure_mp_logging: the harness produced no result", file=sys.stderr)
        print(stderr_tail, file=sys.stderr)
        return 1
    print(table(events, wall, left, version))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--harness"]:
        harness(int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]))
    else:
        sys.exit(main())
