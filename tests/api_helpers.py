"""Test only, for the HTTP API's tests on both engines: a logging handler that keeps every record's text
(with its traceback), and a feed read to its end."""
from __future__ import annotations

import logging
from typing import Any


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + logging.Formatter().formatException(record.exc_info)
        self.lines.append(text)

    def text(self) -> str:
        return "\n".join(self.lines)


def drain(feed: Any) -> list[Any]:
    """Every event `feed` (a SessionFeed) has now, poll after poll until one brings none."""
    out: list[Any] = []
    while True:
        batch = feed.poll()
        if not batch:
            return out
        out += batch
