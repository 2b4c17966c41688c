"""The merged worker log: unit checks of MergedLog, then workers SIGKILLed mid-burst.

The chaos tests kill workers while they log as fast as they can, start new ones, and check
that the merged log keeps flowing through per-worker pipes, which is what the pool does:
each worker's stderr is its own pipe, read line by line by its own thread into a MergedLog.

The same experiment run against multiprocessing-logging, the package the design brief named
(forked workers sending records through one shared multiprocessing queue), is a measurement
of that package, not a test of ours: scripts/measure_mp_logging.py runs it and prints figures.
"""
from __future__ import annotations

import json
import os
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

from supervisor.procs.logs import MAX_LINE, MergedLog

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
