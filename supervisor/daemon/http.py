"""The daemon's HTTP API (`serve --http HOST:PORT`): a starlette app served by uvicorn in a
thread of the daemon process.

    POST /v1/sessions/{session}/turns   {"message": ..., "turn_id"?: ...}  -> 202 {"turn_id", ...}
    GET  /v1/sessions/{session}/turns   -> {"session", "turns": [{"turn_id", "seq", "state", "created_at",
                                            "started_at", "ended_at", "attempts", "error"}], "next"}
                                           in submission order, at most ?limit=N (1..1000, default 1000)
                                           after ?after=SEQ; "next" is the SEQ to ask after for more (or null);
                                           404 for a session that has no turn
    GET  /v1/turns/{turn_id}            -> {"turn_id", "session", "state", "answer", "error"}
    POST /v1/turns/{turn_id}/cancel     -> 202 (cancelling), 404 (unknown), 409 (already ended)
    GET  /v1/sessions/{session}/events  -> text/event-stream from `Last-Event-ID` (or ?after=N)
    GET  /metrics                       -> Prometheus text format
    GET  /healthz                       -> liveness, the one request without a token

Every other request carries ``Authorization: Bearer <token>``, the token kept in
``<db>.token`` (created 0600 at the first start with HTTP, reused after). The token is checked
in front of the router, for every path but `OPEN_PATHS` (a route added later is guarded
without asking). Reads go through read-only connections of a small pool of reader threads
(`DB_READERS`), never on the event loop; a turn lookup reads that turn's rows only. Writes
take the daemon's own paths: a turn is queued by `inbox.submit` (the `submit` command's
transaction), a cancel is carried out by the daemon's loop (`Daemon.request_cancel`). The
event stream is `supervisor.daemon.events`: only what is durable, woken by
`supervisor.daemon.watch` (looked at every `POLL_SECONDS`).

The store is a SQLite file or a PostgreSQL database (`daemon.store`, a path or a
``postgresql://`` URL); what differs between them is `supervisor.daemon.reads`. On PostgreSQL a
read that fails is answered 503 (and an event stream ends: its client resumes with
`Last-Event-ID`), and a connection the failure broke (the server restarted) is dropped: the next
read connects again. The daemon's own files (the token) are named after `daemon.db_path` on either.

Hostile clients cost bounded resources:

* a connection that sends nothing is left to the kernel (`defer_accept`, about `HEAD_SECONDS`):
  it takes no descriptor of the daemon's until it sends something, and the listen queue is long
  (`LISTEN_BACKLOG`), so a burst of clients is never turned away by the kernel;
* a request's head must arrive within `HEAD_SECONDS` of its connection being accepted (at most
  `MAX_HEAD` bytes), its body within `BODY_SECONDS` after it (at most `MAX_BODY` bytes, JSON); an
  idle keep-alive connection is closed after `KEEPALIVE_IDLE_SECONDS`;
* connections are capped (`fd_limits`: from RLIMIT_NOFILE, keeping descriptors for the
  daemon's workers and databases). Past the cap the oldest connection that has not sent a
  whole request head is closed for the new one; when none can be, the new one is answered
  503 with Retry-After (and beyond `REJECT_SLACK` more, closed at once). Event streams are
  capped too (503 with Retry-After past it);
* an event stream reads about `STREAM_BATCH_BYTES` of rows at a time and waits for its client
  to take what it was sent (backpressure), so a client that never reads holds a bounded buffer
  (`StreamState.held` and the transport's buffer: about a poll's rows and a chunk);
* a malformed request is a 4xx; one answered before its body was read whole (too large, not JSON, no
  token) has its connection half-closed after the answer, the rest of its body discarded for at most
  `LINGER_SECONDS` (so the client reads the answer, then the end of the connection, at once);
  a client hanging up is not an error; errors the loop meets
  accepting connections (EMFILE) and the server's warnings are logged at a bounded rate;
* on shutdown the event streams end at once (a stream whose client does not read is cut).

uvicorn runs with its signal handling off, so SIGTERM stays the daemon's: the daemon stops
this server when its drain begins, and joins it on shutdown.
"""
from __future__ import annotations

import asyncio
import contextlib
import errno
import hmac
import importlib
import ipaddress
import json
import logging
import os
import re
import secrets
import socket
import sqlite3
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable

from hermes.ids import validate_session_id
from hermes.private_files import replace_file_durably
from hermes.state import StorageError
from hermes.store.engines import is_postgres_url
from hermes.transcript import is_final_answer
from supervisor.daemon import inbox
from supervisor.daemon.events import SessionFeed
from supervisor.daemon.log import info, log, warn
from supervisor.daemon.metrics import HttpGauges
from supervisor.daemon.reads import dialect_of, read_store, sql
from supervisor.daemon.watch import SAME, Changes, ChangeWatcher

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from supervisor.daemon.service import Daemon

MODULES = ("starlette", "uvicorn", "prometheus_client")
INSTALL_HINT = "pip install '.[http]'"
POLL_SECONDS = 0.02          # how often the watcher looks for changes (supervisor.daemon.watch)
WATCH_RETRY_SECONDS = 1.0    # the most a watcher that keeps failing waits before it tries again
KEEPALIVE_SECONDS = 15.0     # a comment line on an idle event stream
MAX_BODY = 1 << 20           # bytes of a request body
CANCEL_TIMEOUT = 30.0        # seconds the daemon's loop has to take a cancel request
OPEN_PATHS = frozenset({"/healthz"})  # the only paths served without the token
HEAD_SECONDS = 10.0          # a request's line and headers must arrive within this (else 408 / closed)
BODY_SECONDS = 30.0          # and its body within this after its head (else closed)
KEEPALIVE_IDLE_SECONDS = 5   # an idle keep-alive connection is closed after this (uvicorn's timeout_keep_alive)
MAX_HEAD = 16 * 1024         # bytes of a request's line and headers (h11's max_incomplete_event_size)
RESERVED_FDS = 128           # descriptors kept for the daemon itself: databases, logs, status files, pipes
FDS_PER_WORKER = 16          # and per worker (its pipes, its pid fd, the files it is started with)
MAX_CONNECTIONS = 4096       # the connection cap, whatever RLIMIT_NOFILE would allow
MAX_STREAMS = 64             # event streams at once (each holds up to about STREAM_BATCH_BYTES + 2 rows)
REJECT_SLACK = 32            # connections past the cap answered 503; past this many more, closed at once
ACCEPT_BURST = 64            # connections accepted in one go: each takes a descriptor before it is admitted
LISTEN_BACKLOG = 4096        # connections the kernel holds until they are accepted (at no descriptor of ours)
REJECT_SECONDS = 2.0         # a connection past the cap that sends no request is closed after this
RETRY_AFTER = 2              # seconds, in the Retry-After of a 503
STREAM_BATCH_BYTES = 256 * 1024  # content read per poll of an event stream (at least two rows)
STREAM_CHUNK = 64 * 1024     # an event stream writes at most about this much before waiting for its client
LINGER_SECONDS = 2.0         # a request answered before its body was read: the rest of it is discarded this long
STOP_GRACE = 0.3             # seconds the requests still open at shutdown have before they are cut
DB_READERS = 2               # reader threads (each with its read-only connection)
SUBMIT_WRITERS = 2           # connections submissions share (a burst waits for one: no connection each)
LOG_EVERY = 10.0             # seconds between two log lines of one kind of refused connection or error
TURN_LIST_LIMIT = 1000       # turns per GET /v1/sessions/{session}/turns
_DIGITS = re.compile(r"[0-9]{1,18}")
_TURN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
_TOKEN = re.compile(r"[A-Za-z0-9_-]{32,256}")


# ------------------------------------------------------------------ setup
def missing_dependencies() -> list[str]:
    """The modules the HTTP API needs that cannot be imported (empty when it can run)."""
    missing = []
    for name in MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def parse_listen(value: str, allow_remote: bool = False) -> tuple[str, int]:
    """`HOST:PORT` (`[V6]:PORT`; a bare `PORT` or `:PORT` means 127.0.0.1) -> (host, port).

    ValueError unless the host is a loopback address (or `localhost`), or `allow_remote`.
    """
    text = str(value).strip()
    if text.isdigit():
        host, port_text = "", text
    elif text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if not rest.startswith(":"):
            raise ValueError(f"{value!r}: write an IPv6 address as [ADDRESS]:PORT")
        port_text = rest[1:]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ValueError(f"{value!r} is not HOST:PORT (e.g. 127.0.0.1:8080, or 127.0.0.1:0 for any free port)")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"{value!r}: the port must be a number from 0 to 65535 (0: any free port)")
    host = host or "127.0.0.1"
    if host == "localhost":
        host = "127.0.0.1"
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False  # a host name: whatever it resolves to, it is not known to be loopback
    if not loopback and not allow_remote:
        raise ValueError(f"{host} is not a loopback address; the API would be reachable from the network "
                         "(plain HTTP, guarded by its token alone). Add --http-allow-remote to mean it")
    return host, int(port_text)


def defer_accept(sock: socket.socket, seconds: float) -> bool:
    """Have the kernel hold a new connection until its first bytes arrive, for up to about `seconds`
    (Linux's TCP_DEFER_ACCEPT; elsewhere nothing, and False). A client that connects and sends
    nothing then costs the daemon no descriptor, no timer and no eviction, however many it opens
    and however fast it reconnects; past `seconds` it is accepted and timed like any other."""
    option = getattr(socket, "TCP_DEFER_ACCEPT", None)
    if option is None or seconds <= 0:
        return False
    sock.setsockopt(socket.IPPROTO_TCP, option, max(1, round(seconds)))
    return True


def token_path(db_path: Path) -> Path:
    return Path(f"{db_path}.token")


def load_token(db_path: Path) -> str:
    """The API token of `db_path`'s daemon: read from `<db>.token`, or made (0600, fsynced) if absent or unusable."""
    path = token_path(db_path)
    try:
        st = os.stat(path)
        text = path.read_text(encoding="ascii", errors="replace").strip()
    except FileNotFoundError:
        text, st = "", None
    if st is not None and _TOKEN.fullmatch(text):
        if st.st_mode & 0o077:
            os.chmod(path, 0o600)
            warn("the API token file was readable by others; narrowed to 0600", path=str(path))
        return text
    token = secrets.token_urlsafe(32)
    replace_file_durably(path, token + "\n")  # clients keep it: a power cut must not change it under them
    info("created the HTTP API token", path=str(path))
    return token


def check_session(value: str) -> str:
    """The session id rule of `hermes.ids`; ApiError 400 otherwise."""
    try:
        return validate_session_id(value)
    except ValueError as exc:
        raise ApiError(400, str(exc)) from None


def check_turn_id(value: Any) -> str:
    if not isinstance(value, str) or not _TURN_ID.fullmatch(value):
        raise ApiError(400, f"turn id {str(value)[:40]!r} is not valid: use 1 to 128 ASCII letters, digits, "
                            "'.', '_', ':' and '-', starting with a letter or a digit")
    return value


class HttpStartError(Exception):
    """The HTTP API could not be started (e.g. its port is taken); the daemon does not serve."""


class ApiError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


def fd_limits(soft_nofile: int, workers: int) -> tuple[int, int]:
    """(connection cap, event stream cap) for a process allowed `soft_nofile` descriptors with
    `workers` workers: what is left once the daemon's own and its workers' are set aside, and the
    connections past the cap that are answered 503 before being closed."""
    budget = soft_nofile - RESERVED_FDS - FDS_PER_WORKER * max(1, workers) - REJECT_SLACK - ACCEPT_BURST
    connections = max(8, min(MAX_CONNECTIONS, budget))
    return connections, max(2, min(MAX_STREAMS, connections // 4))


def nofile_limit() -> int:
    """This process's soft RLIMIT_NOFILE (a large stand-in where there is none)."""
    try:
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return 1 << 16
    return soft if soft != getattr(resource, "RLIM_INFINITY", -1) and soft > 0 else 1 << 16


def raise_nofile(workers: int) -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE to what the caps can use with `workers` workers, as far
    as the hard limit allows (a default service gets 1,024 soft, kept low for select(2), which the
    daemon does not use; the hard limit is the one an administrator set). Never lowers it.
    Returns (soft limit before, soft limit now)."""
    before = nofile_limit()
    wanted = MAX_CONNECTIONS + REJECT_SLACK + ACCEPT_BURST + RESERVED_FDS + FDS_PER_WORKER * max(1, workers)
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, OSError, ValueError):
        pass
    return before, nofile_limit()


class RateLog:
    """One warning line per kind at most every `every` seconds, saying how many were not logged
    since: a client (or a descriptor shortage) that makes the same error a thousand times a second
    makes one line, not a thousand tracebacks."""

    def __init__(self, every: float = LOG_EVERY, clock: Callable[[], float] = time.monotonic,
                 emit: Callable[..., None] | None = None) -> None:
        self.every = every
        self.clock = clock
        self.emit = emit or warn
        self.last: dict[str, float] = {}
        self.skipped: dict[str, int] = {}
        self.counts: dict[str, int] = {}

    def note(self, kind: str, message: str, **fields: Any) -> bool:
        """Count one `kind`; log it unless one was logged less than `every` ago. True when logged."""
        self.counts[kind] = self.counts.get(kind, 0) + 1
        now = self.clock()
        last = self.last.get(kind)
        if last is not None and now - last < self.every:
            self.skipped[kind] = self.skipped.get(kind, 0) + 1
            return False
        self.last[kind] = now
        skipped = self.skipped.pop(kind, 0)
        if skipped:
            fields["not_logged_since"] = skipped
        self.emit(message, **fields)
        return True


class _RateFilter(logging.Filter):
    """uvicorn's warnings ("Invalid HTTP request received.", ...) through a RateLog, by message."""

    def __init__(self, rate: RateLog) -> None:
        super().__init__()
        self.rate = rate

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and record.exc_info:
            return True  # an error in the app itself: a bug to see in full
        kind = f"uvicorn:{record.getMessage()[:80]}"
        self.rate.counts[kind] = self.rate.counts.get(kind, 0) + 1
        now = self.rate.clock()
        last = self.rate.last.get(kind)
        if last is not None and now - last < self.rate.every:
            return False
        self.rate.last[kind] = now
        return True


class StreamState:
    """What one event stream holds (the server's loop only): `held`, the characters of the events it
    read from the database and has not yet handed to the transport; `waiting`, whether it waits on
    uvicorn to take a chunk (which waits for the client while the transport's buffer is full);
    `sent`, the characters handed over so far."""

    __slots__ = ("feed", "held", "waiting", "sent")

    def __init__(self, feed: SessionFeed) -> None:
        self.feed = feed
        self.held = 0
        self.waiting = False
        self.sent = 0


# --------------------------------------------------------------- the server
class HttpApi:
    """The app, the uvicorn server and its thread, for one daemon."""

    def __init__(self, daemon: Daemon, host: str, port: int) -> None:
        self.daemon = daemon
        self.db_path = Path(daemon.db_path)
        self.host, self.port = host, port
        self.token = ""
        self.url = ""
        self.server: Any = None
        self.thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.ready = threading.Event()
        self.failed: BaseException | None = None
        self.stopping = False
        self.streams = 0
        self.stream_states: set[StreamState] = set()  # the open event streams (the server's loop only)
        self.changes: Changes | None = None
        store = getattr(daemon, "store", None)
        # Where the sessions are: a PostgreSQL URL, or else the SQLite file that `db_path` is.
        self.store: Path | str = str(store) if store is not None and is_postgres_url(store) else self.db_path
        self.reads = read_store(self.store)
        self.submitter = inbox.Submitter(self.store, SUBMIT_WRITERS)  # closed with the app (`_lifespan`)
        self.watcher: ChangeWatcher | None = None     # which sessions changed (its own thread)
        self.registry: Any = None
        self.gauges = HttpGauges()  # the HTTP API's state at the last scrape of /metrics
        workers = getattr(getattr(daemon, "config", None), "workers", 4)
        self.max_connections, self.max_streams = fd_limits(nofile_limit(), int(workers or 1))
        self.head_seconds, self.body_seconds, self.reject_seconds = HEAD_SECONDS, BODY_SECONDS, REJECT_SECONDS
        self.defer_seconds = HEAD_SECONDS  # a connection is accepted once it sent something (0: at once)
        self.protocols: set[Any] = set()                          # open connections (the server's loop only)
        self.heads: OrderedDict[Any, None] = OrderedDict()        # those waiting for a request head, oldest first
        self.rate = RateLog()
        self.watch_log = RateLog()  # the watcher's failures (not a limit: not in `rate`'s counts, which /metrics shows)
        self.readers: ThreadPoolExecutor | None = None            # database reads, off the event loop
        self.watching: ThreadPoolExecutor | None = None           # the watcher's reads
        self._local = threading.local()
        self._reader_conns: list[Any] = []
        self._reader_lock = threading.Lock()

    # ------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 30.0) -> str:
        """Bind, start serving in a thread; returns the URL once the app is up (the socket listens already)."""
        import uvicorn

        self.token = load_token(self.db_path)
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.create_server((self.host, self.port), family=family, backlog=LISTEN_BACKLOG)
        defer_accept(sock, self.defer_seconds)
        bound = sock.getsockname()
        self.url = f"http://{'[' + self.host + ']' if family == socket.AF_INET6 else self.host}:{bound[1]}"
        config = uvicorn.Config(self.app(), lifespan="on", log_config=None, log_level="warning", access_log=False,
                                http=_protocol_class(self), ws="none", loop="asyncio", timeout_graceful_shutdown=5,
                                timeout_keep_alive=KEEPALIVE_IDLE_SECONDS, h11_max_incomplete_event_size=MAX_HEAD,
                                # asyncio accepts up to `backlog` connections per readiness event, each a
                                # descriptor taken before the cap can refuse it: a small burst, in the budget
                                backlog=ACCEPT_BURST,
                                # a backstop: connections never reach it (see `admit`); requests in flight may
                                limit_concurrency=self.max_connections + REJECT_SLACK + 1)
        self.server = _quiet_server(config)
        uvicorn_log = logging.getLogger("uvicorn")  # its warnings and errors go where the daemon's log goes
        uvicorn_log.handlers[:] = list(log.handlers)
        uvicorn_log.propagate = False
        errors = logging.getLogger("uvicorn.error")  # "Invalid HTTP request received." once per LOG_EVERY, not per request
        for old in [f for f in errors.filters if isinstance(f, _RateFilter)]:
            errors.removeFilter(old)
        errors.addFilter(_RateFilter(self.rate))
        self.thread = threading.Thread(target=self._run, args=(sock,), name="http-api", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.ready.wait(0.05):
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.begin_stop()
                sock.close()
                raise RuntimeError(f"the HTTP API did not start: {self.failed or 'timed out'}")
        return self.url

    def _run(self, sock: socket.socket) -> None:
        try:
            self.server.run(sockets=[sock])
        except BaseException as exc:  # noqa: BLE001  (reported through `failed`; the daemon goes on)
            self.failed = exc
            log.error("the HTTP API stopped: %s", exc)
        finally:
            sock.close()

    def begin_stop(self) -> None:
        """Stop accepting requests and end the event streams (from any thread; returns at once)."""
        self.stopping = True
        if self.server is not None:
            self.server.should_exit = True
        loop = self.loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(self._on_stop)

    def _on_stop(self) -> None:
        """(The loop.) Wake every stream (it ends), cut at once the connections that would hold the
        shutdown up (a stream whose client does not read, a request head or body still coming), and
        whatever is still open after STOP_GRACE."""
        if self.changes is not None:
            self.changes.bump()
        for proto in list(self.protocols):
            if proto.guard_phase is not None or proto.rejected or proto.lingering or proto.flow.write_paused:
                proto.transport.abort()
        asyncio.get_running_loop().call_later(STOP_GRACE, self._cut_all)

    def _cut_all(self) -> None:
        for proto in list(self.protocols):
            proto.transport.abort()

    def stop(self, timeout: float = 10.0) -> None:
        self.begin_stop()
        if self.thread is not None:
            self.thread.join(timeout)
            if self.thread.is_alive() and self.server is not None:
                self.server.force_exit = True
                self.thread.join(2.0)

    @contextlib.asynccontextmanager
    async def _lifespan(self, _app: Any) -> AsyncIterator[None]:
        from supervisor.daemon.metrics import build_registry

        self.loop = asyncio.get_running_loop()
        self.loop.set_exception_handler(self._loop_exception)
        self.changes = Changes()
        self.watcher = self.reads.watcher()
        self.readers = ThreadPoolExecutor(DB_READERS, thread_name_prefix="http-db")
        self.watching = ThreadPoolExecutor(1, thread_name_prefix="http-watch")
        self.registry = build_registry(self._turn_counts, self.daemon, lambda: self.gauges)
        watcher = asyncio.create_task(self._watch())
        self.ready.set()
        try:
            yield
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            self.watching.shutdown(wait=True)  # a read in flight ends before its connection closes
            self.readers.shutdown(wait=True, cancel_futures=True)
            self.watcher.close()
            self.submitter.close()
            with self._reader_lock:
                conns, self._reader_conns = self._reader_conns, []
            for conn in conns:
                conn.close()

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """Accept errors (EMFILE and the like: asyncio retries a second later) as one line per LOG_EVERY,
        not a traceback per try; anything else as asyncio would."""
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
            self.rate.note("accept", "the HTTP API could not accept a connection; it tries again in a second",
                           error=str(exc), connections=len(self.protocols))
            return
        loop.default_exception_handler(context)

    def admit(self, proto: Any) -> str:
        """(The loop.) A new connection: "ok", "reject" (answered 503) or "drop" (closed at once).

        Past the cap, the oldest connection that has not sent a whole request head makes room."""
        if len(self.protocols) <= self.max_connections:
            return "ok"
        while self.heads:
            victim, _ = self.heads.popitem(last=False)
            if victim is not proto and not victim.transport.is_closing():
                victim.set_phase(None)
                victim.transport.close()
                self.rate.note("evicted", "HTTP API at its connection cap: closed the oldest connection that had "
                               "sent no request", cap=self.max_connections)
                return "ok"
        if len(self.protocols) <= self.max_connections + REJECT_SLACK:
            self.rate.note("rejected", "HTTP API at its connection cap: answering 503", cap=self.max_connections)
            return "reject"
        self.rate.note("dropped", "HTTP API past its connection cap: closing new connections at once",
                       cap=self.max_connections)
        return "drop"

    async def _watch(self) -> None:
        """Wake the streams of the sessions that changed (`supervisor.daemon.watch`). The reads run
        in a thread of their own. A look that fails wakes every stream (each reads, and one whose
        read fails ends); the watcher then starts afresh, after a pause that grows while it fails
        (a PostgreSQL server that is restarting is not asked fifty times a second)."""
        assert self.watcher is not None and self.changes is not None
        watcher = self.watcher
        loop = asyncio.get_running_loop()
        pause = POLL_SECONDS
        while True:
            try:
                changed = await loop.run_in_executor(self.watching, watcher.look, self.changes.sessions())
                if changed is not SAME:
                    self.changes.bump(changed)
                pause = POLL_SECONDS
            except (sqlite3.Error, StorageError, *self.reads.errors) as exc:
                self.watch_log.note("watch", "the HTTP API could not look for changes; waking every stream",
                                    error=str(exc))
                await loop.run_in_executor(self.watching, watcher.reset)
                self.changes.bump()
                pause = min(max(pause, POLL_SECONDS) * 2, WATCH_RETRY_SECONDS)
            await asyncio.sleep(pause)

    def _reader_conn(self) -> Any:
        """(A reader thread.) Its read-only connection, opened at its first read (and again after one was lost)."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self.reads.connect()
            self._local.conn = conn
            with self._reader_lock:
                self._reader_conns.append(conn)
        return conn

    def _drop_reader_conn(self) -> None:
        """(A reader thread.) Forget its connection, which a failure broke: the next read connects again."""
        conn, self._local.conn = getattr(self._local, "conn", None), None
        if conn is not None:
            with self._reader_lock:
                self._reader_conns = [c for c in self._reader_conns if c is not conn]
            with contextlib.suppress(Exception):
                conn.close()

    def _in_reader(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """(A reader thread.) `fn(conn, *args)`; a driver error of PostgreSQL's as the StorageError to answer."""
        conn = None
        try:
            conn = self._reader_conn()
            return fn(conn, *args)
        except self.reads.errors as exc:  # () on SQLite: its errors are answered as they are
            error = self.reads.failure(exc, conn)
            if getattr(error, "lost", False):
                self._drop_reader_conn()
            raise error from exc

    async def _read(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(conn, *args)` in a reader thread, through that thread's read-only connection."""
        assert self.readers is not None
        return await asyncio.get_running_loop().run_in_executor(self.readers, self._in_reader, fn, args)

    def _turn_counts(self) -> dict[str, int]:
        """(A reader thread: the registry is collected in one, see `metrics`.)"""
        conn = self._reader_conn()
        return dict(dialect_of(conn).execute(conn, _TURN_COUNTS_SQL).fetchall())

    # ------------------------------------------------------------------ app
    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.middleware import Middleware
        from starlette.routing import Route

        routes = [
            Route("/healthz", self._handled(self.healthz), methods=["GET"]),
            Route("/metrics", self._handled(self.metrics), methods=["GET"]),
            Route("/v1/sessions/{session}/turns", self._handled(self.submit), methods=["POST"]),
            Route("/v1/sessions/{session}/turns", self._handled(self.session_turns), methods=["GET"]),
            Route("/v1/sessions/{session}/events", self._handled(self.events), methods=["GET"]),
            Route("/v1/turns/{turn_id}", self._handled(self.turn), methods=["GET"]),
            Route("/v1/turns/{turn_id}/cancel", self._handled(self.cancel), methods=["POST"]),
        ]
        # The token is checked in front of the router: every path (a route added later, an unknown
        # one) needs it but OPEN_PATHS.
        return Starlette(routes=routes, lifespan=self._lifespan, middleware=[Middleware(_Auth, api=self)])

    def _handled(self, handler: Callable[[Request], Awaitable[Any]]) -> Callable[[Request], Awaitable[Any]]:
        async def handled(request: Request) -> Any:
            from starlette.requests import ClientDisconnect
            from starlette.responses import Response

            try:
                return await handler(request)
            except ApiError as exc:
                headers = dict(exc.headers or {})
                if exc.status == 401:
                    headers["WWW-Authenticate"] = 'Bearer realm="hermes"'
                return _json({"error": exc.message}, exc.status, headers or None)
            except ClientDisconnect:  # the client hung up (or was cut at BODY_SECONDS): nobody to answer
                return Response(status_code=400)
            except (StorageError, sqlite3.Error, OSError) as exc:
                warn("HTTP API request failed", path=request.url.path, error=str(exc))
                return _json({"error": f"the database could not be read or written: {exc}"}, 503,
                             {"Retry-After": str(RETRY_AFTER)})
        return handled

    def refusal(self, authorization: str) -> str | None:
        """Why a request with this Authorization header is refused (None: it is not)."""
        scheme, _, given = authorization.partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            return "missing Authorization: Bearer <token> (the token is in the daemon's .token file)"
        if not hmac.compare_digest(given.strip().encode("utf-8", "replace"), self.token.encode("ascii")):
            return "wrong token"
        return None

    async def healthz(self, _request: Request) -> Response:
        return _json({"status": "ok"})

    async def metrics(self, _request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
        from starlette.responses import Response

        self.gauges = HttpGauges(  # taken here, on the loop that changes them; the registry is read in a thread
            connections=len(self.protocols), streams=self.streams,
            streams_waiting=sum(1 for state in self.stream_states if state.waiting),
            stream_held_bytes=sum(state.held for state in self.stream_states), limits=dict(self.rate.counts))
        text = await self._read(lambda _conn: generate_latest(self.registry))
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    async def submit(self, request: Request) -> Response:
        from starlette.concurrency import run_in_threadpool

        session = check_session(request.path_params["session"])
        body = await _read_json(request)
        message = body.get("message")
        if not isinstance(message, str) or not message.strip():
            raise ApiError(400, 'the body needs "message": a non-empty string')
        turn_id = body.get("turn_id")
        if turn_id is not None:
            check_turn_id(turn_id)
        try:
            turn_id, new = await run_in_threadpool(self.submitter.submit, session, message, turn_id)
        except ValueError as exc:  # the turn id was used by another submission
            raise ApiError(409, str(exc)) from None
        self.daemon.wake()
        return _json({"turn_id": turn_id, "session": session, "queued": new}, 202)

    async def session_turns(self, request: Request) -> Response:
        session = check_session(request.path_params["session"])
        after = _number(request, "after", 0)
        limit = _number(request, "limit", TURN_LIST_LIMIT)
        if not 1 <= limit <= TURN_LIST_LIMIT:
            raise ApiError(400, f"limit must be from 1 to {TURN_LIST_LIMIT}")
        found = await self._read(list_turns, session, after, limit)
        if found is None:
            raise ApiError(404, f"session {session!r} has no turn")
        turns, more = found
        return _json({"session": session, "turns": turns, "next": turns[-1]["seq"] if more else None})

    async def turn(self, request: Request) -> Response:
        turn_id = check_turn_id(request.path_params["turn_id"])
        view = await self._read(turn_view, turn_id)
        if view is None:
            raise ApiError(404, f"no turn {turn_id!r}")
        return _json(view)

    async def cancel(self, request: Request) -> Response:
        turn_id = check_turn_id(request.path_params["turn_id"])
        try:
            future = self.daemon.request_cancel(turn_id)
            result = await asyncio.wait_for(asyncio.wrap_future(future), CANCEL_TIMEOUT)
        except (TimeoutError, RuntimeError) as exc:
            raise ApiError(503, f"the daemon could not take the cancel now ({exc or 'timed out'}); try again",
                           {"Retry-After": str(RETRY_AFTER)}) from None
        if not result["found"]:
            raise ApiError(404, f"no turn {turn_id!r}")
        out = {"turn_id": turn_id, "session": result["session"], "state": result["state"], "error": result["error"]}
        if not result["cancelling"]:
            return _json({**out, "message": f"the turn already ended ({result['state']})"}, 409)
        return _json({**out, "cancelling": True}, 202)

    async def events(self, request: Request) -> Any:
        from starlette.responses import StreamingResponse

        session = check_session(request.path_params["session"])
        after = _after(request)
        retry = {"Retry-After": str(RETRY_AFTER)}
        if self.stopping:
            raise ApiError(503, "the daemon is stopping; resume the stream from the next one", retry)
        if self.streams >= self.max_streams:
            self.rate.note("streams", "HTTP API at its event stream cap: answering 503", cap=self.max_streams)
            raise ApiError(503, f"{self.max_streams} event streams are open, the most this daemon serves; "
                                "try again", retry)
        feed = SessionFeed(None, session, after, max_bytes=STREAM_BATCH_BYTES)
        state = StreamState(feed)
        response = StreamingResponse(self._stream(feed, state), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.streams += 1  # counted from here: starlette calls what is returned, at once
        self.stream_states.add(state)

        async def counted(scope: Any, receive: Any, send: Any) -> None:
            try:
                await response(scope, receive, send)
            finally:
                self.streams -= 1
                self.stream_states.discard(state)
        return counted

    async def _stream(self, feed: SessionFeed, state: StreamState | None = None) -> AsyncIterator[str]:
        """The stream's events, a chunk at a time. A `yield` hands a chunk to uvicorn, which writes
        it once the transport's buffer is below its high-water mark (it waits for the client to take
        the one before), so a client that does not read holds one poll's rows (`STREAM_BATCH_BYTES`,
        at least two rows: `state.held`) and about a chunk in the transport, never more."""
        assert self.changes is not None
        state = state if state is not None else StreamState(feed)
        yield ": stream of durable events\nretry: 1000\n\n"
        quiet_since = time.monotonic()
        while not self.stopping:
            # Taken before reading: a commit after the read wakes us. A stream holding a blank row
            # back waits on any change (the row may be filled in place, which adds no row).
            session_changed, any_change = self.changes.current(feed.session), self.changes.current(Changes.ANY)
            try:
                texts: list[str | None] = await self._read(_poll, feed)
            except (sqlite3.Error, StorageError) as exc:
                warn("an event stream could not read the database; closing it", session=feed.session,
                     error=str(exc))
                return
            if texts:
                state.held += sum(len(text) for text in texts if text is not None)
                if self.daemon.config.synchronous != "FULL":
                    # Below FULL a commit is visible before it is durable; what a client receives
                    # must never be taken back by a power cut, so the WAL holding it is made durable first.
                    try:
                        await self.reads.settle(self._read)
                    except (sqlite3.Error, StorageError, OSError) as exc:
                        warn("an event stream could not make what it read durable; closing it",
                             session=feed.session, error=str(exc))
                        return
                chunk: list[str] = []
                size = 0
                for index in range(len(texts)):
                    text, texts[index] = texts[index], None
                    chunk.append(text)  # type: ignore[arg-type]
                    size += len(text)  # type: ignore[arg-type]
                    if size >= STREAM_CHUNK or index == len(texts) - 1:
                        out, chunk = "".join(chunk), []
                        state.waiting = True
                        yield out
                        state.waiting = False
                        state.held -= size
                        state.sent += size
                        del out
                        size = 0
                quiet_since = time.monotonic()
                continue
            idle = time.monotonic() - quiet_since
            if idle >= KEEPALIVE_SECONDS:
                yield ": keep-alive\n\n"
                quiet_since = time.monotonic()
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for((any_change if feed.held else session_changed).wait(),
                                       KEEPALIVE_SECONDS - idle)


def _poll(conn: Any, feed: SessionFeed) -> list[str | None]:
    """(A reader thread.) The stream's next events as text: encoded here, not on the server's loop."""
    return [event.encode() for event in feed.poll(conn)]


_TURN_SQL = sql("SELECT id, session_id, state, error FROM turns WHERE id = ?")
_ANSWER_IDS_SQL = sql("SELECT id FROM messages WHERE session_id = ? AND turn_id = ? AND role = 'assistant' "
                      "ORDER BY id DESC")
_ANSWER_SQL = sql("SELECT content, content_kind, tool_calls, cloned_from FROM messages WHERE id = ?")
_TURN_LIST_SQL = sql("SELECT {seq}, id, state, created_at, started_at, ended_at, attempts, error FROM turns "
                     "WHERE session_id = ? AND {seq} > ? ORDER BY {seq} LIMIT ?")
_ANY_TURN_SQL = sql("SELECT 1 FROM turns WHERE session_id = ? LIMIT 1")
_TURN_COUNTS_SQL = sql("SELECT state, count(*) FROM turns GROUP BY state")


def turn_view(conn: Any, turn_id: str) -> dict[str, Any] | None:
    """GET /v1/turns/{id}: the turn's row and, once done, its final answer (its last original
    assistant row with text and no tool calls), reading that turn's rows only. Its session's
    other rows are passed over by their (small) leading columns; their contents are never read."""
    d = dialect_of(conn)
    with d.reading(conn):
        row = d.execute(conn, _TURN_SQL, (turn_id,)).fetchone()
        if row is None:
            return None
        answer = None
        if row[2] == "done":
            ids = [r[0] for r in d.execute(conn, _ANSWER_IDS_SQL, (row[1], turn_id)).fetchall()]
            for message_id in ids:
                content, kind, calls, cloned = d.execute(conn, _ANSWER_SQL, (message_id,)).fetchone()
                if cloned is not None:
                    continue
                message = {"role": "assistant", "content": _content(d.text(content), kind),
                           "tool_calls": json.loads(calls) if calls else None}
                if is_final_answer(message):
                    answer = message["content"]
                    break
    return {"turn_id": row[0], "session": row[1], "state": row[2], "answer": answer, "error": d.text(row[3])}


def _content(text: str | None, kind: str) -> Any:
    if text is None or kind == "text":
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def list_turns(conn: Any, session: str, after: int, limit: int) -> tuple[list[dict[str, Any]], bool] | None:
    """A session's turns after `after` (their submission order, "seq": SQLite's rowid), in that order:
    (at most `limit`, whether there are more), or None when the session has no turn at all."""
    d = dialect_of(conn)
    with d.reading(conn):
        rows = d.execute(conn, _TURN_LIST_SQL, (session, after, limit + 1)).fetchall()
        if not rows and d.execute(conn, _ANY_TURN_SQL, (session,)).fetchone() is None:
            return None
    names = ("seq", "turn_id", "state", "created_at", "started_at", "ended_at", "attempts", "error")
    turns = [dict(zip(names, r)) for r in rows[:limit]]
    for turn in turns:
        turn["error"] = d.text(turn["error"])
    return turns, len(rows) > limit


class _Auth:
    """ASGI middleware: every request but those of OPEN_PATHS needs the token (401 otherwise)."""

    def __init__(self, app: Any, api: HttpApi) -> None:
        self.app = app
        self.api = api

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            authorization = ""
            for name, value in scope["headers"]:
                if name == b"authorization":
                    authorization = value.decode("latin-1")
                    break
            problem = self.api.refusal(authorization)
            if problem is not None:
                response = _json({"error": problem}, 401, {"WWW-Authenticate": 'Bearer realm="hermes"'})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _protocol_class(api: HttpApi) -> type:
    """uvicorn's h11 protocol with the read timeouts and the connection cap of `api` (see the module doc)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    body = json.dumps({"error": "too many connections; try again"}).encode()
    busy = (f"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: {RETRY_AFTER}\r\n"
            f"connection: close\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body
    late = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    too_large = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"

    class GuardedH11(H11Protocol):
        guard_phase: str | None = None  # "head": a request head is due; "body": its body; None: neither
        guard_timer: asyncio.TimerHandle | None = None
        rejected = False
        lingering = False  # answered before its request's body was read whole: what still comes is discarded

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            api.protocols.add(self)
            verdict = api.admit(self)
            if verdict == "drop":
                transport.abort()
            elif verdict == "reject":  # answered 503 at its first bytes; closed if none come
                self.rejected = True
                self.guard_timer = self.loop.call_later(api.reject_seconds, transport.abort)
            else:
                self.guard()

        def data_received(self, data: bytes) -> None:
            if self.lingering:
                return
            if self.rejected:
                if not self.transport.is_closing():
                    self.transport.write(busy)
                    self.transport.close()
                return
            if self.guard_phase == "head":  # h11 bounds a head that comes in pieces; this, one that comes whole
                head = bytes(self.conn.trailing_data[0]) + data[: MAX_HEAD + 4]
                end = head.find(b"\r\n\r\n")
                if (end if end >= 0 else len(head)) > MAX_HEAD:
                    api.rate.note("head-too-large", "HTTP API: refused a request head over its bound", limit=MAX_HEAD)
                    self.set_phase(None)
                    self.transport.write(too_large)
                    self.transport.close()
                    return
            super().data_received(data)
            self.guard()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
                self.linger()
            self.guard()

        def linger(self) -> None:
            """The answer went out before the request's body was read whole (an error: the body is too
            large, or not wanted): end the connection rather than wait for a body nobody reads. The
            write side is shut once the answer is sent (the client reads it, then the end); what the
            client still sends is read and dropped (closing with it unread would reset the connection,
            and the client could lose the answer), for at most LINGER_SECONDS."""
            self.lingering = True
            self.set_phase(None)
            self._unset_keepalive_if_required()
            self.flow.resume_reading()
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.guard_timer = self.loop.call_later(LINGER_SECONDS, self.transport.abort)

        def connection_lost(self, exc: Exception | None) -> None:
            self.set_phase(None)
            api.protocols.discard(self)
            super().connection_lost(exc)

        def guard(self) -> None:
            phase = None
            if not self.transport.is_closing() and not self.lingering:
                state = self.conn.their_state
                phase = "head" if state is h11.IDLE else "body" if state is h11.SEND_BODY else None
            if phase != self.guard_phase:
                self.set_phase(phase)

        def set_phase(self, phase: str | None) -> None:
            self.guard_phase = phase
            if self.guard_timer is not None:
                self.guard_timer.cancel()
                self.guard_timer = None
            api.heads.pop(self, None)
            if phase == "head":
                api.heads[self] = None
                self.guard_timer = self.loop.call_later(api.head_seconds, self.expire, phase)
            elif phase == "body":
                self.guard_timer = self.loop.call_later(api.body_seconds, self.expire, phase)

        def expire(self, phase: str) -> None:
            self.guard_timer = None
            if self.guard_phase != phase or self.transport.is_closing():
                return
            api.rate.note(f"timeout-{phase}", f"HTTP API: closed a connection whose request {phase} did not "
                          "arrive in time", seconds=api.head_seconds if phase == "head" else api.body_seconds)
            if phase == "head" and self.conn.our_state is h11.IDLE and self.conn.trailing_data[0]:
                self.transport.write(late)  # part of a head came: say why (an idle one is just closed)
            self.set_phase(None)
            self.transport.close()

    return GuardedH11


def serve_api(daemon: Daemon, listen: str, allow_remote: bool) -> HttpApi:
    """Serve the HTTP API of `daemon` on `listen` ("HOST:PORT") in a thread; HttpStartError says why
    it could not start. Its URL is announced by the daemon once it is ready (after its status file
    and the token file are written: Daemon._announce)."""
    try:
        host, port = parse_listen(listen, allow_remote)
        before, now = raise_nofile(daemon.config.workers)
        if now != before:
            info("raised the descriptor limit for the HTTP API", soft_nofile_before=before, soft_nofile=now)
        api = HttpApi(daemon, host, port)
        api.start()
    except (ValueError, OSError, RuntimeError) as exc:
        raise HttpStartError(f"cannot serve the HTTP API on {listen}: {exc}") from exc
    return api


def _quiet_server(config: Any) -> Any:
    """A uvicorn.Server that installs no signal handlers: SIGTERM and SIGINT stay the daemon's, and
    whose sockets queue up to LISTEN_BACKLOG connections in the kernel."""
    import uvicorn

    class QuietServer(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            # asyncio listens with the backlog it also takes as its accept burst (ACCEPT_BURST, kept
            # small for the descriptor budget). A kernel queue that small drops the SYNs of a burst
            # of clients, who then wait a second to retry; listening again only lengthens the queue.
            for sock in sockets or ():
                sock.listen(LISTEN_BACKLOG)

        @contextlib.contextmanager
        def capture_signals(self) -> Any:
            yield

        def install_signal_handlers(self) -> None:  # the hook of older uvicorn releases
            return None

    return QuietServer(config)


def _json(payload: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None) -> Response:
    from starlette.responses import JSONResponse

    return JSONResponse(payload, status_code=status, headers=headers)


async def _read_json(request: Request) -> dict[str, Any]:
    kind = request.headers.get("content-type")
    if kind is not None:
        mime = kind.partition(";")[0].strip().lower()
        if mime != "application/json" and not mime.endswith("+json"):
            raise ApiError(415, f"the body must be JSON (Content-Type: application/json), not {kind[:60]!r}")
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > MAX_BODY):
        raise ApiError(413 if length.isdigit() else 400, f"the body must be a JSON object of at most {MAX_BODY} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise ApiError(413, f"the body must be a JSON object of at most {MAX_BODY} bytes")
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except ValueError:
        raise ApiError(400, "the body is not valid JSON") from None
    except RecursionError:
        raise ApiError(400, "the body's JSON is nested too deeply") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    return body


def _after(request: Request) -> int:
    """Where a stream resumes: the `Last-Event-ID` header, else `?after=N`, else the start (0)."""
    value = request.headers.get("last-event-id")
    source = "Last-Event-ID"
    if value is None:
        value, source = request.query_params.get("after"), "after"
    if value is None or value.strip() == "":
        return 0
    value = value.strip()
    if not _DIGITS.fullmatch(value):  # ASCII digits only: "²".isdigit() is True, int("²") is not a number
        raise ApiError(400, f"{source} must be an event id (a non-negative integer), not {value[:40]!r}")
    return int(value)


def _number(request: Request, name: str, default: int) -> int:
    """A non-negative integer query parameter (ASCII digits), `default` when absent; ApiError 400 otherwise."""
    value = request.query_params.get(name)
    if value is None or value.strip() == "":
        return default
    if not _DIGITS.fullmatch(value.strip()):
        raise ApiError(400, f"{name} must be a non-negative integer, not {value[:40]!r}")
    return int(value)
