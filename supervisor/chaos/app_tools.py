"""A user's own app as the campaign's workload: ``--target langgraph --target-option app=MODULE:build``,
``--target openai-agents --target-option agent=MODULE:agent``.

The target reads the app's tools (`targetkit.Target.own_app_tools`: name, description, the JSON
schema its model is offered, the policy declared for it) in this process, once; they are then
made known to the campaign as a user's own tools are with ``--tools``
(supervisor.chaos.own_tools, under a key naming the target and the app), so that every mode
works the same way: exhaustive, random and pause run one script per tool, generated mode draws
conversations calling them with arguments drawn from their schemas. The workers run the app
itself, its tools wrapped by the target's adapter (the effects ledger, the dispatch probes).

The app's module is imported from the import path: the directory the campaign runs in, or
``PYTHONPATH``; that directory is put on the workers' import path too (they run in their case's
directory).
"""
from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from targetkit import registry

if TYPE_CHECKING:
    from supervisor.chaos.config import CampaignConfig
    from supervisor.chaos.own_tools import OwnTools

KEY_PREFIX = "app:"
_keys: dict[tuple[str, tuple[tuple[str, str], ...]], str | None] = {}
_lock = threading.Lock()


class AppUnusable(ValueError):
    """The app the options name cannot be crash-tested (one line)."""


def _app_option(options: Mapping[str, str]) -> str | None:
    for key in ("app", "agent"):
        if options.get(key):
            return options[key]
    return None


def key(target: str, options: Mapping[str, str] | tuple[tuple[str, str], ...]) -> str | None:
    """The own-tools key of the app `options` name on `target` (its tools made known under it, once
    per process), or None when they name none. AppUnusable when the app cannot be used."""
    given = tuple(sorted(dict(options).items()))
    with _lock:
        if (target, given) in _keys:
            return _keys[(target, given)]
    found = registry.get(target)
    app = _app_option(dict(given))
    if app is not None:
        _export_import_path()
    try:
        tools = found.own_app_tools(dict(given))
    except ValueError as exc:
        raise AppUnusable(str(exc)) from None
    name = None
    if tools is not None:
        from supervisor.chaos.own_tools import ToolSpec, adopt

        name = f"{KEY_PREFIX}{target}:{app}"
        specs = tuple(ToolSpec(t["name"], "at_most_once" if t["policy"] == "at_most_once" else "idempotent",
                               t["policy"] == "read_only", dict(t["parameters"])) for t in tools)
        adopt(name, specs)
    with _lock:
        return _keys.setdefault((target, given), name)


def for_config(config: CampaignConfig) -> str | None:
    """`key` of a campaign's target and options (None for a campaign of the target's own agent)."""
    return key(config.target, tuple(getattr(config, "target_options", ())))


def prepare(target: str, options: Mapping[str, str], mode: str) -> OwnTools | None:
    """The app's tools for a campaign in `mode` (supervisor.chaos.own_tools.prepare), or None when
    the options name no app. AppUnusable (a ValueError) when none of them can be called."""
    name = key(target, options)
    if name is None:
        return None
    from supervisor.chaos.own_tools import ToolsUnusable
    from supervisor.chaos.own_tools import prepare as prepare_tools

    try:
        return prepare_tools(name, mode)
    except ToolsUnusable as exc:
        raise AppUnusable(str(exc)) from None


def _export_import_path() -> None:
    """The campaign's directory on the workers' import path, as the app was found from it here
    (`python -m` puts it first); the worker pool passes this process's environment on."""
    here = os.getcwd()
    if here not in sys.path:
        sys.path.append(here)
    known = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if here not in known and Path(here).is_dir():
        os.environ["PYTHONPATH"] = os.pathsep.join([*known, here])


def describe(own: OwnTools, target: str, options: Mapping[str, str]) -> list[str]:
    """The lines a campaign prints up front: each tool with how it is judged, and what is left out."""
    app = _app_option(options)
    lines = [f"--target {target} {app}: " + ", ".join(f"{t.name} ({t.kind})" for t in own.usable)]
    lines += [f"--target {target} {app}: {name} left out: {why}" for name, why in own.refused.items()]
    return lines


def record(own: OwnTools, options: Mapping[str, str]) -> dict[str, Any]:
    """What report.json says of the app's tools (`"own_tools"`)."""
    return {"app": _app_option(options), "tools": {t.name: t.kind for t in own.usable}, "left_out": dict(own.refused)}
