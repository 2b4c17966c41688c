"""The HTTP API's server: `HttpApi` binds, runs uvicorn in a thread of the daemon, and stops it;
`serve_api` is how the daemon starts one. uvicorn runs with its signal handling off, so SIGTERM
stays the daemon's: the daemon stops this server when its drain begins, and joins it on shutdown."""
from __future__ import annotations

import asyncio
import contextlib
import errno
import importlib
import ipaddress
import logging
import socket
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable

from hermes.extras import install_line
from hermes.store.engines import is_postgres_url
from supervisor.daemon import inbox
from supervisor.daemon.http import limits, turn_reads
from supervisor.daemon.http.guard import defer_accept, guarded_protocol
from supervisor.daemon.http.readers import ReaderThreads
from supervisor.daemon.http.routes import build_app
from supervisor.daemon.http.streams import StreamState, watch_changes
from supervisor.daemon.http.token import load_token
from supervisor.daemon.log import info, log
from supervisor.daemon.metrics import HttpGauges
from supervisor.daemon.reads import read_store
from supervisor.daemon.watch import Changes, ChangeWatcher

if TYPE_CHECKING:
    from supervisor.daemon.service import Daemon

MODULES = ("starlette", "uvicorn", "prometheus_client")
# From the checkout's root `pip install '.[http]'` works too, into whichever environment is active.
INSTALL_HINT = f"{install_line('http')} (from a checkout's root, pip install '.[http]' also works)"
SUBMIT_WRITERS = 2           # connections submissions share (a burst waits for one: no connection each)


class HttpStartError(Exception):
    """The HTTP API could not be started (e.g. its port is taken); the daemon does not serve."""


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


class HttpApi:
    """The app, the uvicorn server and its thread, for one daemon; the state its parts share
    (the connections, the streams, the limits a test may set small)."""

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
        self.submitter = inbox.Submitter(self.store, SUBMIT_WRITERS)  # closed with the app (`lifespan`)
        self.watcher: ChangeWatcher | None = None     # which sessions changed (its own thread)
        self.registry: Any = None
        self.gauges = HttpGauges()  # the HTTP API's state at the last scrape of /metrics
        workers = getattr(getattr(daemon, "config", None), "workers", 4)
        self.max_connections, self.max_streams = limits.fd_limits(limits.nofile_limit(), int(workers or 1))
        self.head_seconds, self.body_seconds = limits.HEAD_SECONDS, limits.BODY_SECONDS
        self.reject_seconds = limits.REJECT_SECONDS
        self.defer_seconds = limits.HEAD_SECONDS  # a connection is accepted once it sent something (0: at once)
        self.protocols: set[Any] = set()                          # open connections (the server's loop only)
        self.heads: OrderedDict[Any, None] = OrderedDict()        # those waiting for a request head, oldest first
        self.rate = limits.RateLog()
        self.watch_log = limits.RateLog()  # the watcher's failures (not a limit: not in `rate`'s counts, which /metrics shows)
        self.readers = ReaderThreads(self.reads)                  # database reads, off the event loop
        self.watching: ThreadPoolExecutor | None = None           # the watcher's reads

    def app(self) -> Any:
        return build_app(self)

    async def read(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(conn, *args)` in a reader thread (`readers`)."""
        return await self.readers.read(fn, *args)

    # ------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 30.0) -> str:
        """Bind, start serving in a thread; returns the URL once the app is up (the socket listens already)."""
        import uvicorn

        self.token = load_token(self.db_path)
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.create_server((self.host, self.port), family=family, backlog=limits.LISTEN_BACKLOG)
        defer_accept(sock, self.defer_seconds)
        bound = sock.getsockname()
        self.url = f"http://{'[' + self.host + ']' if family == socket.AF_INET6 else self.host}:{bound[1]}"
        config = uvicorn.Config(self.app(), lifespan="on", log_config=None, log_level="warning", access_log=False,
                                http=guarded_protocol(self), ws="none", loop="asyncio", timeout_graceful_shutdown=5,
                                timeout_keep_alive=limits.KEEPALIVE_IDLE_SECONDS,
                                h11_max_incomplete_event_size=limits.MAX_HEAD,
                                # asyncio accepts up to `backlog` connections per readiness event, each a
                                # descriptor taken before the cap can refuse it: a small burst, in the budget
                                backlog=limits.ACCEPT_BURST,
                                # a backstop: connections never reach it (see `guard.admit`); requests in flight may
                                limit_concurrency=self.max_connections + limits.REJECT_SLACK + 1)
        self.server = _quiet_server(config)
        uvicorn_log = logging.getLogger("uvicorn")  # its warnings and errors go where the daemon's log goes
        uvicorn_log.handlers[:] = list(log.handlers)
        uvicorn_log.propagate = False
        errors = logging.getLogger("uvicorn.error")  # "Invalid HTTP request received." once per LOG_EVERY, not per request
        for old in [f for f in errors.filters if isinstance(f, limits.UvicornRateFilter)]:
            errors.removeFilter(old)
        errors.addFilter(limits.UvicornRateFilter(self.rate))
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
        asyncio.get_running_loop().call_later(limits.STOP_GRACE, self._cut_all)

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
    async def lifespan(self, _app: Any) -> AsyncIterator[None]:
        from supervisor.daemon.metrics import build_registry

        self.loop = asyncio.get_running_loop()
        self.loop.set_exception_handler(self._loop_exception)
        self.changes = Changes()
        self.watcher = self.reads.watcher()
        self.readers.start()
        self.watching = ThreadPoolExecutor(1, thread_name_prefix="http-watch")
        # The registry is collected in a reader thread (see `metrics`): it counts through that thread's connection.
        self.registry = build_registry(lambda: turn_reads.turn_counts(self.readers.conn()), self.daemon,
                                       lambda: self.gauges)
        watcher = asyncio.create_task(watch_changes(self))
        self.ready.set()
        try:
            yield
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            self.watching.shutdown(wait=True)  # a read in flight ends before its connection closes
            self.readers.close()
            self.watcher.close()
            self.submitter.close()

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """Accept errors (EMFILE and the like: asyncio retries a second later) as one line per LOG_EVERY,
        not a traceback per try; anything else as asyncio would."""
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
            self.rate.note("accept", "the HTTP API could not accept a connection; it tries again in a second",
                           error=str(exc), connections=len(self.protocols))
            return
        loop.default_exception_handler(context)


def serve_api(daemon: Daemon, listen: str, allow_remote: bool) -> HttpApi:
    """Serve the HTTP API of `daemon` on `listen` ("HOST:PORT") in a thread; HttpStartError says why
    it could not start. Its URL is announced by the daemon once it is ready (after its status file
    and the token file are written: Daemon._announce)."""
    try:
        host, port = parse_listen(listen, allow_remote)
        before, now = limits.raise_nofile(daemon.config.workers)
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
                sock.listen(limits.LISTEN_BACKLOG)

        @contextlib.contextmanager
        def capture_signals(self) -> Any:
            yield

        def install_signal_handlers(self) -> None:  # the hook of older uvicorn releases
            return None

    return QuietServer(config)
