"""A throwaway PostgreSQL cluster for tests and CI: private, Unix socket only, gone when stopped.

``PgCluster().start()`` (or ``with PgCluster() as cluster:``) runs ``initdb`` in a new 0700
temporary directory and starts ``postgres`` on it, listening on a Unix socket in that directory
and on no TCP address (``listen_addresses=''``), with ``trust`` authentication: the directory's
mode is what keeps others out. It waits until the server accepts connections (polled, with a
deadline), and :meth:`PgCluster.dsn` names a database on it. :meth:`PgCluster.stop` stops the
server by its recorded pid and removes the directory; :meth:`PgCluster.restart` stops it (by
default as a crash would: immediate shutdown) and starts it again on the same data.

PostgreSQL refuses to run as root. When this process is root, ``initdb`` and ``postgres`` run
as the ``postgres`` system user (Debian's packages create it), the directory is handed to that
user, and the cluster's superuser role is ``postgres``; otherwise they run as this user, whose
name is the role. The server is the leader of its own process session, so stopping it signals
exactly its process group: the postmaster and its backends, nothing else.

Stopping sends SIGINT, PostgreSQL's *fast* shutdown (it ends open sessions and writes a
checkpoint), not SIGTERM: SIGTERM is its *smart* shutdown, which waits for every client to
disconnect, so a test that leaked a connection would hold the stop for the whole wait. Then
SIGQUIT (immediate shutdown) and finally SIGKILL of the group, each after a bounded wait.

Only the standard library: the binaries are Debian's (``apt-get install postgresql``).
"""
from __future__ import annotations

import atexit
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
from pathlib import Path
from types import TracebackType

INSTALL_HINT = ("install Debian's PostgreSQL server (apt-get install postgresql), or put the directory "
                "holding its initdb and postgres on PATH (or in HERMES_PG_BINDIR)")
_SYSTEM_USER = "postgres"
_START_DEADLINE_S = 60.0
_STOP_WAIT_S = (30.0, 10.0, 10.0)  # after SIGINT, after SIGQUIT, after SIGKILL


class PgClusterError(RuntimeError):
    """The cluster could not be made, started or stopped; the message says why and what to do."""


class PgBinariesMissing(PgClusterError):
    """No PostgreSQL server binaries (initdb, postgres) were found on this machine."""


def _has_server(bindir: Path) -> bool:
    return all(os.access(bindir / name, os.X_OK) for name in ("initdb", "postgres", "pg_isready"))


def find_bindir() -> Path:
    """The directory of PostgreSQL's server binaries: $HERMES_PG_BINDIR, ``pg_config --bindir``,
    the newest /usr/lib/postgresql/N/bin, or the directory of ``initdb`` on PATH."""
    candidates: list[Path] = []
    if os.environ.get("HERMES_PG_BINDIR"):
        candidates.append(Path(os.environ["HERMES_PG_BINDIR"]))
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            out = None
        if out is not None and out.returncode == 0 and out.stdout.strip():
            candidates.append(Path(out.stdout.strip()))
    versions = Path("/usr/lib/postgresql")
    if versions.is_dir():
        numbered = [p for p in versions.iterdir() if p.name.isdigit()]
        candidates.extend(p / "bin" for p in sorted(numbered, key=lambda p: int(p.name), reverse=True))
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(os.path.realpath(initdb)).parent)
    for bindir in candidates:
        if _has_server(bindir):
            return bindir
    looked = ", ".join(str(c) for c in candidates) or "nowhere (no pg_config, /usr/lib/postgresql or initdb on PATH)"
    raise PgBinariesMissing(f"PostgreSQL server binaries (initdb, postgres, pg_isready) not found; looked in "
                            f"{looked}: {INSTALL_HINT}")


def _world_traversable(path: Path) -> bool:
    """Whether a user other than the owner can reach entries under `path` (every ancestor o+x)."""
    for part in [path, *path.parents]:
        try:
            if not os.stat(part).st_mode & 0o001:
                return False
        except OSError:
            return False
    return True


class PgCluster:
    """One private PostgreSQL server; see the module's documentation.

    `fsync`: the server's ``fsync`` setting. On by default (a store's durability settings then
    mean what they say); a test suite that never cuts power may turn it off for speed.
    """

    def __init__(self, *, bindir: Path | str | None = None, fsync: bool = True,
                 settings: dict[str, str] | None = None) -> None:
        self.bindir = Path(bindir) if bindir is not None else find_bindir()
        if not _has_server(self.bindir):
            raise PgBinariesMissing(f"{self.bindir} has no initdb, postgres and pg_isready: {INSTALL_HINT}")
        self.fsync = fsync
        self.settings = dict(settings or {})
        self.root: Path | None = None          # the 0700 directory: data/, the socket, the log
        self.proc: subprocess.Popen[bytes] | None = None
        self.pid: int | None = None            # the postmaster's pid, leader of its own process group
        self.port = 5432                       # names the socket file only: no TCP listener
        self._run_as: pwd.struct_passwd | None = None
        self.user = ""

    # ------------------------------------------------------------------ start
    def start(self) -> "PgCluster":
        if self.proc is not None:
            raise PgClusterError("this cluster is already started")
        if os.geteuid() == 0:
            try:
                self._run_as = pwd.getpwnam(_SYSTEM_USER)
            except KeyError:
                raise PgClusterError(f"running as root, and PostgreSQL refuses to run as root: it needs the "
                                     f"{_SYSTEM_USER!r} system user, which does not exist; {INSTALL_HINT}") from None
            self.user = _SYSTEM_USER
        else:
            self.user = pwd.getpwuid(os.geteuid()).pw_name
        parent = tempfile.gettempdir()
        if self._run_as is not None and not _world_traversable(Path(parent)):
            parent = "/tmp"  # the postgres user must reach the directory (pytest's own temp dirs are 0700)
        self.root = Path(tempfile.mkdtemp(prefix="hermes-pg-", dir=parent))  # 0700
        try:
            if self._run_as is not None:
                os.chown(self.root, self._run_as.pw_uid, self._run_as.pw_gid)
            self._initdb()
            self._launch()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        atexit.register(self.stop)  # a run that never reaches its fixture's teardown still stops it
        return self

    def _popen_kwargs(self) -> dict[str, object]:
        if self._run_as is None:
            return {}
        return {"user": self._run_as.pw_uid, "group": self._run_as.pw_gid, "extra_groups": [],
                "env": {**os.environ, "HOME": self._run_as.pw_dir, "USER": _SYSTEM_USER, "LOGNAME": _SYSTEM_USER}}

    def _initdb(self) -> None:
        assert self.root is not None
        cmd = [str(self.bindir / "initdb"), "-D", str(self.datadir), "-U", self.user, "-A", "trust",
               "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"]
        try:
            done = subprocess.run(cmd, cwd=self.root, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  errors="replace", timeout=120, check=False, **self._popen_kwargs())  # type: ignore[call-overload]
        except subprocess.TimeoutExpired as exc:
            raise PgClusterError(f"initdb did not finish within {exc.timeout} s") from None
        if done.returncode != 0:
            raise PgClusterError(f"initdb failed (exit {done.returncode}): {(done.stderr or done.stdout).strip()[-2000:]}")

    def _launch(self) -> None:
        assert self.root is not None
        options = {
            "listen_addresses": "",
            "unix_socket_directories": str(self.root),
            "port": str(self.port),
            "fsync": "on" if self.fsync else "off",
            "max_connections": "100",
            "shared_buffers": "32MB",
            **self.settings,
        }
        cmd = [str(self.bindir / "postgres"), "-D", str(self.datadir)]
        for name, value in options.items():
            cmd += ["-c", f"{name}={value}"]
        log = open(self.logfile, "ab")  # noqa: SIM115 - handed to the child, closed right after
        try:
            if self._run_as is not None:
                os.chown(self.logfile, self._run_as.pw_uid, self._run_as.pw_gid)
            self.proc = subprocess.Popen(cmd, cwd=self.root, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         start_new_session=True, **self._popen_kwargs())  # type: ignore[call-overload]
        finally:
            log.close()
        self.pid = self.proc.pid

    def _wait_ready(self) -> None:
        """Poll pg_isready until the server accepts connections, the server exits, or the deadline."""
        assert self.proc is not None
        deadline = time.monotonic() + _START_DEADLINE_S
        while True:
            if self.proc.poll() is not None:
                raise PgClusterError(f"postgres exited with status {self.proc.returncode} while starting: "
                                     f"{self.log_tail()}")
            ready = subprocess.run([str(self.bindir / "pg_isready"), "-q", "-h", str(self.root), "-p", str(self.port),
                                    "-U", self.user, "-d", "postgres", "-t", "5"],
                                   stdin=subprocess.DEVNULL, capture_output=True, check=False, timeout=30)
            if ready.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise PgClusterError(f"postgres did not accept connections within {_START_DEADLINE_S:.0f} s: "
                                     f"{self.log_tail()}")
            try:  # a bounded pause between polls that also notices the server dying
                self.proc.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                pass

    # ------------------------------------------------------------------ restart
    def restart(self, mode: str = "immediate") -> None:
        """Stop the server and start it again on the same data directory, as ``pg_ctl restart -m MODE``.

        "immediate" (the default): SIGQUIT, PostgreSQL's immediate shutdown: every backend quits at
        once, no checkpoint is written, and the next start replays the WAL, as after a crash of the
        server (what a client sees is its connection gone mid-session). "fast": SIGINT, open
        sessions are ended and a checkpoint is written first. Returns once the new server accepts
        connections; a server that does not stop in time is killed with its process group.
        """
        signals = {"immediate": signal.SIGQUIT, "fast": signal.SIGINT}
        if mode not in signals:
            raise ValueError(f"a restart is immediate or fast, not {mode!r}")
        proc = self.proc
        if proc is None or self.root is None:
            raise PgClusterError("the cluster is not started")
        try:
            proc.send_signal(signals[mode])
            proc.wait(timeout=_STOP_WAIT_S[1])
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # unreaped: the group is still the postmaster's own
            proc.wait(timeout=_STOP_WAIT_S[2])
        self.proc = None
        try:
            self._launch()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    # ------------------------------------------------------------------ facts
    @property
    def datadir(self) -> Path:
        assert self.root is not None
        return self.root / "data"

    @property
    def logfile(self) -> Path:
        assert self.root is not None
        return self.root / "postgres.log"

    @property
    def socket_dir(self) -> Path:
        assert self.root is not None
        return self.root

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def dsn(self, dbname: str = "postgres") -> str:
        """A libpq URL for `dbname` on this cluster, through its Unix socket as its superuser."""
        if self.root is None:
            raise PgClusterError("the cluster is not started")
        query = urllib.parse.urlencode({"host": str(self.root), "port": str(self.port), "user": self.user})
        return f"postgresql:///{urllib.parse.quote(dbname, safe='')}?{query}"

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.logfile.read_text(errors="replace")[-chars:].strip() or "(empty server log)"
        except (OSError, AssertionError):
            return "(no server log)"

    # ------------------------------------------------------------------ stop
    def stop(self) -> None:
        """Stop the server (fast, then immediate, then SIGKILL of its process group) and remove the
        directory. Safe to call more than once, and on a cluster that never fully started."""
        atexit.unregister(self.stop)
        proc, self.proc = self.proc, None
        if proc is not None:
            for sig, wait in zip((signal.SIGINT, signal.SIGQUIT, signal.SIGKILL), _STOP_WAIT_S):
                if proc.poll() is not None:
                    break
                try:
                    if sig == signal.SIGKILL:
                        # The postmaster's own group (start_new_session): it and its backends. Only
                        # while it is unreaped, so the id cannot have been given to anything else.
                        os.killpg(proc.pid, sig)
                    else:
                        proc.send_signal(sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=wait)
                except subprocess.TimeoutExpired:
                    continue
            if proc.poll() is None:
                raise PgClusterError(f"postgres (pid {proc.pid}) outlived SIGKILL; its directory {self.root} is kept")
        root, self.root = self.root, None
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)

    def __enter__(self) -> "PgCluster":
        return self.start() if self.proc is None else self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
