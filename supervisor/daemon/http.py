"""The daemon's HTTP API (`serve --http HOST:PORT`): a starlette app served by uvicorn in a
thread of the daemon process.

    POST /v1/sessions/{session}/turns   {"message": ..., "turn_id"?: ...}  -> 202 {"turn_id", ...}
    GET  /v1/turns/{turn_id}            -> {"turn_id", "session", "state", "answer", "error"}
    POST /v1/turns/{turn_id}/cancel     -> 202 (cancelling), 404 (unknown), 409 (already ended)
    GET  /v1/sessions/{session}/events  -> text/event-stream from `Last-Event-ID` (or ?after=N)
    GET  /metrics                       -> Prometheus text format
    GET  /healthz                       -> liveness, the one request without a token

Every other request carries ``Authorization: Bearer <token>``, the token kept in
``<db>.token`` (created 0600 at the first start with HTTP, reused after). Reads go through
read-only connections of this thread; writes take the daemon's own paths: a turn is queued
by `inbox.submit` (the `submit` command's transaction), a cancel is carried out by the
daemon's loop (`Daemon.request_cancel`). The event stream is `supervisor.daemon.events`:
only what is durable, woken by `PRAGMA data_version` (polled every `POLL_SECONDS`).

uvicorn runs with its signal handling off, so SIGTERM stays the daemon's: the daemon stops
this server when its drain begins, and joins it on shutdown.
"""
from __future__ import annotations

import asyncio
import contextlib
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
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable

from hermes.ids import validate_session_id
from hermes.private_files import replace_file_durably
from hermes.state import SessionDB, StorageError, connect_readonly
from supervisor.daemon import inbox
from supervisor.daemon.events import SessionFeed
from supervisor.daemon.log import info, log, warn

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from supervisor.daemon.service import Daemon

MODULES = ("starlette", "uvicorn", "prometheus_client")
INSTALL_HINT = "pip install '.[http]'"
POLL_SECONDS = 0.02          # how often the database's data_version is looked at
KEEPALIVE_SECONDS = 15.0     # a comment line on an idle event stream
MAX_BODY = 1 << 20           # bytes of a request body
CANCEL_TIMEOUT = 30.0        # seconds the daemon's loop has to take a cancel request
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
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Changes:
    """Per session, an asyncio.Event that is set (and replaced) at the session's next change;
    `current(ANY)` at any change. Used in the server's event loop only."""

    ANY = ""  # never a session id

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}

    def current(self, session: str) -> asyncio.Event:
        return self._events.setdefault(session, asyncio.Event())

    def sessions(self) -> list[str]:
        """The sessions a stream waits on now."""
        return [s for s in self._events if s != self.ANY]

    def bump(self, sessions: set[str] | None = None) -> None:
        """Wake the streams of `sessions` (None: all) and those waiting on any change."""
        for key in list(self._events) if sessions is None else [*sessions, self.ANY]:
            event = self._events.pop(key, None)
            if event is not None:
                event.set()


class Watcher:
    """Which sessions changed since it last looked: new message rows, new turns, or a turn of a
    watched session that left 'queued'/'running' (it ended). One read transaction per look, a
    few index seeks, instead of every stream reading its session at every commit."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.max_row: int | None = None
        self.max_turn = 0
        self.unfinished: dict[str, set[str]] = {}

    def look(self, watched: list[str]) -> set[str] | None:
        """The changed sessions among all; None the first time (everything may have changed)."""
        conn = self.conn
        conn.execute("BEGIN")
        try:
            if self.max_row is None:
                changed = None
                self.max_row = conn.execute("SELECT coalesce(max(id), 0) FROM messages").fetchone()[0]
                self.max_turn = conn.execute("SELECT coalesce(max(rowid), 0) FROM turns").fetchone()[0]
            else:
                changed = set()
                for session, top in conn.execute("SELECT session_id, max(id) FROM messages WHERE id > ? "
                                                 "GROUP BY session_id", (self.max_row,)).fetchall():
                    changed.add(session)
                    self.max_row = max(self.max_row, top)
                for session, top in conn.execute("SELECT session_id, max(rowid) FROM turns WHERE rowid > ? "
                                                 "GROUP BY session_id", (self.max_turn,)).fetchall():
                    changed.add(session)
                    self.max_turn = max(self.max_turn, top)
            unfinished: dict[str, set[str]] = {}
            for start in range(0, len(watched), 500):
                chunk = watched[start:start + 500]
                for session, turn_id in conn.execute(
                        f"SELECT session_id, id FROM turns WHERE session_id IN ({', '.join('?' * len(chunk))}) "
                        "AND state IN ('queued', 'running')", chunk).fetchall():
                    unfinished.setdefault(session, set()).add(turn_id)
        finally:
            conn.execute("COMMIT")
        if changed is not None:
            changed.update(s for s in watched if self.unfinished.get(s) != unfinished.get(s, set()))
        self.unfinished = {s: unfinished.get(s, set()) for s in watched}
        return changed


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
        self.changes: Changes | None = None
        self.conn: sqlite3.Connection | None = None   # the feed's and the metrics' reads (this thread only)
        self.db: SessionDB | None = None              # turn lookups (this thread only)
        self.registry: Any = None

    # ------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 30.0) -> str:
        """Bind, start serving in a thread; returns the URL once the app is up (the socket listens already)."""
        import uvicorn

        self.token = load_token(self.db_path)
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.create_server((self.host, self.port), family=family, backlog=1024)
        bound = sock.getsockname()
        self.url = f"http://{'[' + self.host + ']' if family == socket.AF_INET6 else self.host}:{bound[1]}"
        config = uvicorn.Config(self.app(), lifespan="on", log_config=None, log_level="warning", access_log=False,
                                http="h11", ws="none", loop="asyncio", timeout_graceful_shutdown=5,
                                timeout_keep_alive=30)
        self.server = _quiet_server(config)
        uvicorn_log = logging.getLogger("uvicorn")  # its warnings and errors go where the daemon's log goes
        uvicorn_log.handlers[:] = list(log.handlers)
        uvicorn_log.propagate = False
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
        loop, changes = self.loop, self.changes
        if loop is not None and changes is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(changes.bump)

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
        self.changes = Changes()
        self.conn = connect_readonly(self.db_path)
        self.db = SessionDB(self.db_path, readonly=True)
        self.registry = build_registry(self._turn_counts, self.daemon, lambda: self.streams)
        watcher = asyncio.create_task(self._watch())
        self.ready.set()
        try:
            yield
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            self.conn.close()
            self.db.close()

    async def _watch(self) -> None:
        """Wake the streams of the sessions that changed whenever another connection committed
        (`PRAGMA data_version` changed)."""
        assert self.conn is not None and self.changes is not None
        watcher = Watcher(self.conn)
        version = None
        while True:
            try:
                now = self.conn.execute("PRAGMA data_version").fetchone()[0]
                if now != version:
                    version = now
                    self.changes.bump(watcher.look(self.changes.sessions()))
            except sqlite3.Error as exc:
                warn("the HTTP API could not look for changes; waking every stream", error=str(exc))
                version = None
                self.changes.bump()
            await asyncio.sleep(POLL_SECONDS)

    def _turn_counts(self) -> dict[str, int]:
        assert self.conn is not None
        return dict(self.conn.execute("SELECT state, count(*) FROM turns GROUP BY state").fetchall())

    # ------------------------------------------------------------------ app
    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.routing import Route

        routes = [
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/metrics", self._guarded(self.metrics), methods=["GET"]),
            Route("/v1/sessions/{session}/turns", self._guarded(self.submit), methods=["POST"]),
            Route("/v1/sessions/{session}/events", self._guarded(self.events), methods=["GET"]),
            Route("/v1/turns/{turn_id}", self._guarded(self.turn), methods=["GET"]),
            Route("/v1/turns/{turn_id}/cancel", self._guarded(self.cancel), methods=["POST"]),
        ]
        return Starlette(routes=routes, lifespan=self._lifespan)

    def _guarded(self, handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def guarded(request: Request) -> Response:
            try:
                self._authorize(request)
                return await handler(request)
            except ApiError as exc:
                headers = {"WWW-Authenticate": 'Bearer realm="hermes"'} if exc.status == 401 else None
                return _json({"error": exc.message}, exc.status, headers)
            except (StorageError, sqlite3.Error, OSError) as exc:
                warn("HTTP API request failed", path=request.url.path, error=str(exc))
                return _json({"error": f"the database could not be read or written: {exc}"}, 503)
        return guarded

    def _authorize(self, request: Request) -> None:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise ApiError(401, "missing Authorization: Bearer <token> (the token is in the database's .token file)")
        if not hmac.compare_digest(given.strip().encode("utf-8", "replace"), self.token.encode("ascii")):
            raise ApiError(401, "wrong token")

    async def healthz(self, _request: Request) -> Response:
        return _json({"status": "ok"})

    async def metrics(self, _request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
        from starlette.responses import Response

        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)

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
            turn_id, new = await run_in_threadpool(inbox.submit, self.db_path, session, message, turn_id)
        except ValueError as exc:  # the turn id was used by another submission
            raise ApiError(409, str(exc)) from None
        self.daemon.wake()
        return _json({"turn_id": turn_id, "session": session, "queued": new}, 202)

    async def turn(self, request: Request) -> Response:
        turn_id = check_turn_id(request.path_params["turn_id"])
        assert self.db is not None
        turn = self.db.get_turn(turn_id)
        if turn is None:
            raise ApiError(404, f"no turn {turn_id!r}")
        answer = inbox.final_answer(self.db, turn) if turn["state"] == "done" else None
        return _json({"turn_id": turn["id"], "session": turn["session_id"], "state": turn["state"],
                      "answer": answer, "error": turn["error"]})

    async def cancel(self, request: Request) -> Response:
        turn_id = check_turn_id(request.path_params["turn_id"])
        try:
            future = self.daemon.request_cancel(turn_id)
            result = await asyncio.wait_for(asyncio.wrap_future(future), CANCEL_TIMEOUT)
        except (TimeoutError, RuntimeError) as exc:
            raise ApiError(503, f"the daemon could not take the cancel now ({exc or 'timed out'}); try again")
        if not result["found"]:
            raise ApiError(404, f"no turn {turn_id!r}")
        out = {"turn_id": turn_id, "session": result["session"], "state": result["state"], "error": result["error"]}
        if not result["cancelling"]:
            return _json({**out, "message": f"the turn already ended ({result['state']})"}, 409)
        return _json({**out, "cancelling": True}, 202)

    async def events(self, request: Request) -> Response:
        from starlette.responses import StreamingResponse

        session = check_session(request.path_params["session"])
        after = _after(request)
        assert self.conn is not None
        feed = SessionFeed(self.conn, session, after)
        return StreamingResponse(self._stream(feed), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def _stream(self, feed: SessionFeed) -> AsyncIterator[str]:
        assert self.changes is not None
        self.streams += 1
        try:
            yield ": stream of durable events\nretry: 1000\n\n"
            quiet_since = time.monotonic()
            while not self.stopping:
                # Taken before reading: a commit after the read wakes us. A stream holding a blank row
                # back waits on any change (the row may be filled in place, which adds no row).
                session_changed, any_change = self.changes.current(feed.session), self.changes.current(Changes.ANY)
                try:
                    batch = feed.poll()
                except (sqlite3.Error, StorageError) as exc:
                    warn("an event stream could not read the database; closing it", session=feed.session,
                         error=str(exc))
                    return
                if batch:
                    if self.daemon.config.synchronous != "FULL":
                        # Below FULL a commit is visible before it is durable; what a client receives
                        # must never be taken back by a power cut, so the WAL holding it is synced first.
                        await asyncio.to_thread(sync_wal, self.daemon.db_path)
                    yield "".join(event.encode() for event in batch)
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
        finally:
            self.streams -= 1


def sync_wal(db_path: Path) -> None:
    """fsync the database's WAL: every frame committed to it so far, by any process, becomes durable
    (frames already checkpointed into the database file were synced by the checkpoint)."""
    try:
        fd = os.open(f"{db_path}-wal", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return  # no WAL: everything committed is in the database file, synced when it got there
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def serve_api(daemon: Daemon, listen: str, allow_remote: bool) -> HttpApi:
    """Serve the HTTP API of `daemon` on `listen` ("HOST:PORT") in a thread. Its URL is the first
    line on stdout (and in the status file); HttpStartError says why it could not start."""
    try:
        host, port = parse_listen(listen, allow_remote)
        api = HttpApi(daemon, host, port)
        api.start()
    except (ValueError, OSError, RuntimeError) as exc:
        raise HttpStartError(f"cannot serve the HTTP API on {listen}: {exc}") from exc
    try:
        print(api.url, flush=True)
    except OSError:  # nobody reads stdout: the status file and the log still say it
        pass
    info("HTTP API listening", url=api.url, token_file=str(token_path(daemon.db_path)))
    return api


def _quiet_server(config: Any) -> Any:
    """A uvicorn.Server that installs no signal handlers: SIGTERM and SIGINT stay the daemon's."""
    import uvicorn

    class QuietServer(uvicorn.Server):
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
    if not value.isdigit() or len(value) > 18:
        raise ApiError(400, f"{source} must be an event id (a non-negative integer), not {value[:40]!r}")
    return int(value)
