"""Test only: one `serve` process at a time, in its own session, with everything it starts
recorded (pid and start time) so that it can be killed by recorded pid and checked gone; and
the small readers and model scripts the daemon tests share. The `daemons` fixture
(tests/conftest.py) starts them."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from bench.procs import kill_group, note_descendants, sigkill_survivors
from hermes.state import SessionDB
from supervisor.chaos.checker import check_structure
from supervisor.daemon import inbox
from testkit.modelserver import Reply, ToolCallSpec, last_user_text, reply_index

REPO = Path(__file__).resolve().parents[2]
HELPERS = Path(__file__).resolve().parent


def env_for(tmp_path: Path, *paths: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost", HERMES_HOME=str(tmp_path / "home"))
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env.update(extra)
    return env


def cli(*args: str, env: dict[str, str], cwd: Path = REPO, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor.daemon.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def wait_for(what: str, predicate: Callable[[], Any], timeout: float = 30.0, every: float = 0.02) -> Any:
    """Poll `predicate` until it holds (a condition, never a fixed delay); fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


def turn_state(db: Path, turn: str) -> str | None:
    with SessionDB(db, readonly=True) as handle:
        row = handle.get_turn(turn)
    return row["state"] if row else None


def assert_well_formed(db: Path, *sessions: str) -> None:
    for session in sessions:
        verdict = check_structure(db, session)
        assert verdict.valid is True, json.dumps(verdict.to_json(), indent=1)[:3000]


def slow_script(seconds: dict[str, float], others: float | None = None) -> Callable[[list[dict]], Reply]:
    """A message starting with a key of `seconds` runs slow_lookup that long first, any other one for
    `others` seconds (None: none runs it); then the answer is `done: <message>`."""

    def script(messages: list[dict]) -> Reply:
        text = last_user_text(messages) or ""
        delay = next((s for prefix, s in seconds.items() if text.startswith(prefix)), others)
        if delay is not None and reply_index(messages) == 0:
            return Reply(tool_calls=(ToolCallSpec("slow_lookup", {"key": "k", "seconds": delay}),))
        return Reply(content=f"done: {text}")

    return script


class Served:
    """A `serve` process; `seen` holds every process it started (pid -> start time)."""

    def __init__(self, tmp_path: Path, db: Path | None, *args: str, env: dict[str, str] | None = None,
                 cwd: Path = REPO, wait_ready: bool = True, files: Path | None = None) -> None:
        self.db = db
        self._files = files  # the base of its status file when it is not `db` (a fleet daemon's: HOME/fleet)
        self.out = tmp_path / f"daemon-{time.monotonic_ns()}.out"
        self.seen: dict[int, float] = {}
        argv = [sys.executable, "-m", "supervisor.daemon.cli", "serve", *(["--db", str(db)] if db else []), *args]
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen(argv, cwd=cwd, env=env or env_for(tmp_path), stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=out, start_new_session=True)
        self.pid = self.proc.pid
        self.created = psutil.Process(self.pid).create_time()
        if wait_ready:
            try:
                wait_for("the daemon to serve", self.serving)
            except AssertionError:
                self.cleanup()
                raise AssertionError(f"daemon did not start: {self.output()}") from None

    @property
    def files(self) -> Path | None:
        return self._files or self.db

    def serving(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"daemon exited with {self.proc.returncode}: {self.output()}")
        status = inbox.read_status(self.files) if self.files else None
        return bool(status and status.get("pid") == self.pid and status.get("state") == "running")

    def output(self) -> str:
        return self.out.read_text(encoding="utf-8", errors="replace")

    def note_children(self) -> list[psutil.Process]:
        """Record (in `seen`) and return the processes it runs now."""
        return note_descendants(self.pid, self.seen)

    def live_workers(self) -> list[dict[str, Any]]:
        """The workers its status file records, still alive as those very processes."""
        self.note_children()
        status = inbox.read_status(self.files) if self.files else None
        if not status or status.get("pid") != self.pid:
            return []
        return [w for w in status.get("workers", []) if inbox.process_alive(w["pid"], w["create_time"])]

    def zombies(self) -> list[int]:
        """The daemon's children that exited and were never reaped."""
        out = []
        try:
            for child in psutil.Process(self.pid).children():
                try:
                    if child.status() == psutil.STATUS_ZOMBIE:
                        out.append(child.pid)
                except psutil.NoSuchProcess:
                    pass
        except psutil.Error:
            pass
        return out

    def survivors(self, timeout: float = 0.0) -> list[int]:
        """The processes it started still alive, looked at again until none is or `timeout` has passed."""
        deadline = time.monotonic() + timeout
        while True:
            left = [pid for pid, created in self.seen.items() if inbox.process_alive(pid, created)]
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.05)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM (drain), wait, and check that nothing it started is left."""
        self.note_children()
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        wait_for("every process the daemon started to be gone", lambda: not self.survivors(), timeout=10)
        return code

    def cleanup(self) -> None:
        """For a `finally`: kill the daemon and whatever it started, by recorded pid."""
        self.note_children()
        kill_group(self.proc, 10)
        sigkill_survivors(self.seen)


class Daemons:
    """Every daemon a test started, cleaned up at its end."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[Served] = []

    def __call__(self, db: Path | None, *args: str, env: dict[str, str] | None = None, cwd: Path = REPO,
                 wait_ready: bool = True, files: Path | None = None) -> Served:
        served = Served(self.tmp_path, db, *args, env=env, cwd=cwd, wait_ready=wait_ready, files=files)
        self.started.append(served)
        return served

    def cleanup(self) -> None:
        for served in self.started:
            served.cleanup()
