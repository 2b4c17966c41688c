"""Tools: what the model may call, how each is dispatched, and how a rerun is allowed.

Every tool declares an effect policy, which decides what recovery may do when a
process died after dispatching it and before its result was durable:

* ``idempotent``: running it again with the same idempotency key has the same effect,
  so recovery reruns it with that key;
* ``at_most_once`` (the default): it must never run twice, so recovery records that
  its outcome is unknown and tells the model to verify.

``parallel_safe`` tools (read-only ones) may run concurrently in one batch.
"""
from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

IDEMPOTENT = "idempotent"
AT_MOST_ONCE = "at_most_once"
POLICIES = (IDEMPOTENT, AT_MOST_ONCE)


@dataclass(frozen=True)
class ToolContext:
    task_id: str | None
    tool_call_id: str | None
    idempotency_key: str | None = None
    session_id: str | None = None
    turn_id: str | None = None


Handler = Callable[[dict[str, Any], ToolContext], str]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    handler: Handler
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    policy: str = AT_MOST_ONCE
    parallel_safe: bool = False
    # Releases whatever the tool holds for one task (processes, temp files) when the turn ends.
    cleanup: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"tool {self.name!r}: policy must be one of {POLICIES}, not {self.policy!r}")

    def definition(self) -> dict[str, Any]:
        return {"type": "function",
                "function": {"name": self.name, "description": self.description,
                             "parameters": self.parameters}}


class ToolRegistry:
    """Tools grouped in named toolsets."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        self._toolsets: dict[str, list[str]] = {}
        self._requirements: dict[str, Callable[[], list[str]]] = {}
        self._lock = threading.Lock()

    def register(self, tool: Tool, toolset: str) -> Tool:
        with self._lock:
            self._tools[tool.name] = tool
            names = self._toolsets.setdefault(toolset, [])
            if tool.name not in names:
                names.append(tool.name)
        return tool

    def require(self, toolset: str, check: Callable[[], list[str]]) -> None:
        """`check()` lists what the toolset still lacks (empty when usable)."""
        self._requirements[toolset] = check

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def toolsets(self) -> list[str]:
        return sorted(self._toolsets)

    def tools_in(self, toolsets: list[str] | None) -> list[Tool]:
        chosen = self.toolsets() if toolsets is None else toolsets
        unknown = [t for t in chosen if t not in self._toolsets]
        if unknown:
            raise ValueError(f"unknown toolset(s) {', '.join(unknown)}; known: {', '.join(self.toolsets())}")
        return [self._tools[n] for t in chosen for n in self._toolsets[t]]

    def policy(self, name: str) -> str:
        tool = self._tools.get(name)
        return tool.policy if tool else AT_MOST_ONCE

    def parallel_safe(self, name: str) -> bool:
        tool = self._tools.get(name)
        return bool(tool and tool.parallel_safe)

    def cleanup_task(self, task_id: str) -> None:
        for tool in list(self._tools.values()):
            if tool.cleanup is not None:
                tool.cleanup(task_id)


registry = ToolRegistry()


def get_tool_definitions(enabled_toolsets: list[str] | None = None) -> list[dict[str, Any]]:
    return [t.definition() for t in registry.tools_in(enabled_toolsets)]


def check_toolset_requirements(enabled_toolsets: list[str] | None = None) -> dict[str, list[str]]:
    """Toolsets that cannot be used yet, with what each lacks."""
    missing = {}
    for name in enabled_toolsets or registry.toolsets():
        check = registry._requirements.get(name)
        lacks = check() if check else []
        if lacks:
            missing[name] = lacks
    return missing


def tool_error(message: str) -> str:
    """A tool result that tells the model its call failed (and why), as JSON."""
    return json.dumps({"error": message}, ensure_ascii=False)


def tool_failure_message(function_name: str, exc: BaseException) -> str:
    """How a tool's own exception is described to the model (wrap it with `tool_error`).

    One home for the wording, so whoever predicts a failing tool's result text (the
    chaos tools' clean-result oracle) agrees with what the dispatcher produces.
    """
    return f"tool {function_name!r} failed: {type(exc).__name__}: {exc}"


def handle_function_call(function_name: str, function_args: dict[str, Any], effective_task_id: str | None,
                         tool_call_id: str | None = None, idempotency_key: str | None = None,
                         session_id: str | None = None, turn_id: str | None = None, **_: Any) -> str:
    """Run one tool and return its result text; a tool's own failure becomes an error result.

    KeyboardInterrupt and other BaseExceptions propagate: they end the turn, not the tool.
    """
    tool = registry.get(function_name)
    if tool is None:
        return tool_error(f"unknown tool {function_name!r}; no such tool is offered")
    ctx = ToolContext(task_id=effective_task_id, tool_call_id=tool_call_id,
                      idempotency_key=idempotency_key, session_id=session_id, turn_id=turn_id)
    try:
        result = tool.handler(function_args, ctx)
    except Exception as exc:  # a tool's bug is reported to the model, not raised into the turn
        return tool_error(tool_failure_message(function_name, exc))
    return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)


# ------------------------------------------------------------------ built-ins
def _workspace_path(relative: str) -> Path:
    root = Path(os.environ.get("HERMES_WORKSPACE", os.getcwd())).resolve()
    path = (root / relative).resolve()
    if path != root and root not in path.parents:
        raise ValueError(f"{relative!r} is outside the workspace {root}")
    return path


def _read_file(args: dict[str, Any], _ctx: ToolContext) -> str:
    path = _workspace_path(str(args["path"]))
    limit = int(args.get("max_bytes", 100_000))
    with open(path, "rb") as fh:
        data = fh.read(limit + 1)
    text = data[:limit].decode("utf-8", "replace")
    return text + ("\n[truncated]" if len(data) > limit else "")


def _list_directory(args: dict[str, Any], _ctx: ToolContext) -> str:
    path = _workspace_path(str(args.get("path", ".")))
    return "\n".join(sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir()))


def _write_file(args: dict[str, Any], _ctx: ToolContext) -> str:
    path = _workspace_path(str(args["path"]))
    content = str(args.get("content", ""))
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(content)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return json.dumps({"written": str(path), "bytes": len(content.encode("utf-8"))})


_PATH_PARAM = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
registry.register(Tool("read_file", "Read a text file of the workspace.", _read_file,
                       _PATH_PARAM, policy=IDEMPOTENT, parallel_safe=True), "files")
registry.register(Tool("list_directory", "List a directory of the workspace.", _list_directory,
                       {"type": "object", "properties": {"path": {"type": "string"}}},
                       policy=IDEMPOTENT, parallel_safe=True), "files")
registry.register(Tool("write_file", "Replace a workspace file's content (same content, same effect).",
                       _write_file,
                       {"type": "object", "properties": {"path": {"type": "string"},
                                                         "content": {"type": "string"}},
                        "required": ["path", "content"]}, policy=IDEMPOTENT), "files")
