"""The merged worker log: unit checks of MergedLog, then workers SIGKILLed mid-burst.

The chaos tests measure two designs with the same experiment (kill workers while they
log as fast as they can, start new ones, see whether the merged log keeps flowing):

  per-worker pipes         what the pool does: each worker's stderr is its own pipe,
                           read line by line by its own thread into a MergedLog.
  multiprocessing-logging  the package the design brief named: forked workers send
                           records through one multiprocessing queue shared by all.

The second test asserts what was measured: a worker killed while it holds the queue's
write lock stops delivery for every other worker, including ones started later.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from supervisor.logs import MAX_LINE, MergedLog

CHAOS = (pytest.mark.chaos, pytest.mark.xdist_group("chaos"))


def chaos(fn: Any) -> Any:
    for mark in CHAOS:
        fn = mark(fn)
    return fn


@dataclass
class Src:
    """Stands in for the pool's WorkerProcess: what MergedLog reads from it."""
    pid: int
    incarnation: int = 0


def read_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of a merged log, each of which must be one JSON object."""
    records = []
    for number, raw in enumerate(path.read_bytes().split(b"\n")[:-1], 1):
        record = json.loads(raw)  # any corrupt line fails the test here
        assert isinstance(record, dict), f"line {number} is not a JSON object: {raw[:200]!r}"
        records.append(record)
    return records


def worker_line(**fields: Any) -> bytes:
    return (json.dumps(fields) + "\n").encode()


# ------------------------------------------------------------------------ unit
def test_worker_json_is_kept_and_tagged(tmp_path: Path) -> None:
    path = tmp_path / "merged.jsonl"
    with MergedLog(path, case="c1", clock=lambda: 100.0) as log:
        log.on_log(Src(41, 2), worker_line(ts=99.5, level="info", logger="worker", msg="hi",
                                           worker="s1", pid=41, incarnation=2))
    [rec] = read_lines(path)
    assert rec == {"recv_ts": 100.0, "src": "worker", "pid": 41, "incarnation": 2, "case": "c1",
                   "ts": 99.5, "level": "info", "logger": "worker", "msg": "hi", "worker": "s1"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_text_and_non_object_json_become_raw_lines(tmp_path: Path) -> None:
    path = tmp_path / "merged.jsonl"
    with MergedLog(path) as log:
        for line in (b"Traceback (most recent call last):\n", b"[1, 2]\n", b"42\n", b'{"a": NaN}\n',
                     b"\xff\xfe not utf-8\n", b"\n", b"   \r\n"):
            log.on_log(Src(7), line)
    records = read_lines(path)
    assert [r["msg"] for r in records] == ["Traceback (most recent call last):", "[1, 2]", "42",
                                           '{"a": NaN}', "\ufffd\ufffd not utf-8"]
    assert all(r["level"] == "raw" and r["src"] == "worker" and r["pid"] == 7 for r in records)
    assert "case" not in records[0]


def test_supervisor_tags_win_and_disagreements_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "merged.jsonl"
    cases = {5: "per-proc"}
    with MergedLog(path, case="default", cases=cases) as log:
        log.on_log(Src(5, 1), worker_line(msg="m", pid=999, incarnation=1, src="me", recv_ts=1))
        log.set_case(6, "later")
        log.on_log(Src(6, 0), worker_line(msg="n"))
        log.on_log(Src(8, 0), worker_line(msg="o"))
    a, b, c = read_lines(path)
    assert (a["pid"], a["worker_pid"], a["incarnation"], a["src"], a["worker_src"]) == (5, 999, 1, "worker", "me")
    assert "worker_incarnation" not in a and a["worker_recv_ts"] == 1
    assert (a["case"], b["case"], c["case"]) == ("per-proc", "later", "default")


def test_partial_last_line_is_written_and_marked(tmp_path: Path) -> None:
    path = tmp_path / "merged.jsonl"
    with MergedLog(path) as log:
        log.on_log(Src(3), b'{"seq": 0, "msg": "whole"}\n')
        log.on_log(Src(3), b'{"seq": 1, "msg": "cut off by SIG')
    whole, partial = read_lines(path)
    assert "truncated" not in whole and whole["seq"] == 0
    assert partial["truncated"] is True and partial["level"] == "raw"
    assert partial["msg"] == '{"seq": 1, "msg": "cut off by SIG'


def test_overlong_lines_are_cut_and_marked(tmp_path: Path) -> None:
    path = tmp_path / "merged.jsonl"
    # "é" is two bytes in UTF-8: the cut falls inside the JSON and inside a character
    line = (json.dumps({"msg": "é" * MAX_LINE}, ensure_ascii=False) + "\n").encode()
    with MergedLog(path) as log:
        log.on_log(Src(9), line)
        log.on_log(Src(9), b"x" * MAX_LINE + b"\n")  # exactly at the limit: kept whole
    cut, kept = read_lines(path)
    assert cut["cut"] is True and cut["bytes"] == len(line) - 1 and cut["level"] == "raw"
    assert cut["msg"].startswith('{"msg": "éé') and cut["msg"].encode().count(b"\xc3\xa9") < MAX_LINE // 2
    assert "cut" not in kept and len(kept["msg"]) == MAX_LINE


def test_supervisor_events_share_the_file(tmp_path: Path) -> None:
    path = tmp_path / "merged.jsonl"
    with MergedLog(path, case="c", clock=lambda: 5.0) as log:
        log.log_event(event="spawn", pid=12, incarnation=0)
        log.log_event(event="kill", level="warning", src="spoof", ratio=float("nan"))
    spawn, kill = read_lines(path)
    assert spawn == {"recv_ts": 5.0, "src": "supervisor", "ts": 5.0, "level": "info", "case": "c",
                     "event": "spawn", "pid": 12, "incarnation": 0}
    assert kill["src"] == "supervisor" and "nan" in kill["msg"]


def test_reopen_follows_rotation(tmp_path: Path) -> None:
    path = tmp_path / "merged.jsonl"
    log = MergedLog(path)
    log.on_log(Src(1), worker_line(msg="before"))
    path.rename(tmp_path / "merged.jsonl.1")
    log.on_log(Src(1), worker_line(msg="still to the old file until reopened"))
    assert log.reopen() is True
    log.on_log(Src(1), worker_line(msg="after"))
    log.close()
    log.on_log(Src(1), worker_line(msg="after close"))  # must not raise: it is counted
    assert [r["msg"] for r in read_lines(tmp_path / "merged.jsonl.1")] == [
        "before", "still to the old file until reopened"]
    assert [r["msg"] for r in read_lines(path)] == ["after"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert (log.lines, log.dropped) == (3, 1)


def test_reopen_while_the_lock_is_held_is_done_before_the_next_line(tmp_path: Path) -> None:
    path = tmp_path / "merged.jsonl"
    log = MergedLog(path)
    path.rename(tmp_path / "old")
    with log._lock:  # as if a SIGHUP handler interrupted a write in progress
        assert log.reopen() is False
    log.on_log(Src(1), worker_line(msg="new file"))
    log.close()
    assert [r["msg"] for r in read_lines(path)] == ["new file"]


def test_a_failed_write_costs_one_line_not_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "merged.jsonl"
    log = MergedLog(path)
    real_write = os.write
    calls = 0

    def disk_fills_mid_line(fd: int, data: Any) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            return real_write(fd, bytes(data[:10]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", disk_fills_mid_line)
    log.on_log(Src(1), worker_line(msg="lost"))  # must not raise into the reader thread
    monkeypatch.setattr(os, "write", real_write)
    log.on_log(Src(1), worker_line(msg="kept"))
    log.close()
    fragment, kept = path.read_bytes().split(b"\n")[:2]
    assert len(fragment) == 10 and json.loads(kept)["msg"] == "kept"
    assert (log.lines, log.dropped) == (1, 1) and isinstance(log.last_error, OSError)


def test_stream_target_text_and_binary(tmp_path: Path) -> None:
    with open(tmp_path / "t.jsonl", "w", encoding="utf-8") as text, open(tmp_path / "b.jsonl", "wb") as binary:
        for stream in (text, binary):
            log = MergedLog(stream)
            log.on_log(Src(2), worker_line(msg="line\u2028sep"))
            log.close()
            assert not stream.closed
    for name in ("t.jsonl", "b.jsonl"):
        raw = (tmp_path / name).read_text(encoding="utf-8")
        assert raw.splitlines() == [raw.rstrip("\n")]  # U+2028 is escaped, not a line break
        assert json.loads(raw)["msg"] == "line\u2028sep"


def test_many_threads_never_interleave(tmp_path: Path) -> None:
    path = tmp_path / "merged.jsonl"
    log = MergedLog(path)
    pad = "p" * 3000

    def writer(pid: int) -> None:
        for seq in range(300):
            log.on_log(Src(pid), worker_line(seq=seq, pad=pad))

    threads = [threading.Thread(target=writer, args=(pid,)) for pid in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    log.close()
    seqs: dict[int, list[int]] = {}
    for rec in read_lines(path):
        seqs.setdefault(rec["pid"], []).append(rec["seq"])
    assert seqs == {pid: list(range(300)) for pid in range(8)}


# ------------------------------------------------------------------ real processes
BURST = textwrap.dedent("""
    import json, os, sys, time
    pid, inc, n, end = os.getpid(), int(sys.argv[1]), 0, time.monotonic() + 30
    pad = "x" * 120
    while time.monotonic() < end:  # a tight loop of log lines, like a worker that is very busy
        sys.stderr.write(json.dumps({"ts": time.time(), "level": "info", "logger": "burst",
                                     "msg": "burst", "seq": n, "pid": pid, "incarnation": inc,
                                     "pad": pad}) + "\\n")
        sys.stderr.flush()
        n += 1
        if n % 20 == 0:
            time.sleep(0.001)
""")

PARTIAL = textwrap.dedent("""
    import os, sys, time
    os.write(2, b'{"seq": 0, "msg": "whole"}\\n')
    os.write(2, b'{"seq": 1, "msg": "half of a li')
    print("ready", flush=True)
    time.sleep(30)
""")


class PipeHarness:
    """Children with a stderr pipe each, read line by line by a thread each, as the pool does."""

    def __init__(self, log: MergedLog) -> None:
        self.log = log
        self.children: list[subprocess.Popen[bytes]] = []
        self.readers: dict[int, threading.Thread] = {}
        self.counts: Counter[int] = Counter()
        self.after: Counter[int] = Counter()  # lines received after `mark` was set
        self.mark: float | None = None

    def start(self, program: str, incarnation: int, **popen: Any) -> subprocess.Popen[bytes]:
        child = subprocess.Popen([sys.executable, "-c", program, str(incarnation)], stdin=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, start_new_session=True,
                                 **({"stdout": subprocess.DEVNULL} | popen))
        self.children.append(child)
        src = Src(child.pid, incarnation)

        def read() -> None:
            assert child.stderr is not None
            for line in child.stderr:
                self.log.on_log(src, line)
                self.counts[src.pid] += 1
                if self.mark is not None:
                    self.after[src.pid] += 1
            child.stderr.close()

        self.readers[child.pid] = threading.Thread(target=read, daemon=True, name=f"log-{child.pid}")
        self.readers[child.pid].start()
        return child

    def wait_for(self, condition: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {dict(self.counts)}"
            time.sleep(0.01)

    @staticmethod
    def kill(child: subprocess.Popen[bytes]) -> None:
        if child.poll() is None:  # not reaped yet, so the recorded pid is still this child
            os.killpg(child.pid, signal.SIGKILL)  # its own session: pgid == recorded pid
        child.wait(timeout=10)

    def close(self) -> None:
        for child in self.children:
            self.kill(child)
        for reader in self.readers.values():
            reader.join(timeout=10)


@pytest.fixture
def pipes(tmp_path: Path) -> Iterator[PipeHarness]:
    harness = PipeHarness(MergedLog(tmp_path / "merged.jsonl", case="burst"))
    try:
        yield harness
    finally:
        harness.close()
        harness.log.close()


@chaos
def test_per_worker_pipes_keep_flowing_when_workers_die_mid_burst(pipes: PipeHarness, tmp_path: Path) -> None:
    first = [pipes.start(BURST, incarnation=0) for _ in range(4)]
    pipes.wait_for(lambda: all(pipes.counts[c.pid] >= 300 for c in first), 15, "all four bursting")
    victims, survivors = first[:2], first[2:]
    kill_ts = time.time()
    pipes.mark = time.monotonic()
    for child in victims:
        os.killpg(child.pid, signal.SIGKILL)  # mid-burst: they never stop writing on their own
    newcomers = [pipes.start(BURST, incarnation=1) for _ in range(2)]
    for child in victims:
        child.wait(timeout=10)
        pipes.readers[child.pid].join(timeout=10)
        assert not pipes.readers[child.pid].is_alive(), "a dead worker's reader must reach end of file"
    pipes.wait_for(lambda: all(pipes.after[c.pid] >= 500 for c in survivors + newcomers), 15,
                   "lines from survivors and newcomers after the kills")
    pipes.close()
    pipes.log.close()

    records = read_lines(tmp_path / "merged.jsonl")  # every line parses as one JSON object
    assert pipes.log.dropped == 0 and pipes.log.lines == len(records)
    by_pid: dict[int, list[dict[str, Any]]] = {}
    for rec in records:
        assert rec["src"] == "worker" and rec["case"] == "burst"
        by_pid.setdefault(rec["pid"], []).append(rec)
    assert set(by_pid) == {c.pid for c in first + newcomers}
    for child in first + newcomers:
        lines = by_pid[child.pid]
        whole = [r for r in lines if not r.get("truncated")]
        assert all(r["level"] == "info" and "worker_pid" not in r for r in whole)
        assert [r["seq"] for r in whole] == list(range(len(whole))), f"gap or reorder in {child.pid}"
        assert len(lines) - len(whole) <= (1 if child in victims else 0)
        assert lines[-1] is whole[-1] or lines[-1]["truncated"]  # only the very last line may be partial
        assert {r["incarnation"] for r in lines} == {1 if child in newcomers else 0}
    for child in survivors + newcomers:
        assert sum(r["recv_ts"] > kill_ts for r in by_pid[child.pid]) >= 500
    for child in victims:
        assert child.returncode == -signal.SIGKILL
        assert len(by_pid[child.pid]) >= 300


@chaos
def test_partial_line_of_a_killed_worker_reaches_the_log(pipes: PipeHarness, tmp_path: Path) -> None:
    child = pipes.start(PARTIAL, incarnation=3, stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline() == b"ready\n"
    child.stdout.close()
    pipes.kill(child)
    pipes.readers[child.pid].join(timeout=10)
    pipes.log.close()
    whole, partial = read_lines(tmp_path / "merged.jsonl")
    assert whole["msg"] == "whole" and whole["pid"] == child.pid and whole["incarnation"] == 3
    assert partial["truncated"] is True and partial["msg"] == '{"seq": 1, "msg": "half of a li'


# ------------------------------------------------------------ multiprocessing-logging
# Run in a harness process of its own: the package needs the fork start method, and a
# pytest process with threads is no place to fork from. The harness prints one JSON line
# per event; the pids of its forked workers come first, so the test can kill them even if
# the harness itself hangs.
MPL_HARNESS = textwrap.dedent("""
    import ctypes, json, logging, multiprocessing as mp, os, random, signal, sys, time
    import multiprocessing_logging as mpl

    MAX_KILLS, QUIET, FLOW_DEADLINE, WORKERS = 60, 2.0, 5.0, 4

    def out(**fields):
        sys.stdout.write(json.dumps(fields) + "\\n")
        sys.stdout.flush()

    class Received(logging.Handler):  # the sub-handler: runs in the parent's receiving thread
        def __init__(self):
            super().__init__()
            self.got = []
        def emit(self, record):
            self.got.append((record.process, record.created, time.time()))

    def probe():
        logging.getLogger("probe").warning("hello from a child")

    def burst():
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        log, n = logging.getLogger("burst"), 0
        end = time.monotonic() + 30
        while time.monotonic() < end:
            log.info("burst %d %s", n, "x" * 200)
            n += 1
            if n % 10 == 0:
                time.sleep(0.001)

    def other_start_methods(root):
        \"\"\"For spawn and forkserver: refused at install, or does a child's record arrive?\"\"\"
        result = {}
        for method in ("spawn", "forkserver"):
            mp.set_start_method(method, force=True)
            received = Received()
            root.handlers[:] = [received]
            try:
                mpl.install_mp_handler(root)
            except Exception as exc:
                result[method] = {"refused": f"{type(exc).__name__}: {exc}"}
                continue
            child = mp.Process(target=probe)
            child.start()
            out(event="child", pid=child.pid)
            child.join(10)
            deadline = time.time() + 2
            while not received.got and time.time() < deadline:
                time.sleep(0.01)
            result[method] = {"refused": None, "delivered": bool(received.got)}
            mpl.uninstall_mp_handler(root)
        mp.set_start_method("fork", force=True)
        root.handlers[:] = []
        return result

    def main():
        signal.alarm(60)  # never outlive the test; the workers die with us (PDEATHSIG)
        root = logging.getLogger()
        root.setLevel(logging.INFO)
        out(event="start_methods", result=other_start_methods(root))

        received = Received()
        root.handlers[:] = [received]
        mpl.install_mp_handler(root)
        write_lock = root.handlers[0].queue._wlock._semlock  # the lock every writer takes per record
        live = []

        def start():
            proc = mp.Process(target=burst, daemon=True)
            proc.start()
            live.append(proc)
            out(event="child", pid=proc.pid)

        def arrived_since(t):
            return {pid for pid, created, _ in list(received.got) if created > t}

        for _ in range(WORKERS):
            start()
        deadline = time.time() + 10
        while len(arrived_since(0)) < WORKERS and time.time() < deadline:
            time.sleep(0.005)
        for kill in range(1, MAX_KILLS + 1):
            time.sleep(random.uniform(0.01, 0.05))
            aim = time.time() + 0.05
            while write_lock._get_value() != 0 and time.time() < aim:
                pass  # someone is writing right now: kill while the lock is taken, if we can
            victim = live.pop(0)
            os.kill(victim.pid, signal.SIGKILL)
            killed_at = time.time()
            victim.join()
            start()  # a worker forked after the kill shares the same queue
            others = {p.pid for p in live}
            held_throughout, outcome, last = True, "slow", killed_at
            while time.time() - killed_at < FLOW_DEADLINE:
                if arrived_since(killed_at) >= others:
                    outcome = "flowing"
                    break
                held_throughout = held_throughout and write_lock._get_value() == 0
                got = list(received.got)
                last = max(got[-1][2] if got else 0.0, killed_at)
                if time.time() - last > QUIET:
                    outcome = "stopped"
                    break
                time.sleep(0.005)
            seconds = round(time.time() - killed_at, 3)
            if outcome != "stopped":
                out(event="kill", n=kill, outcome=outcome, seconds=seconds)
                continue
            stopped = dict(event="kill", n=kill, outcome=outcome, seconds=seconds,
                           last_delivery_after_kill=round(last - killed_at, 4),
                           lock_held_throughout=held_throughout, delivered_after_kill=len(arrived_since(killed_at)),
                           alive=sum(p.is_alive() for p in live), workers=len(live))
            if held_throughout:  # prove the cause: free the dead worker's hold on the lock from here
                write_lock.release()
                freed_at = time.time()
                while arrived_since(killed_at) < others and time.time() - freed_at < FLOW_DEADLINE:
                    time.sleep(0.005)
                stopped["resumed_after_release"] = arrived_since(killed_at) >= others
                stopped["resume_seconds"] = round(time.time() - freed_at, 3)
            out(**stopped)
            break
        for proc in live:
            os.kill(proc.pid, signal.SIGKILL)
            proc.join()
        # The queue's count still includes records that killed workers had queued but never
        # sent, so at exit logging.shutdown() would sit in the package's close() for its full
        # 5 s timeout waiting for them. Skip that wait.
        out(event="done", pending=root.handlers[0].queue.qsize())
        os._exit(0)

    if __name__ == "__main__":  # spawn and forkserver children import this file again
        main()
""")


@chaos
def test_multiprocessing_logging_wedges_when_a_worker_dies_holding_the_queue_lock(tmp_path: Path) -> None:
    pytest.importorskip("multiprocessing_logging", reason="measures the package the design brief named; "
                        "pip install 'multiprocessing-logging>=0.3.4,<0.5' to run it")
    script = tmp_path / "mpl_harness.py"
    script.write_text(MPL_HARNESS)
    harness = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               start_new_session=True, cwd=tmp_path)
    lines: queue.Queue[dict[str, Any] | None] = queue.Queue()

    def read() -> None:
        assert harness.stdout is not None
        for raw in harness.stdout:
            lines.put(json.loads(raw))
        lines.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    events: list[dict[str, Any]] = []
    children: list[int] = []
    try:
        deadline = time.monotonic() + 45
        while True:
            try:
                event = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"the harness ran out of time; last events: {events[-3:]}")
            if event is None:
                break
            events.append(event)
            if event["event"] == "child":
                children.append(event["pid"])
    finally:
        # Kill the harness's forked workers by their recorded pids while the harness, their
        # parent, still holds them (same process group: not reaped, so not reused), then it.
        for pid in children:
            try:
                if os.getpgid(pid) == harness.pid:
                    os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if harness.poll() is None:
            os.killpg(harness.pid, signal.SIGKILL)
        harness.wait(timeout=10)
        reader.join(timeout=10)
        assert harness.stdout is not None
        harness.stdout.close()
        for pid in children:  # if we are a child subreaper (the pool's fork server), orphans are ours
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass

    assert events and events[-1]["event"] == "done", f"harness did not finish: {events[-3:]}"
    # Only fork works: 0.4 refuses the other start methods outright; 0.3 accepted them, but a
    # child started that way never had the handler, so its records did not arrive.
    methods = next(e["result"] for e in events if e["event"] == "start_methods")
    for method in ("spawn", "forkserver"):
        outcome = methods[method]
        assert (outcome["refused"] or "").startswith("AssertionError") or outcome["delivered"] is False, methods

    kills = [e for e in events if e["event"] == "kill"]
    summary = f"{len(kills)} kills: " + " ".join(f"{e['outcome']}:{e['seconds']}" for e in kills)
    assert kills and kills[-1]["outcome"] == "stopped", f"no kill stopped the queue; {summary}"
    wedge = kills[-1]
    # Every other worker, including one forked after the kill, was alive and logging, yet
    # not one record created after the kill was delivered for QUIET seconds ...
    assert wedge["delivered_after_kill"] == 0 and wedge["alive"] == wedge["workers"] == 4, wedge
    # ... while the queue's write lock stayed taken, and freeing the dead worker's hold on it
    # from outside let all of them through: the lock was the cause.
    assert wedge["lock_held_throughout"] and wedge["resumed_after_release"], wedge
    print(f"multiprocessing-logging: {summary}; {wedge}")
