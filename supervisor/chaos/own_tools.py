"""Your own tools on our runtime: ``hermes-supervisor chaos --tools MODULE``.

The module is the one ``serve --tools`` takes (any importable module of ``@tool`` functions, or
toolsets the runtime knows). The campaign loads it as its workers will, reads each tool's
declaration (name, JSON schema, policy, read-only or not) and then:

* every worker of the campaign gets ``--tools MODULE --ledger-tools``: the tools run for real,
  in the case's own directory (working directory; ``HOME``; ``HERMES_HOME`` is the case's agent
  home), and every call goes through the effects ledger with what it returned
  (worker.ledgered_tools), so the checker judges each tool by the policy it declares;
* exhaustive, random and pause modes run one script per tool (`scripts`): a turn calling that
  tool once with the simplest arguments its schema accepts (testkit.script.example_arguments);
* generated mode draws conversations calling the tools with arguments drawn from their JSON
  schemas (supervisor.chaos.own_draws).

A tool whose schema cannot be filled (exhaustive) or drawn (generated) is left out, and said so
up front with the reason (`OwnTools.refused`); a module none of whose tools is usable is refused.
"""
from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from supervisor.chaos.scenarios import Scenario, Turn
from testkit.script import Reply, SchemaUnsupported, ToolCallSpec, example_arguments

if TYPE_CHECKING:
    from collections.abc import Collection

    from supervisor.chaos.config import CampaignConfig
    from supervisor.chaos.explore import Drawn

SCRIPT_PREFIX = "tool-"  # an own tool's script is named after it (supervisor.chaos.conversation knows the names)
READ_ONLY, IDEMPOTENT_KIND, AT_MOST_ONCE_KIND = "read-only", "idempotent", "at-most-once"


class ToolsUnusable(ValueError):
    """The module cannot be crash-tested (not importable, no tools, no usable tool): one line."""


@dataclass(frozen=True)
class ToolSpec:
    """One tool as it declares itself: what the model sees and what recovery may do with it."""

    name: str
    policy: str        # hermes.tools: "idempotent" or "at_most_once"
    parallel_safe: bool
    parameters: dict[str, Any]

    @property
    def kind(self) -> str:
        """How the checker judges it: read-only (reruns free), idempotent (one key), at-most-once."""
        if self.policy == "at_most_once":
            return AT_MOST_ONCE_KIND
        return READ_ONLY if self.parallel_safe else IDEMPOTENT_KIND


@dataclass
class OwnTools:
    module: str
    tools: tuple[ToolSpec, ...]                       # every tool the module offers, in its order
    refused: dict[str, str] = field(default_factory=dict)  # tool -> why it is left out (this mode)

    @property
    def usable(self) -> tuple[ToolSpec, ...]:
        return tuple(t for t in self.tools if t.name not in self.refused)

    def kinds(self) -> dict[str, str]:
        return {t.name: t.kind for t in self.tools}


_loaded: dict[str, OwnTools] = {}
_prepared: dict[tuple[str, str], OwnTools] = {}  # (module, mode) -> its tools, those left out said why
_lock = threading.Lock()


def load(module: str) -> OwnTools:
    """The tools `module` offers (imported in this process, once), every one of them; ToolsUnusable."""
    with _lock:
        if module in _loaded:
            return _loaded[module]
    from hermes.tools import registry
    from worker import chaos_tools
    from worker.targets import load_tools

    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())  # a module of the directory the campaign runs in, as `python -m` finds it
    try:
        toolsets = load_tools(module)
    except ValueError as exc:
        raise ToolsUnusable(f"--tools {module!r}: {exc}") from None
    own = [t for t in toolsets if t != chaos_tools.TOOLSET]
    if not own:
        raise ToolsUnusable(f"--tools {module!r}: only the chaos tools, which every campaign runs without --tools")
    specs = tuple(ToolSpec(t.name, t.policy, t.parallel_safe, dict(t.parameters)) for t in registry.tools_in(own))
    _export_import_path(module)
    found = OwnTools(module, specs)
    with _lock:
        return _loaded.setdefault(module, found)


def adopt(key: str, tools: tuple[ToolSpec, ...]) -> OwnTools:
    """Tools a target read from a user's app (supervisor.chaos.app_tools), not from a module of
    ``@tool`` functions, made known under `key`: `prepare(key, mode)` then takes them as it takes
    a module's."""
    with _lock:
        return _loaded.setdefault(key, OwnTools(key, tools))


def _export_import_path(module: str) -> None:
    """Put the directory the module was imported from on the workers' import path (they run in
    their case's directory, where it is not); the worker pool passes this process's environment on."""
    roots = []
    for name in (n.strip() for n in module.split(",") if n.strip()):
        origin = getattr(sys.modules.get(name.partition(".")[0]), "__file__", None)
        if origin:
            folder = Path(origin).resolve().parent
            roots.append(str(folder.parent if Path(origin).name == "__init__.py" else folder))
    known = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    missing = [r for r in dict.fromkeys(roots) if r not in known]
    if missing:
        os.environ["PYTHONPATH"] = os.pathsep.join([*known, *missing])


def prepare(module: str, mode: str) -> OwnTools:
    """Load `module` for a campaign in `mode`: its tools, with those the mode cannot call left out
    (and why); its scripts registered (not in generated mode). ToolsUnusable when none is usable."""
    from supervisor.chaos.conversation import register_script, set_tool_kinds

    with _lock:
        if (module, mode) in _prepared:
            return _prepared[(module, mode)]
    loaded = load(module)
    own = OwnTools(loaded.module, loaded.tools)
    if mode == "generated":
        from supervisor.chaos.own_draws import undrawable

        own.refused = undrawable(own.tools)
    else:
        for spec in own.tools:
            try:
                example_arguments(spec.parameters)
            except SchemaUnsupported as exc:
                own.refused[spec.name] = f"no arguments can be made for its schema with certainty: it needs {exc}"
    if not own.usable:
        reasons = "; ".join(f"{name}: {why}" for name, why in own.refused.items())
        raise ToolsUnusable(f"--tools {module!r}: no tool can be called ({reasons})")
    set_tool_kinds(own.kinds())
    if mode != "generated":
        for scenario in scripts(own):
            register_script(scenario)
    with _lock:
        return _prepared.setdefault((module, mode), own)


def draw_case(campaign_seed: int, index: int, module: str, excluded: Collection[str] = (),
              kill_modes: tuple[str, ...] = ("self",)) -> Drawn:
    """Generated mode's case `index` over the usable tools of `module` (supervisor.chaos.explore
    draws it, its conversation from supervisor.chaos.own_draws)."""
    from supervisor.chaos import explore, own_draws

    talk = own_draws.conversations(prepare(module, "generated").usable, tuple(sorted(excluded)))
    return explore.draw(campaign_seed, index, excluded, kill_modes, talk=talk)


def scripts(own: OwnTools) -> list[Scenario]:
    """One script per usable tool: a turn that calls it once with `example_arguments`, then answers."""
    out = []
    for spec in own.usable:
        name = SCRIPT_PREFIX + spec.name
        call = ToolCallSpec(spec.name, example_arguments(spec.parameters))
        out.append(Scenario(name, f"{own.module}: one call of {spec.name} ({spec.kind})", (
            Turn(f"[{name}] please use {spec.name}", (Reply(None, (call,)), Reply(f"{spec.name} was called."))),)))
    return out


def script_names(own: OwnTools) -> list[str]:
    return [SCRIPT_PREFIX + t.name for t in own.usable]


def worker_args(config: CampaignConfig) -> list[str]:
    """What every worker of a campaign with ``--tools`` is given besides the usual."""
    module = getattr(config, "tools", None)
    return ["--tools", module, "--ledger-tools"] if module else []


def repro_flags(config: CampaignConfig) -> list[str]:
    module = getattr(config, "tools", None)
    return [f"--tools {module}"] if module else []


def describe(own: OwnTools) -> list[str]:
    """The lines a campaign prints up front: each tool with how it is judged, and what is left out."""
    lines = [f"--tools {own.module}: " + ", ".join(f"{t.name} ({t.kind})" for t in own.usable)]
    lines += [f"--tools {own.module}: {name} left out: {why}" for name, why in own.refused.items()]
    return lines


def record(own: OwnTools) -> dict[str, Any]:
    """What report.json says of the tools (`"own_tools"`)."""
    return {"module": own.module, "tools": {t.name: t.kind for t in own.usable}, "left_out": dict(own.refused)}
