"""The API token: kept in `<db>.token` (0600, made at the first start with HTTP, reused after), and
checked in front of the router for every path but `OPEN_PATHS`, so a route added later is guarded
without asking."""
from __future__ import annotations

import hmac
import os
import re
import secrets
from pathlib import Path
from typing import Any, Callable

from hermes.private_files import replace_file_durably
from supervisor.daemon.http.parsing import json_response
from supervisor.daemon.log import info, warn

OPEN_PATHS = frozenset({"/healthz"})  # the only paths served without the token
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="hermes"'}
_TOKEN = re.compile(r"[A-Za-z0-9_-]{32,256}")


def token_path(db_path: Path) -> Path:
    return Path(f"{db_path}.token")


def load_token(db_path: Path) -> str:
    """The API token of `db_path`'s daemon: read from `<db>.token`, or made (0600, fsynced) if absent or unusable."""
    path = token_path(db_path)
    try:
        st = os.stat(path)
        text = path.read_text(encoding="ascii", errors="replace").strip()
    except FileNotFoundError:
        text, st = "", None
    if st is not None and _TOKEN.fullmatch(text):
        if st.st_mode & 0o077:
            os.chmod(path, 0o600)
            warn("the API token file was readable by others; narrowed to 0600", path=str(path))
        return text
    token = secrets.token_urlsafe(32)
    replace_file_durably(path, token + "\n")  # clients keep it: a power cut must not change it under them
    info("created the HTTP API token", path=str(path))
    return token


def refusal(token: str, authorization: str) -> str | None:
    """Why a request with this Authorization header is refused by a daemon whose token is `token` (None: it is not)."""
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return "missing Authorization: Bearer <token> (the token is in the daemon's .token file)"
    if not hmac.compare_digest(given.strip().encode("utf-8", "replace"), token.encode("ascii")):
        return "wrong token"
    return None


class TokenCheck:
    """ASGI middleware: every request but those of OPEN_PATHS needs the token (401 otherwise).
    `token` is asked for at each request: the server knows it only once it starts."""

    def __init__(self, app: Any, token: Callable[[], str]) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            authorization = ""
            for name, value in scope["headers"]:
                if name == b"authorization":
                    authorization = value.decode("latin-1")
                    break
            problem = refusal(self.token(), authorization)
            if problem is not None:
                response = json_response({"error": problem}, 401, dict(CHALLENGE))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
