"""What a hostile client may cost the HTTP API: the bounds (time, bytes, connections, streams), the
descriptor budget they are drawn from, and the rate at which hitting them is logged."""
from __future__ import annotations

import logging
import time
from typing import Any, Callable

from supervisor.daemon.log import warn

MAX_BODY = 1 << 20           # bytes of a request body
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
LOG_EVERY = 10.0             # seconds between two log lines of one kind of refused connection or error


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


class UvicornRateFilter(logging.Filter):
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
