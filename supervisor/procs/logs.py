"""One merged log for every worker: JSON lines in, JSON lines out, tagged by the supervisor.

Each worker writes JSON lines to its own stderr pipe; the pool reads each pipe line by
line on a thread of its own and hands every line to `MergedLog.on_log(proc, line)`. A
worker that is SIGKILLed can only lose its own unfinished line: the pipes are not
shared, so no worker can hold anything the others need (see docs/chaos.md, "Logs", for
why a queue shared by all workers was measured and rejected).

Every output line is one JSON object: the worker's own fields when its line is a JSON
object (otherwise {"msg": <text>, "level": "raw"}), plus the supervisor's tags:

    recv_ts      supervisor clock when the line was received (the merged order)
    src          "worker", or "supervisor" for `log_event`
    pid          the worker's pid as recorded at spawn
    incarnation  the worker's incarnation
    case         optional: given at construction, or per pid through `cases`
    truncated    true: the worker's last line had no newline (it died mid-line)
    cut, bytes   true and the original length: the line was longer than `max_line`

The supervisor's tags win; a worker field that disagrees with one is kept as
`worker_<name>`.

Locking: one lock, held only while one complete, already-encoded line is written and
flushed. Parsing and encoding happen outside it, and nothing done under it waits on a
worker. `on_log` never raises: a reader thread that died would stop draining its pipe,
and the worker would then block on its next log line.
"""
from __future__ import annotations

import io
import json
import os
import threading
import time
from pathlib import Path
from typing import IO, Any, Callable, MutableMapping, Protocol

from hermes.private_files import open_private_fd

MAX_LINE = 64 * 1024  # bytes of one worker line, newline excluded, before it is cut


class LogSource(Protocol):
    pid: int
    incarnation: int


def _encode(record: dict[str, Any]) -> bytes:
    text = json.dumps(record, ensure_ascii=False, allow_nan=False, default=str)
    # U+2028/U+2029 can only occur inside JSON strings here; escape them so that tools which
    # split text on every Unicode line break still see one object per line.
    text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return text.encode("utf-8", "backslashreplace") + b"\n"


def _raw(body: bytes) -> dict[str, Any]:
    return {"msg": body.decode("utf-8", "replace"), "level": "raw"}


def _merge(tags: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    """The supervisor's tags, then the worker's fields; a disagreeing field is kept as worker_<name>."""
    record = dict(tags)
    for key, value in own.items():
        if key not in tags:
            record[key] = value
        elif value != tags[key]:
            record[f"worker_{key}"] = value
    return record


class MergedLog:
    """A log file (created 0600) or stream that many worker reader threads write into.

    `target` is a path (opened for append; `reopen()` makes log rotation work) or an open
    stream, text or binary, which is flushed per line and never closed here.
    """

    def __init__(self, target: str | os.PathLike[str] | IO[Any], *, case: str | None = None,
                 cases: MutableMapping[int, str] | None = None, max_line: int = MAX_LINE,
                 clock: Callable[[], float] = time.time) -> None:
        self.case = case
        self.cases: MutableMapping[int, str] = cases if cases is not None else {}
        self.max_line = max_line
        self.clock = clock
        self.lines = 0      # lines written
        self.dropped = 0    # lines lost: written after close(), or the write failed
        self.last_error: BaseException | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._reopen_pending = False
        self._dangling = False  # a failed write may have left part of a line in the file
        self._fd: int | None = None
        self._stream: IO[Any] | None = None
        if isinstance(target, (str, os.PathLike)):
            self.path: Path | None = Path(target)
            self._fd = self._open()
        else:
            self.path = None
            self._stream = target
            self._text = isinstance(target, io.TextIOBase)

    # ------------------------------------------------------------------ input
    def on_log(self, proc: LogSource, line: bytes) -> None:
        """The pool's LogHandler: one line of a worker's stderr, newline included if it had one."""
        try:
            data = self._worker_line(proc, line)
            if data is not None:
                self._write(data)
        except Exception as exc:  # noqa: BLE001 - must never kill the reader thread
            self._lost(exc)

    def log_event(self, **fields: Any) -> None:
        """One of the supervisor's own events, into the same log (src "supervisor")."""
        now = round(self.clock(), 6)
        record: dict[str, Any] = {"recv_ts": now, "src": "supervisor", "ts": now, "level": "info"}
        if self.case is not None:
            record["case"] = self.case
        record.update({k: v for k, v in fields.items() if k not in ("recv_ts", "src")})
        try:
            line = _encode(record)
        except ValueError:  # NaN or infinity somewhere in the fields: keep the event as text
            line = _encode({"recv_ts": now, "src": "supervisor", "ts": now, "level": "info",
                            "msg": repr(fields)})
        try:
            self._write(line)
        except Exception as exc:  # noqa: BLE001
            self._lost(exc)

    def set_case(self, pid: int, case: str) -> None:
        """Tag every later line of worker `pid` with `case`."""
        self.cases[pid] = case

    def _worker_line(self, proc: LogSource, line: bytes) -> bytes | None:
        if not line:
            return None
        truncated = not line.endswith(b"\n")
        body = line.rstrip(b"\r\n")
        if not body.strip() and not truncated:
            return None  # a blank line carries nothing
        tags: dict[str, Any] = {"recv_ts": round(self.clock(), 6), "src": "worker", "pid": proc.pid,
                                "incarnation": getattr(proc, "incarnation", None)}
        case = self.cases.get(proc.pid) or getattr(proc, "label", None) or self.case
        if case is not None:
            tags["case"] = case
        if truncated:
            tags["truncated"] = True
        if len(body) > self.max_line:
            tags.update(cut=True, bytes=len(body))
            return _encode(_merge(tags, _raw(body[:self.max_line])))
        try:
            parsed = json.loads(body)
        except (ValueError, RecursionError):
            parsed = None
        if isinstance(parsed, dict):
            try:
                return _encode(_merge(tags, parsed))
            except (ValueError, TypeError, RecursionError):
                pass  # NaN or infinity: not JSON we can pass on; keep the text instead
        return _encode(_merge(tags, _raw(body)))

    # ------------------------------------------------------------------ output
    def _open(self) -> int:
        assert self.path is not None
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
        return open_private_fd(self.path, flags)

    def _write(self, data: bytes) -> None:
        with self._lock:
            if self._closed:
                self.dropped += 1
                return
            if self._reopen_pending:
                self._reopen_locked()
            if self._dangling:
                data = b"\n" + data  # end the fragment a failed write left, so this line stands alone
            if self._fd is not None:
                view = memoryview(data)
                try:
                    while view:
                        view = view[os.write(self._fd, view):]
                finally:  # a write that failed part way (the disk filled) leaves a fragment to end
                    self._dangling = bool(view) and (self._dangling or len(view) < len(data))
            else:
                assert self._stream is not None
                self._stream.write(data.decode("utf-8") if self._text else data)
                self._stream.flush()
            self.lines += 1

    def _lost(self, exc: BaseException) -> None:
        with self._lock:
            self.dropped += 1
            self.last_error = exc

    def reopen(self) -> bool:
        """Close and reopen the path (after log rotation, e.g. on SIGHUP).

        Safe to call from a signal handler: if the lock is busy (possibly held by the very
        code the signal interrupted), the reopen is done just before the next line is
        written instead, and False is returned. Streams are not reopened.
        """
        if self.path is None:
            return False
        if not self._lock.acquire(blocking=False):
            self._reopen_pending = True
            return False
        try:
            if self._closed:
                return False
            self._reopen_locked()
            return True
        finally:
            self._lock.release()

    def _reopen_locked(self) -> None:
        self._reopen_pending = False
        try:
            fd = self._open()  # open the new file first: if that fails, keep logging to the old one
        except OSError as exc:
            self.last_error = exc
            return
        old, self._fd, self._dangling = self._fd, fd, False
        if old is not None:
            os.close(old)

    def close(self) -> None:
        """Stop writing: later lines are counted in `dropped`. A stream is flushed, not closed."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            elif self._stream is not None:
                try:
                    self._stream.flush()
                except (OSError, ValueError):
                    pass

    def __enter__(self) -> "MergedLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
