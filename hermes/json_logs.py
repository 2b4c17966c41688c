"""Log records as JSON lines: one object per record, for a supervisor to merge and a person to filter."""
from __future__ import annotations

import json
import logging
from typing import Any, Mapping


class JsonLines(logging.Formatter):
    """``{"ts", "level", "logger", "msg", ...fields}`` plus ``"exc"`` when the record carries one.

    `fields` tag every line of this process (e.g. worker, pid, incarnation); a record's own
    ``fields`` (``log.info(msg, extra={"fields": {...}})``) follow them.
    """

    def __init__(self, fields: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.fields = dict(fields or {})

    def format(self, record: logging.LogRecord) -> str:
        line = {"ts": round(record.created, 6), "level": record.levelname.lower(), "logger": record.name,
                "msg": record.getMessage(), **self.fields, **(getattr(record, "fields", None) or {})}
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)
