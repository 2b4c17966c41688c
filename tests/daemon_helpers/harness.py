"""Test only: one `serve` process at a time, in its own session, with everything it starts
recorded (pid and start time) so that it can be killed by recorded pid and checked gone."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from supervisor.daemon import inbox

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


class Served:
    """A `serve` process; `seen` holds every process it started (pid -> start time)."""

    def __init__(self, tmp_path: Path, db: Path | None, *args: str, env: dict[str, str], cwd: Path = REPO,
                 wait_ready: bool = True) -> None:
        self.db = db
        self.out = tmp_path / f"daemon-{time.monotonic_ns()}.out"
        self.seen: dict[int, float] = {}
        argv = [sys.executable, "-m", "supervisor.daemon.cli", "serve", *(["--db", str(db)] if db else []), *args]
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                         start_new_session=True)
        self.pid = self.proc.pid
        self.created = psutil.Process(self.pid).create_time()
        if wait_ready:
            try:
                wait_for("the daemon to serve", self.serving)
            except AssertionError:
                self.cleanup()
                raise AssertionError(f"daemon did not start: {self.output()}") from None

    def serving(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"daemon exited with {self.proc.returncode}: {self.output()}")
        status = inbox.read_status(self.db) if self.db else None
        return bool(status and status.get("pid") == self.pid and status.get("state") == "running")

    def output(self) -> str:
        return self.out.read_text(encoding="utf-8", errors="replace")

    def note_children(self) -> list[psutil.Process]:
        try:
            children = psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            return []
        for child in children:
            try:
                self.seen.setdefault(child.pid, child.create_time())
            except psutil.Error:
                pass
        return children

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

    def survivors(self) -> list[int]:
        return [pid for pid, created in self.seen.items() if inbox.process_alive(pid, created)]

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
        if self.proc.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)
        for pid, created in self.seen.items():
            if pid > 1 and inbox.process_alive(pid, created):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


class Daemons:
    """Every daemon a test started, cleaned up at its end."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[Served] = []

    def __call__(self, db: Path | None, *args: str, env: dict[str, str], cwd: Path = REPO,
                 wait_ready: bool = True) -> Served:
        served = Served(self.tmp_path, db, *args, env=env, cwd=cwd, wait_ready=wait_ready)
        self.started.append(served)
        return served

    def cleanup(self) -> None:
        for served in self.started:
            served.cleanup()
