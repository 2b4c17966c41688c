"""The event streams (GET /v1/sessions/{session}/events): what a stream holds, how it is sent at
the pace its client reads, and the watcher that wakes the streams of the sessions that changed.

Only what is durable is sent (`supervisor.daemon.events`); `supervisor.daemon.watch` says which
sessions changed, looked at every `POLL_SECONDS` in a thread of its own."""
from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from typing import TYPE_CHECKING, Any, AsyncIterator

from hermes.state import StorageError
from supervisor.daemon.events import SessionFeed
from supervisor.daemon.http.limits import RETRY_AFTER, STREAM_BATCH_BYTES, STREAM_CHUNK
from supervisor.daemon.http.parsing import ApiError, check_session, resume_point
from supervisor.daemon.log import warn
from supervisor.daemon.watch import SAME, Changes

if TYPE_CHECKING:
    from starlette.requests import Request

    from supervisor.daemon.http.server import HttpApi

POLL_SECONDS = 0.02          # how often the watcher looks for changes (supervisor.daemon.watch)
WATCH_RETRY_SECONDS = 1.0    # the most a watcher that keeps failing waits before it tries again
KEEPALIVE_SECONDS = 15.0     # a comment line on an idle event stream


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


async def open_stream(api: HttpApi, request: Request) -> Any:
    """The route: a stream from the request's resume point, unless the daemon is stopping or the
    streams are at their cap (503 with Retry-After)."""
    from starlette.responses import StreamingResponse

    session = check_session(request.path_params["session"])
    after = resume_point(request)
    retry = {"Retry-After": str(RETRY_AFTER)}
    if api.stopping:
        raise ApiError(503, "the daemon is stopping; resume the stream from the next one", retry)
    if api.streams >= api.max_streams:
        api.rate.note("streams", "HTTP API at its event stream cap: answering 503", cap=api.max_streams)
        raise ApiError(503, f"{api.max_streams} event streams are open, the most this daemon serves; "
                            "try again", retry)
    feed = SessionFeed(None, session, after, max_bytes=STREAM_BATCH_BYTES)
    state = StreamState(feed)
    response = StreamingResponse(stream_events(api, feed, state), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    api.streams += 1  # counted from here: starlette calls what is returned, at once
    api.stream_states.add(state)

    async def counted(scope: Any, receive: Any, send: Any) -> None:
        try:
            await response(scope, receive, send)
        finally:
            api.streams -= 1
            api.stream_states.discard(state)
    return counted


async def stream_events(api: HttpApi, feed: SessionFeed, state: StreamState | None = None) -> AsyncIterator[str]:
    """The stream's events, a chunk at a time. A `yield` hands a chunk to uvicorn, which writes
    it once the transport's buffer is below its high-water mark (it waits for the client to take
    the one before), so a client that does not read holds one poll's rows (`STREAM_BATCH_BYTES`,
    at least two rows: `state.held`) and about a chunk in the transport, never more."""
    assert api.changes is not None
    state = state if state is not None else StreamState(feed)
    yield ": stream of durable events\nretry: 1000\n\n"
    quiet_since = time.monotonic()
    while not api.stopping:
        # Taken before reading: a commit after the read wakes us. A stream holding a blank row
        # back waits on any change (the row may be filled in place, which adds no row).
        session_changed, any_change = api.changes.current(feed.session), api.changes.current(Changes.ANY)
        try:
            texts: list[str | None] = await api.read(_poll, feed)
        except (sqlite3.Error, StorageError) as exc:
            warn("an event stream could not read the database; closing it", session=feed.session,
                 error=str(exc))
            return
        if texts:
            state.held += sum(len(text) for text in texts if text is not None)
            if api.daemon.config.synchronous != "FULL":
                # Below FULL a commit is visible before it is durable; what a client receives
                # must never be taken back by a power cut, so the WAL holding it is made durable first.
                try:
                    await api.reads.settle(api.read)
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


async def watch_changes(api: HttpApi) -> None:
    """Wake the streams of the sessions that changed (`supervisor.daemon.watch`). The reads run
    in a thread of their own. A look that fails wakes every stream (each reads, and one whose
    read fails ends); the watcher then starts afresh, after a pause that grows while it fails
    (a PostgreSQL server that is restarting is not asked fifty times a second)."""
    assert api.watcher is not None and api.changes is not None
    watcher = api.watcher
    loop = asyncio.get_running_loop()
    pause = POLL_SECONDS
    while True:
        try:
            changed = await loop.run_in_executor(api.watching, watcher.look, api.changes.sessions())
            if changed is not SAME:
                api.changes.bump(changed)
            pause = POLL_SECONDS
        except (sqlite3.Error, StorageError, *api.reads.errors) as exc:
            api.watch_log.note("watch", "the HTTP API could not look for changes; waking every stream",
                               error=str(exc))
            await loop.run_in_executor(api.watching, watcher.reset)
            api.changes.bump()
            pause = min(max(pause, POLL_SECONDS) * 2, WATCH_RETRY_SECONDS)
        await asyncio.sleep(pause)
