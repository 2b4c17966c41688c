"""What a request carries, checked (its JSON body, ids, numbers), and how an error is answered:
`ApiError`, always as a JSON body."""
from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from hermes.ids import validate_session_id
from supervisor.daemon.http.limits import MAX_BODY

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

_DIGITS = re.compile(r"[0-9]{1,18}")
_TURN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


class ApiError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


def json_response(payload: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None) -> Response:
    from starlette.responses import JSONResponse

    return JSONResponse(payload, status_code=status, headers=headers)


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


async def read_json(request: Request) -> dict[str, Any]:
    """The body as a JSON object of at most MAX_BODY bytes, read as it comes (never more than that held)."""
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


def resume_point(request: Request) -> int:
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


def query_number(request: Request, name: str, default: int) -> int:
    """A non-negative integer query parameter (ASCII digits), `default` when absent; ApiError 400 otherwise."""
    value = request.query_params.get(name)
    if value is None or value.strip() == "":
        return default
    if not _DIGITS.fullmatch(value.strip()):
        raise ApiError(400, f"{name} must be a non-negative integer, not {value[:40]!r}")
    return int(value)
