"""Worker processes: spawned in their own session, watched, killed by recorded pid, reaped once.

Each worker gets one end of a socketpair as its control channel (inherited, so no
other user can reach it) and a pipe for its JSON-lines stderr. Three threads per
worker: the channel reader, the stderr reader, and the reaper, which is the only
code that ever waits on the child.

A process that made itself a child subreaper (``become_subreaper``) also inherits every
orphan its workers leave behind (a tool that forked and returned), and must reap those
too or they stay zombies: ``reap_orphans`` waits for each child of this process that no
thread here waits for (``claim_child`` registers one; the pools register theirs). Code
in such a process that starts children some other way must claim them, or let the pool
start them. No pid of 1 or less is ever signalled or handed out: a fork server's reply of
one is refused as an error.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import psutil

from worker.protocol import Channel, ChannelClosed, send_with_fds

REPO_ROOT = Path(__file__).resolve().parents[2]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for workers: loopback is never proxied, the project is importable;
    `extra` (e.g. a secret that must stay out of every command line) on top."""
    env = dict(os.environ)
    env.update(extra or {})
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    return env


# ------------------------------------------------------------ this process's children
_children_lock = threading.Lock()
_claimed: set[int] = set()   # children some thread of this process waits for itself
_starting = 0                # children being started whose pid is not claimed yet


def claim_child(pid: int) -> None:
    """Say that some code of this process waits for child `pid` itself: `reap_orphans` leaves it alone."""
    with _children_lock:
        _claimed.add(pid)


def release_child(pid: int) -> None:
    """`pid` was waited for (it no longer exists as our child)."""
    with _children_lock:
        _claimed.discard(pid)


@contextlib.contextmanager
def starting_child() -> Iterator[None]:
    """Around the start of a child and its `claim_child`: until then `reap_orphans` reaps nothing
    (the new child could exit before it is claimed)."""
    global _starting
    with _children_lock:
        _starting += 1
    try:
        yield
    finally:
        with _children_lock:
            _starting -= 1


def _child_pids() -> set[int]:
    """This process's children, zombies included (every thread's, from /proc; psutil if absent)."""
    pids: set[int] = set()
    found = False
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        tasks = []
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/children", encoding="ascii") as fh:
                pids.update(int(p) for p in fh.read().split())
            found = True
        except (OSError, ValueError):
            continue
    if not found:
        try:
            pids = {c.pid for c in psutil.Process().children()}
        except psutil.Error:
            pids = set()
    return pids


def reap_orphans(kill: bool = False) -> list[tuple[int, int]]:
    """Reap every exited child of this process that nobody here waits for (orphans a subreaper
    inherited); `kill`: SIGKILL those still running first (at shutdown), and reap them too.
    Returns (pid, exit status as subprocess gives it) of each one reaped."""
    reaped: list[tuple[int, int]] = []
    for _ in range(10 if kill else 1):  # a killed orphan's own children are inherited next
        with _children_lock:
            if _starting:
                return reaped
            strays = sorted(p for p in _child_pids() - _claimed if p > 1)
            for pid in strays:
                if kill:
                    try:  # our child, not yet reaped, so the pid is still this very process
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                try:
                    done, status = os.waitpid(pid, 0 if kill else os.WNOHANG)
                except ChildProcessError:
                    continue
                if done == pid:
                    reaped.append((pid, os.waitstatus_to_exitcode(status)))
        if not strays:
            break
    return reaped


@dataclass
class WorkerProcess:
    incarnation: int
    channel: Channel
    pid: int
    create_time: float | None
    spawned_at: float = field(default_factory=time.monotonic)
    returncode: int | None = None
    exited: threading.Event = field(default_factory=threading.Event)
    killed_by: str | None = None
    label: str | None = None  # what the worker is for (e.g. its case), for tagging its logs

    @property
    def signal(self) -> int | None:
        return -self.returncode if self.returncode is not None and self.returncode < 0 else None

    def send(self, message: dict[str, Any]) -> None:
        try:
            self.channel.send(message)
        except ChannelClosed:
            pass  # it died; the reaper records how

    def acknowledge(self, message: dict[str, Any]) -> None:
        """Answer a report the worker waits on (it carries a `seq`): a projection, an effect, a
        final answer. A supervisor that records nothing still has to answer, or the worker waits."""
        if "seq" in message:
            self.send({"type": "ack", "seq": message["seq"]})

    def _same_process(self) -> bool:
        """Guard against pid reuse: the pid must still be the process we started."""
        if self.exited.is_set():
            return False
        try:
            return self.create_time is None or psutil.Process(self.pid).create_time() == self.create_time
        except psutil.Error:
            return False

    def signal_group(self, sig: int) -> bool:
        """Send `sig` to the worker's process group (its pgid is its recorded pid)."""
        if self.pid <= 1 or not self._same_process():  # killpg(0) would be our own group; 1 every process
            return False
        try:
            os.killpg(self.pid, sig)
            return True
        except ProcessLookupError:
            pass
        # No such group yet: a worker forked a moment ago has not reached its setsid(), so it is
        # still alone in the template's group and has started nothing. Signal the process itself.
        try:
            os.kill(self.pid, sig)
            return True
        except ProcessLookupError:
            return False

    def kill(self, by: str) -> bool:
        if self.killed_by is None:
            self.killed_by = by
        return self.signal_group(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> bool:
        return self.exited.wait(timeout)


class PoolStopped(Exception):
    """The pool was stopped (the campaign is being interrupted): it starts no more workers."""


class TemplateFailed(RuntimeError):
    """The warm worker template is gone (it could not import the runtime or the target, or died):
    no worker can be started, and the campaign cannot go on."""


MessageHandler = Callable[[WorkerProcess, dict[str, Any]], None]
LogHandler = Callable[[WorkerProcess, bytes], None]


def become_subreaper() -> bool:
    """Make this process adopt orphaned descendants (Linux), so it can reap fork-server workers
    (and must reap the orphans they leave: see `reap_orphans`)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


class ForkServer:
    """The supervisor's handle on a warm `python -m worker.forkserver` template."""

    def __init__(self, python: str, env: dict[str, str] | None = None, preload: Sequence[str] = ()) -> None:
        """`preload`: what the template imports before its first fork (`MODULE` or `MODULE:FUNCTION`)."""
        ours, theirs = socket.socketpair()
        argv = [python, "-m", "worker.forkserver", str(theirs.fileno())]
        for spec in preload:
            argv += ["--preload", spec]
        with starting_child():
            self.process = subprocess.Popen(argv,
                                            pass_fds=[theirs.fileno()], start_new_session=True,
                                            stdin=subprocess.DEVNULL, env=child_env(env), cwd=REPO_ROOT)
            claim_child(self.process.pid)
        theirs.close()
        self.sock = ours
        self.lock = threading.Lock()

    def fork(self, argv: list[str], control_fd: int, stderr_fd: int, cwd: Path) -> int:
        with self.lock:
            try:
                send_with_fds(self.sock, {"argv": argv, "cwd": str(cwd)}, [control_fd, stderr_fd])
                reply = Channel(self.sock).recv()
            except (ChannelClosed, OSError) as exc:
                try:
                    status: int | None = self.process.wait(timeout=5)  # it is going, or gone: say how
                except subprocess.TimeoutExpired:
                    status = None
                raise TemplateFailed(
                    "the worker template " + (f"exited with status {status}" if status is not None else
                                              f"stopped answering ({exc})")
                    + ": it could not import the runtime or the target (its own error is on stderr above)") from None
        if "pid" not in reply:
            raise OSError(f"the worker template failed: {reply.get('error')}")
        pid = reply["pid"]
        if type(pid) is not int or pid <= 1:  # never a pid to signal: 0 is our own group, 1 is init
            raise OSError(f"the worker template replied with pid {pid!r}, not a worker's")
        return pid

    def close(self) -> None:
        self.sock.close()  # the template exits when its socket closes
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        release_child(self.process.pid)


class Pool:
    """Starts workers (fresh interpreters, or forks of a warm template) and keeps one reaper per child."""

    def __init__(self, python: str = sys.executable, *, forkserver: bool = False,
                 env: dict[str, str] | None = None, preload: Sequence[str] = (), cwd: Path | None = None) -> None:
        """`env`: set in every worker's environment (and the template's), on top of this process's;
        `preload`: what the fork-server template imports before its first fork (ForkServer);
        `cwd`: where workers run unless `spawn` says otherwise (by default where this process was
        started: a user's tool that writes a relative path writes there, never into this project)."""
        self.python = python
        self.cwd = Path(cwd) if cwd is not None else Path.cwd()
        self.env = dict(env or {})
        self._live: dict[int, WorkerProcess] = {}
        self._lock = threading.Lock()
        self._stopped = False
        self._forkserver: ForkServer | None = None
        if forkserver:
            if not become_subreaper():
                raise OSError("the fork server needs PR_SET_CHILD_SUBREAPER (Linux)")
            self._forkserver = ForkServer(python, self.env, preload)

    def _launch(self, argv: list[str], control_fd: int, cwd: Path) -> tuple[int, Any, Callable[[], int]]:
        """Start one worker in `cwd`; returns (pid, its stderr as a binary file, a blocking wait for its status)."""
        if self._forkserver is not None:
            read_end, write_end = os.pipe()
            try:
                pid = self._forkserver.fork(argv, control_fd, write_end, cwd)
            except BaseException:
                os.close(read_end)
                raise
            finally:
                os.close(write_end)
            return pid, os.fdopen(read_end, "rb"), lambda: os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        popen = subprocess.Popen([self.python, "-m", "worker", *argv, "--control", str(control_fd)],
                                 pass_fds=[control_fd], start_new_session=True, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=child_env(self.env),
                                 cwd=cwd)
        return popen.pid, popen.stderr, popen.wait

    def spawn(self, args: list[str], *, incarnation: int, on_message: MessageHandler,
              on_log: LogHandler | None = None, on_exit: Callable[[WorkerProcess], None] | None = None,
              label: str | None = None, cwd: Path | None = None) -> WorkerProcess:
        """Start one worker, in `cwd` (else the pool's directory)."""
        if self._stopped:
            raise PoolStopped("the pool is stopped: no more workers")
        ours, theirs = socket.socketpair()
        try:
            with starting_child():
                pid, stderr, wait = self._launch([*args, "--incarnation", str(incarnation)], theirs.fileno(),
                                                 cwd or self.cwd)
                if pid <= 1:  # no launcher hands out such a pid (see ForkServer.fork); never signal one
                    stderr.close()
                    raise OSError(f"refusing worker pid {pid}: not a process of its own")
                claim_child(pid)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        try:
            create_time: float | None = psutil.Process(pid).create_time()
        except psutil.Error:
            create_time = None  # already gone; the reaper will say how it ended
        proc = WorkerProcess(incarnation, Channel(ours), pid, create_time, label=label)
        with self._lock:
            self._live[proc.pid] = proc
            stopped = self._stopped  # a stop that came while this one started: it dies below

        def read_channel() -> None:
            try:
                while True:
                    on_message(proc, proc.channel.recv())
            except ChannelClosed:
                pass

        def read_logs() -> None:
            for line in stderr:
                if on_log is not None:
                    on_log(proc, line)
            stderr.close()

        readers = [threading.Thread(target=read_channel, daemon=True, name=f"chan-{proc.pid}"),
                   threading.Thread(target=read_logs, daemon=True, name=f"log-{proc.pid}")]

        def reap() -> None:
            proc.returncode = wait()  # the one and only wait on this child
            release_child(proc.pid)
            for reader in readers:
                reader.join(timeout=5)
            proc.channel.close()
            with self._lock:
                self._live.pop(proc.pid, None)
            proc.exited.set()
            if on_exit is not None:
                on_exit(proc)

        for thread in readers:
            thread.start()
        threading.Thread(target=reap, daemon=True, name=f"reap-{proc.pid}").start()
        if stopped:
            proc.kill("stop")
            raise PoolStopped("the pool was stopped while this worker started; it was killed")
        return proc

    @property
    def template(self) -> subprocess.Popen[bytes] | None:
        """The warm template's process, when this pool forks its workers from one."""
        return self._forkserver.process if self._forkserver is not None else None

    def live(self) -> list[WorkerProcess]:
        with self._lock:
            return list(self._live.values())

    def stop(self, by: str = "stop") -> int:
        """Start no more workers (`spawn` raises PoolStopped) and SIGKILL every live one by its
        recorded pid, without waiting: their reapers reap them. Returns how many were signalled."""
        with self._lock:
            self._stopped = True
            live = list(self._live.values())
        return sum(proc.kill(by) for proc in live)

    def kill_now(self, by: str = "exit") -> None:
        """SIGKILL every live worker by its recorded pid, taking no lock and waiting for nothing:
        for a process about to exit at once (a signal handler may run while a lock is held)."""
        self._stopped = True
        for proc in list(self._live.values()):
            proc.kill(by)

    def kill_all(self, by: str = "shutdown", timeout: float = 10.0) -> None:
        """SIGKILL every live worker by its recorded pid and wait for each reaper."""
        for proc in self.live():
            proc.kill(by)
        for proc in self.live():
            proc.wait(timeout)

    def close(self) -> None:
        self.kill_all()
        if self._forkserver is not None:
            self._forkserver.close()
            self._forkserver = None
