"""Test only: a logging handler that keeps every record's text (with its traceback), to assert on."""
from __future__ import annotations

import logging


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
