"""How a user's own tool says what a rerun of it costs, when the harness wraps it (a LangGraph
graph's tools, an Agents SDK agent's function tools; docs/targets.md, Your LangGraph graph).

Three policies, as the effects ledger and the checker know them:

- ``idempotent``: running a call again does no more harm than running it once;
- ``at_most_once``: a call must never run twice (a note appended, a message sent);
- ``read_only``: it changes nothing, so it may rerun freely.

A tool declares one with the `tool_policy` decorator (on the function, before or after the
framework's own decorator), or the campaign declares it for the tool
(``--target-option policies=TOOL:POLICY,...``, which wins). A tool declared neither way is
judged ``at_most_once``: the conservative reading, since the harness cannot know that running
it twice is harmless.
"""
from __future__ import annotations

from typing import Any, Callable, TypeVar

from targetkit.target import POLICY_NAMES, OptionError, parse_policies

T = TypeVar("T")
UNDECLARED = "at_most_once"      # the policy of a tool that declares none
ATTRIBUTE = "__hermes_policy__"  # where `tool_policy` leaves it on a function or tool object
METADATA_KEY = "hermes_policy"   # ... and on a langchain-core tool, whose fields are fixed: in its metadata


def tool_policy(policy: str) -> Callable[[T], T]:
    """Declare what a rerun of the decorated tool costs: ``idempotent``, ``at_most_once`` or ``read_only``.

    ``@tool_policy("idempotent")`` over ``@tool`` (langchain-core) or ``@function_tool`` (the Agents
    SDK), or under them on the plain function: the tool is returned unchanged but for the mark."""
    if policy not in POLICY_NAMES:
        raise ValueError(f"a tool policy is one of {', '.join(POLICY_NAMES)}, not {policy!r}")

    def mark(obj: T) -> T:
        metadata = getattr(obj, "metadata", None)
        if isinstance(metadata, dict) or (metadata is None and hasattr(type(obj), "model_fields")
                                          and "metadata" in type(obj).model_fields):
            # A pydantic tool (langchain-core) takes no new attribute: its metadata field carries it.
            obj.metadata = {**(metadata or {}), METADATA_KEY: policy}  # type: ignore[attr-defined]
        else:
            setattr(obj, ATTRIBUTE, policy)
        return obj

    return mark


def declared_policy(tool: Any) -> str | None:
    """The policy `tool` (or the function behind it) declares with `tool_policy`, or None."""
    metadata = getattr(tool, "metadata", None)
    if isinstance(metadata, dict) and metadata.get(METADATA_KEY) in POLICY_NAMES:
        return str(metadata[METADATA_KEY])
    for obj in (tool, getattr(tool, "func", None), getattr(tool, "coroutine", None)):
        found = getattr(obj, ATTRIBUTE, None) if obj is not None else None
        if found in POLICY_NAMES:
            return str(found)
    return None


def resolve(names: list[str], tools: dict[str, Any], option: str) -> dict[str, str]:
    """tool -> policy for each of `names`: the option's declaration (``TOOL:POLICY,...``) first, then
    the tool's own mark, else UNDECLARED. OptionError when the option names a tool that is not there."""
    given = parse_policies(option)
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise OptionError(f"policies names {', '.join(unknown)}, which the app does not offer "
                          f"(its tools: {', '.join(names) or 'none'})")
    return {name: given.get(name) or declared_policy(tools.get(name)) or UNDECLARED for name in names}
