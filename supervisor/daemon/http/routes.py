"""The routes of the HTTP API and the app that serves them: what each request does, how an error is
answered (always JSON: ours, starlette's 404 and 405, and a bug's 500), and the token in front of
the router."""
from __future__ import annotations

import asyncio
import sqlite3
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from hermes.state import StorageError
from supervisor.daemon.http import turn_reads
from supervisor.daemon.http.limits import RETRY_AFTER
from supervisor.daemon.http.parsing import ApiError, check_session, check_turn_id, json_response, query_number, \
    read_json
from supervisor.daemon.http.streams import open_stream
from supervisor.daemon.http.token import CHALLENGE, TokenCheck
from supervisor.daemon.log import warn
from supervisor.daemon.metrics import HttpGauges

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from supervisor.daemon.http.server import HttpApi

CANCEL_TIMEOUT = 30.0        # seconds the daemon's loop has to take a cancel request
TURN_LIST_LIMIT = 1000       # turns per GET /v1/sessions/{session}/turns

Handler = Callable[["HttpApi", "Request"], Awaitable[Any]]


def build_app(api: HttpApi) -> Any:
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.middleware import Middleware
    from starlette.routing import Route

    def route(path: str, handler: Handler, method: str) -> Route:
        return Route(path, _handled(api, handler), methods=[method])

    routes = [
        route("/healthz", healthz, "GET"),
        route("/metrics", metrics, "GET"),
        route("/v1/sessions/{session}/turns", submit, "POST"),
        route("/v1/sessions/{session}/turns", session_turns, "GET"),
        route("/v1/sessions/{session}/events", open_stream, "GET"),
        route("/v1/turns/{turn_id}", turn, "GET"),
        route("/v1/turns/{turn_id}/cancel", cancel, "POST"),
    ]
    # Starlette answers an unknown path or method, and a bug, in plain text: a client reads JSON here.
    handlers = {HTTPException: _starlette_error, Exception: _internal_error}
    # The token is checked in front of the router: every path (a route added later, an unknown
    # one) needs it but OPEN_PATHS.
    return Starlette(routes=routes, lifespan=api.lifespan, exception_handlers=handlers,  # type: ignore[arg-type]
                     middleware=[Middleware(TokenCheck, token=lambda: api.token)])


async def _starlette_error(_request: Request, exc: Exception) -> Response:
    status, detail = getattr(exc, "status_code", 500), getattr(exc, "detail", "")
    return json_response({"error": str(detail)}, status, getattr(exc, "headers", None))


async def _internal_error(_request: Request, _exc: Exception) -> Response:
    return json_response({"error": "internal error (the daemon's log has the details)"}, 500)


def _handled(api: HttpApi, handler: Handler) -> Callable[[Request], Awaitable[Any]]:
    async def handled(request: Request) -> Any:
        from starlette.requests import ClientDisconnect
        from starlette.responses import Response

        try:
            return await handler(api, request)
        except ApiError as exc:
            headers = dict(exc.headers or {})
            if exc.status == 401:
                headers.update(CHALLENGE)
            return json_response({"error": exc.message}, exc.status, headers or None)
        except ClientDisconnect:  # the client hung up (or was cut at BODY_SECONDS): nobody to answer
            return Response(status_code=400)
        except (StorageError, sqlite3.Error, OSError) as exc:
            warn("HTTP API request failed", path=request.url.path, error=str(exc))
            return json_response({"error": f"the database could not be read or written: {exc}"}, 503,
                                 {"Retry-After": str(RETRY_AFTER)})
    return handled


async def healthz(_api: HttpApi, _request: Request) -> Response:
    return json_response({"status": "ok"})


async def metrics(api: HttpApi, _request: Request) -> Response:
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    from starlette.responses import Response

    api.gauges = HttpGauges(  # taken here, on the loop that changes them; the registry is read in a thread
        connections=len(api.protocols), streams=api.streams,
        streams_waiting=sum(1 for state in api.stream_states if state.waiting),
        stream_held_bytes=sum(state.held for state in api.stream_states), limits=dict(api.rate.counts))
    text = await api.read(lambda _conn: generate_latest(api.registry))
    return Response(text, media_type=CONTENT_TYPE_LATEST)


async def submit(api: HttpApi, request: Request) -> Response:
    from starlette.concurrency import run_in_threadpool

    session = check_session(request.path_params["session"])
    body = await read_json(request)
    message = body.get("message")
    if not isinstance(message, str) or not message.strip():
        raise ApiError(400, 'the body needs "message": a non-empty string')
    turn_id = body.get("turn_id")
    if turn_id is not None:
        check_turn_id(turn_id)
    try:
        turn_id, new = await run_in_threadpool(api.submitter.submit, session, message, turn_id)
    except ValueError as exc:  # the turn id was used by another submission
        raise ApiError(409, str(exc)) from None
    api.daemon.wake()
    return json_response({"turn_id": turn_id, "session": session, "queued": new}, 202)


async def session_turns(api: HttpApi, request: Request) -> Response:
    session = check_session(request.path_params["session"])
    after = query_number(request, "after", 0)
    limit = query_number(request, "limit", TURN_LIST_LIMIT)
    if not 1 <= limit <= TURN_LIST_LIMIT:
        raise ApiError(400, f"limit must be from 1 to {TURN_LIST_LIMIT}")
    found = await api.read(turn_reads.list_turns, session, after, limit)
    if found is None:
        raise ApiError(404, f"session {session!r} has no turn")
    turns, more = found
    return json_response({"session": session, "turns": turns, "next": turns[-1]["seq"] if more else None})


async def turn(api: HttpApi, request: Request) -> Response:
    turn_id = check_turn_id(request.path_params["turn_id"])
    view = await api.read(turn_reads.turn_view, turn_id)
    if view is None:
        raise ApiError(404, f"no turn {turn_id!r}")
    return json_response(view)


async def cancel(api: HttpApi, request: Request) -> Response:
    turn_id = check_turn_id(request.path_params["turn_id"])
    try:
        future = api.daemon.request_cancel(turn_id)
        result = await asyncio.wait_for(asyncio.wrap_future(future), CANCEL_TIMEOUT)
    except (TimeoutError, RuntimeError) as exc:
        raise ApiError(503, f"the daemon could not take the cancel now ({exc or 'timed out'}); try again",
                       {"Retry-After": str(RETRY_AFTER)}) from None
    if not result["found"]:
        raise ApiError(404, f"no turn {turn_id!r}")
    out = {"turn_id": turn_id, "session": result["session"], "state": result["state"], "error": result["error"]}
    if not result["cancelling"]:
        return json_response({**out, "message": f"the turn already ended ({result['state']})"}, 409)
    return json_response({**out, "cancelling": True}, 202)
