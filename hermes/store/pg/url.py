"""A PostgreSQL URL as libpq reads it, for what we do with its password: hand it to a child
process apart from the URL, keep it out of every message.

libpq's URI rules (`postgresql://[user[:password]@][host][:port][/dbname][?param=value&...]`):
the user information runs up to the first '@' before any '/'; the password is what follows its
first ':'; user, password, and each query parameter's name and value are percent-decoded, and
'+' is a plus sign, not a space (libpq is not an HTML form). A '%' not followed by two hex digits,
or '%00', is an error, which libpq words by quoting the whole value: `check` finds it first and
says where it is without the value, so no password ever reaches a message through one.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from hermes.store.errors import StorageError

_PREFIXES = ("postgresql://", "postgres://")
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})|%00")
HIDDEN = "***"


class MalformedUrl(StorageError, ValueError):
    """A PostgreSQL URL libpq would refuse; the message never quotes the URL's password."""


@dataclass(frozen=True)
class _Parts:
    """Where a URL's pieces are, as (start, end) offsets into it, so the rest is kept as written."""
    userinfo: tuple[int, int] | None   # user[:password], without the '@'
    password: tuple[int, int] | None   # the password in the user information, without the ':'
    params: list[tuple[int, int, str]]  # each query parameter: its span (without '&'), its decoded name


def _parts(url: str) -> _Parts:
    prefix = next((p for p in _PREFIXES if url.startswith(p)), None)
    start = len(prefix) if prefix else 0
    end = start
    while end < len(url) and url[end] not in "@/":
        end += 1
    userinfo = password = None
    if end < len(url) and url[end] == "@":
        userinfo = (start, end)
        colon = url.find(":", start, end)
        if colon >= 0:
            password = (colon + 1, end)
    params = []
    query = url.find("?", userinfo[1] if userinfo else start)
    if query >= 0:
        offset = query + 1
        for piece in url[query + 1:].split("&"):
            name = piece.partition("=")[0]
            params.append((offset, offset + len(piece), _decode(name) if not _BAD_PERCENT.search(name) else name))
            offset += len(piece) + 1
    return _Parts(userinfo, password, params)


def _decode(text: str) -> str:
    """Percent-decoding as libpq does it ('+' stays '+'); bytes that are not UTF-8 kept as surrogates,
    so the password reaches libpq byte for byte through the environment."""
    out = bytearray()
    i = 0
    while i < len(text):
        if text[i] == "%":
            out.append(int(text[i + 1:i + 3], 16))
            i += 3
        else:
            out += text[i].encode("utf-8", "surrogateescape")
            i += 1
    return out.decode("utf-8", "surrogateescape")


def check(url: str) -> str:
    """`url`, unless libpq would refuse its percent-encoding: then MalformedUrl, naming the part."""
    parts = _parts(url)
    secret = [parts.password] + [(s, e) for s, e, name in parts.params if name.lower() == "password"]
    for span in secret:
        if span is not None and _BAD_PERCENT.search(url, span[0], span[1]):
            raise MalformedUrl("the PostgreSQL URL's password is not valid percent-encoding (a '%' must be "
                               "followed by two hex digits, and %00 is refused); write '%' itself as %25")
    if _BAD_PERCENT.search(url):
        raise MalformedUrl(f"{redact(url)}: not valid percent-encoding (a '%' must be followed by two hex "
                           "digits, and %00 is refused); write '%' itself as %25")
    return url


def _password_spans(url: str) -> list[tuple[int, int]]:
    """The spans of the password's text: in the user information, and each `password=` parameter's value."""
    parts = _parts(url)
    spans = [parts.password] if parts.password is not None else []
    for start, end, name in parts.params:
        if name.lower() == "password":
            spans.append((url.index("=", start, end) + 1 if "=" in url[start:end] else end, end))
    return spans


def redact(url: str) -> str:
    """`url` with its password (in the user part or as a ``password`` parameter) replaced, for messages."""
    for start, end in sorted(_password_spans(url), reverse=True):
        url = url[:start] + HIDDEN + url[end:]
    return url


def passwords(url: str) -> list[str]:
    """Every password `url` holds, as written and as decoded: what must never be printed."""
    found = []
    for start, end in _password_spans(url):
        raw = url[start:end]
        found.append(raw)
        if not _BAD_PERCENT.search(raw):
            found.append(_decode(raw))
    return sorted({p for p in found if p}, key=len, reverse=True)


def hide(text: str, url: str) -> str:
    """`text` (an error's message) with any password of `url` in it replaced."""
    for secret in passwords(url):
        text = text.replace(secret, HIDDEN)
    return text


def split_password(url: str) -> tuple[str, str | None]:
    """(`url` without its password, the password libpq would use, decoded, or None): a child process
    gets the URL on its command line and the password in its environment (PGPASSWORD, which libpq
    reads), never in argv. Everything else of the URL is kept as written. MalformedUrl as `check`."""
    check(url)
    parts = _parts(url)
    password = None
    cut: list[tuple[int, int]] = []
    if parts.password is not None:
        password = _decode(url[parts.password[0]:parts.password[1]])
        cut.append((parts.password[0] - 1, parts.password[1]))  # with its ':'
    kept = []
    for start, end, name in parts.params:
        if name == "password":  # libpq's keywords are case-sensitive; a later one wins, as in libpq
            password = _decode(url[start:end].partition("=")[2])
        else:
            kept.append(url[start:end])
    query = url.find("?", parts.userinfo[1] if parts.userinfo else 0) if parts.params else -1
    head = url if query < 0 else url[:query]
    for start, end in sorted(cut, reverse=True):
        head = head[:start] + head[end:]
    return head + (f"?{'&'.join(kept)}" if kept else ""), password
