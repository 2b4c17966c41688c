"""The daemon's own log: text or JSON lines, to stderr or to a file that SIGHUP reopens.

Every record may carry fields (`info("leased turn", session=..., turn=...)`), printed as
``key=value`` after the message, or as keys of the JSON line.
"""
from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from hermes.json_logs import JsonLines
from hermes.private_files import open_private

log = logging.getLogger("hermes.daemon")


class _TextLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = dict(getattr(record, "fields", {}) or {})
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(record.created))
        extra = "".join(f" {k}={v}" for k, v in fields.items())
        text = f"{stamp} {record.levelname.lower():7} {record.getMessage()}{extra}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class ReopenableFile(logging.StreamHandler):
    """Appends to a 0600 file; `reopen()` (on SIGHUP) starts writing to whatever file now has the name."""

    def __init__(self, path: Path) -> None:
        self.path = path
        super().__init__(self._open())

    def _open(self) -> Any:
        return open_private(self.path, "a", encoding="utf-8", buffering=1)

    def reopen(self) -> None:
        self.acquire()
        try:
            old, self.stream = self.stream, self._open()
            old.close()
        finally:
            self.release()


def setup_logging(json_logs: bool, log_file: Path | None, level: str = "info") -> logging.Handler:
    handler: logging.Handler = ReopenableFile(log_file) if log_file else logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines() if json_logs else _TextLines())
    log.handlers[:] = [handler]
    log.setLevel(level.upper())
    log.propagate = False
    return handler


def info(msg: str, **fields: Any) -> None:
    log.info(msg, extra={"fields": fields})


def warn(msg: str, **fields: Any) -> None:
    log.warning(msg, extra={"fields": fields})


def worker_line(text: str, pid: int, session: str | None, turn: str | None) -> None:
    """A line of a worker's stderr, into the daemon's log: a JSON record at its own level (debug
    unless it warns or errs), anything else as a warning quoting it."""
    try:
        record = json.loads(text)
    except ValueError:
        record = None
    if not isinstance(record, dict):
        log.warning("worker stderr: %s", text, extra={"fields": {"worker_pid": pid}})
        return
    level = {"warning": logging.WARNING, "error": logging.ERROR, "critical": logging.ERROR}.get(
        str(record.get("level")), logging.DEBUG)
    if log.isEnabledFor(level):
        log.log(level, "worker: %s", record.get("msg"), extra={"fields": {
            "worker_pid": pid, "session": session, "turn": turn}})
