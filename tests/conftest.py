"""Fixtures shared by the hermes unit tests: real SQLite files, a probe recorder, a model server,
`serve` processes, and the scripts under scripts/ as modules."""
from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest

import hermes.runner
from hermes import probes
from hermes.state import SessionDB
from testkit.modelserver import Script, ScriptedModelServer

if TYPE_CHECKING:
    from daemon_helpers.harness import Daemons

REPO = Path(__file__).resolve().parents[1]


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked `upstream` needs hermes-agent (`./scripts/test` runs these in .venv-upstream).
    Without it the test is skipped with the reason, except in CI (CI=true), where it fails: there a
    missing hermes-agent is a broken environment, and must not pass as a quiet skip."""
    if item.get_closest_marker("upstream") is None:
        return
    from worker.targets import hermes_agent

    if hermes_agent.TARGET.available():
        return
    why = (f"hermes-agent is not installed in this environment ({sys.prefix}): {hermes_agent.TARGET.install_hint}. "
           "./scripts/test runs the tests marked `upstream` in .venv-upstream, which scripts/setup makes")
    if _in_ci():
        pytest.fail(f"CI=true and {why}", pytrace=False)
    pytest.skip(why)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked `chaos` first, each group in its collected order. They are the long ones
    (real processes killed and restarted): started first, they spread over the xdist workers, and
    the many short in-process tests fill the gaps they leave instead of a long test starting last
    and running alone. The order is the same in every worker, as xdist requires."""
    items.sort(key=lambda item: item.get_closest_marker("chaos") is None)


@pytest.fixture(autouse=True)
def _loopback_traffic_bypasses_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")


@pytest.fixture
def agent_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where agents built in this test keep spilled results and trajectories."""
    home = tmp_path / "agent-home"
    monkeypatch.setattr(hermes.runner, "_hermes_home", home)
    return home


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state.db"


@pytest.fixture
def db(db_path: Path) -> Iterator[SessionDB]:
    handle = SessionDB(db_path)
    yield handle
    handle.close()


@pytest.fixture
def durable(db_path: Path) -> Callable[[str], list[dict[str, Any]]]:
    """Read a session's active transcript through a second, independent connection."""

    def read(session_id: str) -> list[dict[str, Any]]:
        with SessionDB(db_path) as other:
            return other.get_messages_as_conversation(session_id)

    return read


class ProbeRecorder:
    """Records every probe hit; `on(name, fn)` also runs `fn(context)` at that point."""

    def __init__(self) -> None:
        self.hits: list[tuple[str, dict[str, Any]]] = []
        self.reactions: dict[str, list[Callable[[dict[str, Any]], None]]] = {}

    def __call__(self, name: str, context: dict[str, Any]) -> None:
        self.hits.append((name, dict(context)))
        for react in self.reactions.get(name, ()):
            react(context)

    def on(self, name: str, react: Callable[[dict[str, Any]], None]) -> None:
        self.reactions.setdefault(name, []).append(react)

    def names(self) -> list[str]:
        return [name for name, _ in self.hits]

    def count(self, name: str) -> int:
        return self.names().count(name)


@pytest.fixture
def recorder() -> Iterator[ProbeRecorder]:
    rec = ProbeRecorder()
    previous = probes.install(rec)
    yield rec
    probes.install(previous)


@pytest.fixture
def serve() -> Iterator[Callable[..., ScriptedModelServer]]:
    """Start a ScriptedModelServer for a script; every server started is stopped at teardown."""
    started: list[ScriptedModelServer] = []

    def start(script: Script, **kwargs: Any) -> ScriptedModelServer:
        server = ScriptedModelServer(script, **kwargs).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Daemons]:
    """Start `serve` processes; each, with every process it started, is killed by recorded pid at the end."""
    from daemon_helpers.harness import Daemons  # here: only the tests that run a daemon load the harness

    started = Daemons(tmp_path)
    try:
        yield started
    finally:
        started.cleanup()


@pytest.fixture
def load_script() -> Callable[[str], ModuleType]:
    """`load_script("soak")` imports scripts/soak.py (the scripts are no package) as module `hermes_soak`."""

    def load(name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(f"hermes_{name}", REPO / "scripts" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up by name
        spec.loader.exec_module(module)
        return module

    return load
