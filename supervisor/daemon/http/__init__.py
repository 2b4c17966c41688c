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

Every error is a JSON object {"error": ...}: ours, an unknown path (404), a method a path does
not take (405), and a bug (500).

Its modules, one job each:

* `server`: `HttpApi` (bind, run uvicorn in a thread, stop) and `serve_api`, the daemon's way in;
* `routes`: what each request does, and the app (errors as JSON, the token in front of the router);
* `token`: ``Authorization: Bearer <token>``, the token kept in ``<db>.token`` (created 0600 at the
  first start with HTTP, reused after), checked for every path but `OPEN_PATHS`;
* `parsing`: what a request carries (its JSON body, ids, numbers), and `ApiError`;
* `streams`: the event streams, only what is durable (`supervisor.daemon.events`), woken by
  `supervisor.daemon.watch` (looked at every `POLL_SECONDS`);
* `readers`: every read runs in a small pool of reader threads (`DB_READERS`), each with its
  read-only connection, never on the event loop; `turn_reads`: what the turn routes read (a turn
  lookup reads that turn's rows only);
* `guard` and `limits`: what a hostile client may cost (below).

Writes take the daemon's own paths: a turn is queued by `inbox.submit` (the `submit` command's
transaction), a cancel is carried out by the daemon's loop (`Daemon.request_cancel`).

The store is a SQLite file or a PostgreSQL database (`daemon.store`, a path or a
``postgresql://`` URL); what differs between them is `supervisor.daemon.reads`. On PostgreSQL a
read that fails is answered 503 (and an event stream ends: its client resumes with
`Last-Event-ID`), and a connection the failure broke (the server restarted) is dropped: the next
read connects again. The daemon's own files (the token) are named after `daemon.db_path` on either.

Hostile clients cost bounded resources (the numbers are in `limits`):

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

Importing this package imports neither starlette nor uvicorn: they are loaded when a server starts.
"""
from supervisor.daemon.http.server import INSTALL_HINT, HttpApi, HttpStartError, missing_dependencies, \
    parse_listen, serve_api
from supervisor.daemon.http.token import load_token, token_path

__all__ = ["INSTALL_HINT", "HttpApi", "HttpStartError", "load_token", "missing_dependencies", "parse_listen",
           "serve_api", "token_path"]
