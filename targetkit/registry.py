"""Which targets exist: every entry point of the group `hermes_supervisor.targets` (importlib.metadata).

An entry point names a `targetkit.Target` (``my-agent = my_agent_target:TARGET``); installing the
package that declares it adds ``--target my-agent`` to the supervisor and the worker, with no edit
here. This project registers its own four the same way (pyproject.toml); `BUILTIN` holds the same
four for a checkout run without being installed (a drift test keeps the two alike).
"""
from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from functools import lru_cache
from importlib.metadata import entry_points

from targetkit.schema import SchemaReader
from targetkit.target import Target, load

GROUP = "hermes_supervisor.targets"
DEFAULT = "hermes"
BUILTIN = {
    "hermes": "worker.targets.hermes:TARGET",
    "hermes-agent": "worker.targets.hermes_agent:TARGET",
    "openai-agents": "worker.targets.openai_agents:TARGET",
    "langgraph": "worker.targets.langgraph:TARGET",
}


class UnknownTarget(LookupError):
    """A name no installed target has, or a target whose entry point does not load (one line)."""


def plugins(group: str, builtin: Mapping[str, str]) -> dict[str, str]:
    """name -> "module:attribute" of every entry point of `group`, over `builtin` (ours, for a
    checkout run without being installed)."""
    return {**builtin, **{ep.name: ep.value for ep in entry_points(group=group)}}


def _load(name: str, value: str) -> Target:
    try:
        target = load(value if ":" in value else f"{value}:TARGET")
    except (ImportError, AttributeError) as exc:
        raise UnknownTarget(f"target {name!r} ({value}) does not load: {exc}") from exc
    if not isinstance(target, Target):
        raise UnknownTarget(f"target {name!r} ({value}) is a {type(target).__name__}, not a targetkit.Target")
    if target.name != name:
        raise UnknownTarget(f"the entry point {name!r} ({value}) names a target called {target.name!r}")
    return target


@lru_cache(maxsize=1)
def declared() -> dict[str, str]:
    """name -> "module:attribute" of every target: the entry points, and ours where they are not installed."""
    return plugins(GROUP, BUILTIN)


def names() -> tuple[str, ...]:
    """Every target's name, ours first."""
    return (*BUILTIN, *sorted(set(declared()) - set(BUILTIN)))


@lru_cache(maxsize=None)
def get(name: str) -> Target:
    """The target called `name` (its module imported); UnknownTarget says which exist."""
    value = declared().get(name)
    if value is None:
        raise UnknownTarget(f"unknown target {name!r}; known: {', '.join(names())} (a target from another package "
                            f"is found once that package is installed: entry point group {GROUP})")
    return _load(name, value)


def all_targets() -> dict[str, Target]:
    """Every target that loads, by name, ours first (one that does not load is left out)."""
    out = {}
    for name in names():
        try:
            out[name] = get(name)
        except UnknownTarget:
            continue
    return out


def schema_of(conn: sqlite3.Connection) -> SchemaReader:
    """The reader of the first target whose schema the database is in; ours when none says so
    (a file with no tables yet reads as ours: empty)."""
    for target in all_targets().values():
        reader = target.reader()
        if reader.recognizes(conn):
            return reader
    return get(DEFAULT).reader()
