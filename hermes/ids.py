"""Identifiers that cross a trust boundary: one rule for a session id, checked where one enters.

A session id names a directory (spilled tool results live under
``$HERMES_HOME/tool_results/<session>/``), a log field and a database key, and it arrives
from command lines, a daemon's inbox and HTTP requests. So every entry point checks it
with ``validate_session_id`` before using it.
"""
from __future__ import annotations

import argparse
import re

SESSION_ID_MAX_LEN = 128
SESSION_ID_ALPHABET = "ASCII letters, digits, '.', '_', ':' and '-'"
_SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


def validate_session_id(value: object) -> str:
    """Return `value` unchanged if it is a safe session id; raise ValueError saying why not.

    The rule: 1 to 128 characters of ASCII letters, digits, ``.``, ``_``, ``:`` and ``-``,
    the first one a letter or a digit (as the regular expression
    ``^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`` matched against the whole string).

    So an id is always one plain path component: never empty, never ``.`` or ``..``, never
    hidden (no leading dot), and it never holds ``/``, ``\\``, NUL, whitespace, other
    control characters or non-ASCII letters that could look like another id. Nothing is
    normalized or trimmed: an id that breaks the rule is refused, not repaired.
    """
    if not isinstance(value, str):
        raise ValueError(f"a session id must be a string, not {type(value).__name__}")
    if not value:
        raise ValueError("a session id must not be empty")
    shown = repr(value if len(value) <= 40 else value[:40] + "...")
    if len(value) > SESSION_ID_MAX_LEN:
        raise ValueError(f"session id {shown} is {len(value)} characters long; at most {SESSION_ID_MAX_LEN} "
                         "are allowed")
    if _SESSION_ID.fullmatch(value) is None:
        bad = next((c for c in value if not (c.isascii() and (c.isalnum() or c in "._:-"))), None)
        why = (f"holds {bad!r}, which is not allowed" if bad is not None
               else "must start with a letter or a digit")
        raise ValueError(f"session id {shown} {why}: use 1 to {SESSION_ID_MAX_LEN} of {SESSION_ID_ALPHABET}, "
                         "starting with a letter or a digit")
    return value


def session_id_argument(value: str) -> str:
    """`validate_session_id` as an argparse type, for every command line that takes a session id."""
    try:
        return validate_session_id(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
