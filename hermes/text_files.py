"""A small UTF-8 text file a person named (a system prompt, a message, an API key), read with one
clear line when it cannot be: the callers turn that line into their own usage error."""
from __future__ import annotations

from pathlib import Path


class UnreadableText(ValueError):
    """The file cannot be read, or is not UTF-8 text; the message names the option and the path."""


def read_utf8(path: Path, what: str) -> str:
    """The text of `path`, named `what` (e.g. "--message-file") in the error."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UnreadableText(f"{what} {path}: cannot read it ({exc.strerror or exc})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableText(f"{what} {path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
