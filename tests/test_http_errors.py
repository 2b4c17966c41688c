"""Every error the HTTP API answers is a JSON object {"error": ...}: ours, and those starlette makes
on its own (an unknown path, a method a path does not take), which it words in plain text."""
from __future__ import annotations

import http.client
import json
import types
from pathlib import Path
from typing import Iterator

import pytest

from hermes.state import SessionDB

pytest.importorskip("starlette", reason="the HTTP API needs the http extra")


@pytest.fixture
def api(tmp_path: Path) -> Iterator[object]:
    from supervisor.daemon.http import HttpApi
    from supervisor.daemon.metrics import DaemonMetrics

    db = tmp_path / "state.db"
    SessionDB(db).close()
    daemon = types.SimpleNamespace(db_path=db, config=types.SimpleNamespace(synchronous="FULL", workers=1),
                                   wake=lambda: None, metrics=DaemonMetrics(), totals={}, leases={}, state="running")
    server = HttpApi(daemon, "127.0.0.1", 0)  # type: ignore[arg-type]
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _ask(server: object, method: str, path: str, token: bool = True) -> tuple[int, str, dict[str, str], bytes]:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)  # type: ignore[attr-defined]
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        headers = {"Authorization": f"Bearer {server.token}"} if token else {}  # type: ignore[attr-defined]
        conn.request(method, path, headers=headers)
        response = conn.getresponse()
        return response.status, response.getheader("content-type") or "", dict(response.getheaders()), response.read()
    finally:
        conn.close()


@pytest.mark.parametrize("method, path, status", [
    ("GET", "/v1/no-such-route", 404),
    ("GET", "/metrics/x", 404),
    ("DELETE", "/v1/turns/t-1", 405),
    ("PUT", "/v1/sessions/s/turns", 405),
    ("GET", "/v1/turns/t-1", 404),                  # ours, for comparison
])
def test_every_error_is_json(api: object, method: str, path: str, status: int) -> None:
    got, kind, headers, body = _ask(api, method, path)
    assert got == status, (got, body)
    assert kind.startswith("application/json"), (kind, body)
    assert isinstance(json.loads(body)["error"], str) and json.loads(body)["error"]
    if status == 405:
        assert "allow" in {k.lower() for k in headers}


def test_without_the_token_an_unknown_path_is_still_401_json(api: object) -> None:
    got, kind, _headers, body = _ask(api, "GET", "/v1/no-such-route", token=False)
    assert got == 401 and kind.startswith("application/json") and "error" in json.loads(body)
