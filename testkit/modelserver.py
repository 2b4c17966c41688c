"""A loopback-only, OpenAI-compatible "scripted model" HTTP server.

Tests, the chaos campaigns and the daemon's built-in demo model point an OpenAI client at
this server instead of a real model. It answers with a `testkit.script.Script`: every
reply's text and calls are a pure function of the request's ``messages``, so a client that
crashes and re-sends the same conversation receives the same continuation. Its tool-call ids
are fresh per request, as a real model's are: a re-sent request gets the same calls under new
ids (a server or script that says ``call_ids = "fixed"`` repeats them instead; one started
with ``call_ids="numbered"`` names each response's calls ``<tool>:<position>``, as some providers
do, so ids repeat across the rounds of a turn). Transport
faults (HTTP errors, truncated bodies, stalls, garbage) can be injected per reply and are
served a fixed number of times per exact request before the good reply comes through.
"""

from __future__ import annotations

import collections
import ipaddress
import json
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from testkit.script import (
    FAULTS,
    Reply,
    Script,
    ToolCallSpec,
    canonical,
    content_text,
    last_user_text,
    reply_index,
    request_key,
    tool_call_id,
    turn_prefix_digest,
    turn_script,
    turn_start,
)

# The script's vocabulary comes with the server, so a test needs one import for both.
__all__ = [
    "CALL_ID_STYLES",
    "FAULTS",
    "FIXED_IDS",
    "FRESH_IDS",
    "NUMBERED_IDS",
    "Reply",
    "Script",
    "ScriptedModelServer",
    "ToolCallSpec",
    "last_user_text",
    "reply_index",
    "request_key",
    "turn_script",
    "turn_start",
]


FRESH_IDS = "fresh"
FIXED_IDS = "fixed"
NUMBERED_IDS = "numbered"  # `<tool>:<position>` in every response: ids repeat from round to round
CALL_ID_STYLES = (FRESH_IDS, FIXED_IDS, NUMBERED_IDS)
# Turn positions whose answer count a server keeps (each a few hundred bytes).
_ANSWERED_KEPT = 100_000


def _rough_tokens(text: str) -> int:
    # ~4 characters per token is the usual rule of thumb; good enough for usage fields.
    return (len(text) + 3) // 4


def _split(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _error_body(message: str, err_type: str, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": err_type, "param": None, "code": code}}


# ---------------------------------------------------------------------------
# HTTP plumbing
# ---------------------------------------------------------------------------


class _HTTPServer(ThreadingHTTPServer):
    # Tests fan out several workers at one server; the default backlog of 5 is tight.
    request_queue_size = 64
    daemon_threads = True
    allow_reuse_address = True
    owner: "ScriptedModelServer"


class _IPv6HTTPServer(_HTTPServer):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.1 status lines, but every response carries Connection: close so the
    # client never tries to reuse a socket we are about to drop (streams are
    # close-delimited, and truncation must look like a plain disconnect).
    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        # Quiet by design: tests and the supervisor own stderr.
        return

    # -- routing ----------------------------------------------------------

    def _path(self) -> str:
        path = self.path.split("?", 1)[0]
        return path.rstrip("/") or "/"

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self._guarded(self._handle_get)

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        self._guarded(self._handle_post)

    def _guarded(self, fn: Callable[[], None]) -> None:
        self.close_connection = True
        try:
            fn()
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, socket.timeout):
            # The client gave up (timeout, crash); nothing left to tell it.
            pass

    def _handle_get(self) -> None:
        owner = self.server.owner
        path = self._path()
        owner._log({"path": path, "stream": False, "messages": [], "tools": [], "fault": None})
        if path == "/v1/models":
            self._send_json(
                200,
                {
                    "object": "list",
                    "data": [
                        {"id": owner.model, "object": "model", "created": 0, "owned_by": "scripted"}
                    ],
                },
            )
        elif path == "/v1/chat/completions":
            self._send_json(405, _error_body("use POST for chat completions", "invalid_request_error"))
        else:
            self._send_json(404, _error_body(f"unknown path {path}", "not_found_error"))

    def _handle_post(self) -> None:
        owner = self.server.owner
        path = self._path()
        body = self._read_body()
        if path != "/v1/chat/completions":
            owner._log({"path": path, "stream": False, "messages": [], "tools": [], "fault": None})
            self._send_json(404, _error_body(f"unknown path {path}", "not_found_error"))
            return

        request = self._parse_request(body)
        if isinstance(request, str):
            owner._log(
                {"path": path, "stream": False, "messages": [], "tools": [], "fault": None, "error": request}
            )
            self._send_json(400, _error_body(request, "invalid_request_error"))
            return

        messages: list[dict] = request["messages"]
        stream = bool(request.get("stream"))
        include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
        tools = [
            t.get("function", {}).get("name") if isinstance(t, dict) else None
            for t in (request.get("tools") or [])
        ]
        idx = reply_index(messages)
        entry: dict[str, Any] = {
            "path": path,
            "stream": stream,
            "messages": messages,
            "tools": tools,
            "reply_index": idx,
            "fault": None,
        }

        try:
            reply = owner.script(messages)
            if not isinstance(reply, Reply):
                raise TypeError(f"script returned {type(reply).__name__}, expected Reply")
        except Exception as exc:  # a broken script must surface to the test, not kill the thread
            entry["error"] = f"script error: {exc!r}"
            owner._log(entry)
            self._send_json(500, _error_body(entry["error"], "server_error"))
            return

        key = request_key(messages)
        fault = owner._take_fault(key, reply)
        entry["fault"] = fault
        owner._log(entry)

        built = owner._build(messages, reply, key, idx)
        if fault == "stall":
            # Interruptible so stop() does not leave threads sleeping for long.
            if owner._stopping.wait(max(0.0, reply.stall_seconds)):
                return
            fault = None  # after the stall the normal answer follows

        if fault == "http500":
            extra = {"Retry-After": _fmt_seconds(reply.retry_after)} if reply.retry_after > 0 else {}
            self._send_json(500, _error_body("scripted fault: internal server error", "server_error"), extra)
        elif fault == "http429":
            extra = {"Retry-After": _fmt_seconds(reply.retry_after)} if reply.retry_after > 0 else {}
            self._send_json(
                429,
                _error_body("scripted fault: rate limit reached", "rate_limit_error", "rate_limit_exceeded"),
                extra,
            )
        elif fault == "not_json":
            # Claim JSON but send HTML, like a misconfigured proxy would.
            self._send_raw(200, b"<html><body>502 Bad Gateway (scripted)</body></html>", "application/json")
        elif fault == "empty_choices":
            self._send_json(200, {**built.completion, "choices": []})
        elif stream:
            self._send_stream(built, include_usage, truncate=fault == "truncate")
        elif fault == "truncate":
            data = _canonical_bytes(built.completion)
            # Advertise the full length but stop halfway: the client sees a cut body.
            self._send_raw(200, data, "application/json", cut_at=max(1, len(data) // 2))
        else:
            self._send_json(200, built.completion)

    # -- request parsing ------------------------------------------------

    def _read_body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                return b""
            return self.rfile.read(n) if n > 0 else b""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._read_chunked()
        return b""

    def _read_chunked(self) -> bytes:
        out = bytearray()
        while True:
            line = self.rfile.readline(65537)
            size = int(line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                # Drain trailers up to the blank line.
                while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                    pass
                return bytes(out)
            out += self.rfile.read(size)
            self.rfile.readline(3)

    @staticmethod
    def _parse_request(body: bytes) -> dict | str:
        """Return the decoded request, or an error message string."""
        try:
            data = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return f"request body is not valid JSON: {exc}"
        if not isinstance(data, dict):
            return "request body must be a JSON object"
        messages = data.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            return "'messages' must be a list of objects"
        return data

    # -- response writing -----------------------------------------------

    def _send_json(self, status: int, payload: dict, extra_headers: dict[str, str] | None = None) -> None:
        self._send_raw(status, _canonical_bytes(payload), "application/json", extra_headers=extra_headers)

    def _send_raw(
        self,
        status: int,
        data: bytes,
        content_type: str,
        *,
        extra_headers: dict[str, str] | None = None,
        cut_at: int | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        for name, value in (extra_headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data if cut_at is None else data[:cut_at])
        self.wfile.flush()

    def _send_stream(self, built: "_Built", include_usage: bool, *, truncate: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        # No Content-Length / chunking: the body ends when we close the socket,
        # which is also how a truncated stream is delivered.
        self.send_header("Connection", "close")
        self.end_headers()

        chunks = built.stream_chunks
        if truncate:
            # Everything before the finish chunk, roughly half of it; never the
            # finish_reason chunk and never [DONE].
            body = chunks[:-1]
            for chunk in body[: max(1, len(body) // 2)]:
                self._write_event(canonical(chunk))
            self.wfile.flush()
            return

        for chunk in chunks:
            self._write_event(canonical(chunk))
        if include_usage:
            self._write_event(canonical({**built.chunk_base, "choices": [], "usage": built.usage}))
        self._write_event("[DONE]")
        self.wfile.flush()

    def _write_event(self, data: str) -> None:
        self.wfile.write(f"data: {data}\n\n".encode("utf-8"))
        # Flush per event so clients really see a stream, not one blob.
        self.wfile.flush()


def _canonical_bytes(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode("utf-8")


def _fmt_seconds(value: float) -> str:
    # The OpenAI SDK accepts fractional seconds, which keeps retry tests fast.
    return format(value, "g")


@dataclass(frozen=True)
class _Built:
    completion: dict
    chunk_base: dict
    stream_chunks: list[dict]
    usage: dict


# ---------------------------------------------------------------------------
# Public server
# ---------------------------------------------------------------------------


def _check_loopback(host: str) -> str:
    """Return the address to bind, refusing anything that is not loopback."""
    if host.lower() == "localhost":
        # Bind the literal address so name resolution can never widen the exposure.
        return "127.0.0.1"
    try:
        addr = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        raise ValueError(f"refusing to bind non-loopback host {host!r}") from None
    if not addr.is_loopback:
        raise ValueError(f"refusing to bind non-loopback host {host!r}")
    return str(addr)


class ScriptedModelServer:
    """OpenAI-compatible chat-completions server driven by a Script.

    Usage::

        with ScriptedModelServer(turn_script({...})) as server:
            client = openai.OpenAI(base_url=server.base_url, api_key="x")
    """

    def __init__(
        self,
        script: Script,
        *,
        model: str = "scripted-model",
        host: str = "127.0.0.1",
        chunk_chars: int = 8,
        request_log: int | None = None,
        call_ids: str | None = None,
    ) -> None:
        """`request_log`: how many of the latest requests `requests` keeps (None: all of them,
        as tests want; a campaign or a daemon keeps a few, so its memory stays flat).
        `call_ids`: "fresh" (each request's calls get ids no earlier request got), "fixed"
        (a re-sent request gets the same ids) or "numbered" (`<tool>:<position>` in every
        response); by default the script's own `call_ids` attribute, else "fresh". A call the
        script names itself (`ToolCallSpec.id`) keeps its name in every style."""
        if chunk_chars < 1:
            raise ValueError("chunk_chars must be >= 1")
        if request_log is not None and request_log < 0:
            raise ValueError("request_log must be >= 0")
        call_ids = call_ids or getattr(script, "call_ids", None) or FRESH_IDS
        if call_ids not in CALL_ID_STYLES:
            raise ValueError(f"call_ids must be one of {', '.join(CALL_ID_STYLES)}, not {call_ids!r}")
        self.call_ids = call_ids
        # How often each turn position was answered with calls: the n-th answer's ids mix in n,
        # so the first answer's ids are the fixed ones and each repeat's are new. Bounded (oldest
        # forgotten first) so a long-running server's memory stays flat.
        self._answered: collections.OrderedDict[tuple[str, str | None, int], int] = collections.OrderedDict()
        self.script = script
        self.model = model
        self.host = _check_loopback(host)
        self.chunk_chars = chunk_chars
        self._lock = threading.Lock()
        self._requests: collections.deque[dict] = collections.deque(maxlen=request_log)
        self._fault_counts: dict[str, int] = {}
        self._faults_served: collections.Counter[str] = collections.Counter()
        self._stopping = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------

    def start(self) -> "ScriptedModelServer":
        if self._httpd is not None:
            raise RuntimeError("server already started")
        cls = _IPv6HTTPServer if ":" in self.host else _HTTPServer
        httpd = cls((self.host, 0), _Handler)
        httpd.owner = self
        self._stopping.clear()
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"scripted-model:{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, thread = self._httpd, self._thread
        if httpd is None:
            return
        # Wake stalled handlers first so they exit instead of answering late.
        self._stopping.set()
        httpd.shutdown()
        httpd.server_close()
        if thread is not None:
            thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> "ScriptedModelServer":
        return self.start() if self._httpd is None else self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- addresses ------------------------------------------------------

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("server not started")
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    # -- request log ----------------------------------------------------

    @property
    def requests(self) -> list[dict]:
        """Snapshot of the request log (a copy, so callers can iterate safely)."""
        with self._lock:
            return list(self._requests)

    @property
    def request_count(self) -> int:
        with self._lock:
            return len(self._requests)

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()

    def _log(self, entry: dict) -> None:
        entry.setdefault("time", time.time())
        with self._lock:
            self._requests.append(entry)

    # -- fault accounting -----------------------------------------------

    def _take_fault(self, key: str, reply: Reply) -> str | None:
        """Count this request and decide whether it gets the reply's fault.

        Only requests whose reply carries a fault are counted: a long-running server (the
        daemon's) must not keep a counter for every conversation it ever answered.
        """
        if reply.fault is None:
            return None
        with self._lock:
            seen = self._fault_counts.get(key, 0)
            self._fault_counts[key] = seen + 1
            if seen < reply.fault_times:
                self._faults_served[reply.fault] += 1
        return reply.fault if seen < reply.fault_times else None

    def faults_served(self) -> dict[str, int]:
        """How many responses of each fault this server has served (a fault's accounting)."""
        with self._lock:
            return dict(self._faults_served)

    # -- response construction -------------------------------------------

    def _repeat(self, prefix: str, user_text: str | None, idx: int) -> int:
        """How many times this turn position was answered before (always 0 with fixed ids)."""
        if self.call_ids != FRESH_IDS:
            return 0
        where = (prefix, user_text, idx)
        with self._lock:
            seen = self._answered.pop(where, 0)
            self._answered[where] = seen + 1
            while len(self._answered) > _ANSWERED_KEPT:
                self._answered.popitem(last=False)
        return seen

    def _build(self, messages: list[dict], reply: Reply, key: str, idx: int) -> _Built:
        """Render a Reply as both a completion and a list of stream chunks."""
        user_text = last_user_text(messages)
        prefix = turn_prefix_digest(messages)
        completion_id = "chatcmpl-" + key[:24]
        repeat = self._repeat(prefix, user_text, idx) if reply.tool_calls else 0
        calls = [
            {
                "id": spec.id or (f"{spec.name}:{pos}" if self.call_ids == NUMBERED_IDS
                                  else tool_call_id(prefix, user_text, idx, pos, repeat)),
                "type": "function",
                "function": {"name": spec.name, "arguments": spec.arguments_json()},
            }
            for pos, spec in enumerate(reply.tool_calls)
        ]
        finish_reason = "tool_calls" if calls else "stop"

        prompt_text = "".join(
            content_text(m.get("content")) + canonical(m.get("tool_calls") or "") for m in messages
        )
        completion_text = (reply.content or "") + "".join(c["function"]["arguments"] for c in calls)
        prompt_tokens = _rough_tokens(prompt_text) + 3 * len(messages)
        completion_tokens = max(1, _rough_tokens(completion_text) + 5 * len(calls))
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }

        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if calls:
            message["tool_calls"] = calls
        elif reply.content is None:
            # A bare assistant message with neither text nor calls confuses clients.
            message["content"] = ""
        completion = {
            "id": completion_id,
            "object": "chat.completion",
            "created": 0,
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
            "usage": usage,
        }

        base = {"id": completion_id, "object": "chat.completion.chunk", "created": 0, "model": self.model}

        def chunk(delta: dict, finish: str | None = None) -> dict:
            return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        chunks = [chunk({"role": "assistant", "content": "" if reply.content is not None or not calls else None})]
        for piece in _split(reply.content or "", self.chunk_chars):
            chunks.append(chunk({"content": piece}))
        for pos, call in enumerate(calls):
            chunks.append(
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": pos,
                                "id": call["id"],
                                "type": "function",
                                "function": {"name": call["function"]["name"], "arguments": ""},
                            }
                        ]
                    }
                )
            )
            for piece in _split(call["function"]["arguments"], self.chunk_chars):
                chunks.append(chunk({"tool_calls": [{"index": pos, "function": {"arguments": piece}}]}))
        chunks.append(chunk({}, finish_reason))
        return _Built(completion=completion, chunk_base=base, stream_chunks=chunks, usage=usage)
