"""Generated mode over a user's own tools: conversations whose calls carry arguments drawn from
each tool's JSON schema.

The arguments are drawn from the schema (supervisor.chaos.schema_draws says why from the schema,
and why not with hypothesis-jsonschema). Arguments the schema allows and the tool's own
validation refuses still make a call: its error result is what the tool returns, and is judged
as such.

The shape is the chaos tools' (supervisor.chaos.explore): up to three turns, up to three tool
rounds a turn, one to four calls a round over every usable tool (so blocks mix the declared
policies), texts from the same list, streamed replies, compaction and content parts where the
target takes them. Case i is still Hypothesis's second example of a run seeded from (seed, i),
so a case id and its repro line reproduce, given the same ``--tools``.
"""
from __future__ import annotations

import json
import threading
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from hypothesis import strategies as st

from supervisor.chaos.conversation import Call, Conversation, Step, TurnPlan
from supervisor.chaos.explore import _text, assemble
from supervisor.chaos.schema_draws import Undrawable, strategy

if TYPE_CHECKING:
    from supervisor.chaos.own_tools import ToolSpec

MAX_TURNS = 3
MAX_STEPS = 3
MAX_CALLS = 4
_strategies: dict[str, st.SearchStrategy[dict[str, Any]]] = {}
_lock = threading.Lock()


def arguments(spec: ToolSpec) -> st.SearchStrategy[dict[str, Any]]:
    """The arguments of `spec` as its schema allows them (one strategy per tool, made once)."""
    key = json.dumps([spec.name, spec.parameters], sort_keys=True)
    with _lock:
        if key in _strategies:
            return _strategies[key]
    made = strategy(spec.parameters or {"type": "object"})
    with _lock:
        return _strategies.setdefault(key, made)


def check(spec: ToolSpec, examples: int = 5) -> None:
    """Undrawable unless `spec`'s schema gives objects that are JSON, drawn a few times here first."""
    from hypothesis import HealthCheck, Phase, given, settings

    strategy = arguments(spec)
    problems: list[str] = []

    @settings(max_examples=examples, database=None, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck), phases=(Phase.generate,))
    @given(strategy)
    def sample(value: Any) -> None:
        if not isinstance(value, dict):
            problems.append(f"its schema gives {type(value).__name__} values, not objects of arguments")
            return
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            problems.append(f"a drawn value is not JSON ({exc})")

    try:
        sample()
    except Exception as exc:  # unsatisfiable: the schema's constraints leave nothing to draw
        raise Undrawable(f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}") from None
    if problems:
        raise Undrawable(problems[0])


def undrawable(specs: Collection[ToolSpec]) -> dict[str, str]:
    """tool -> why no arguments can be drawn for it, for each such tool of `specs`."""
    refused = {}
    for spec in specs:
        try:
            check(spec)
        except Undrawable as exc:
            refused[spec.name] = f"no arguments can be drawn from its schema: {exc}"
    return refused


@st.composite
def _call(draw: Any, tools: tuple[ToolSpec, ...]) -> Call:
    spec = draw(st.sampled_from(tools))
    drawn = draw(arguments(spec))
    return Call(spec.name, tuple(sorted(drawn.items())))


@st.composite
def _turn(draw: Any, tools: tuple[ToolSpec, ...], excluded: Collection[str], stream: bool) -> TurnPlan:
    allow_nul = "nul" not in excluded
    steps = []
    for _ in range(draw(st.integers(0, MAX_STEPS))):
        text = _text(draw, allow_nul)
        block = tuple(draw(st.lists(_call(tools), min_size=1, max_size=MAX_CALLS)))
        steps.append(Step(block, text if draw(st.booleans()) else None))
    empty = stream and "empty-streamed-answer" not in excluded and draw(st.integers(0, 5)) == 5
    parts = "list-content" not in excluded and draw(st.integers(0, 3)) == 3
    return TurnPlan(_text(draw, allow_nul), tuple(steps), "" if empty else "ans " + _text(draw, allow_nul), parts)


def undrawn(tools: Collection[ToolSpec]) -> dict[str, str]:
    """The features (supervisor.chaos.conversation.FEATURES) no conversation over `tools` can have,
    each with why: a campaign's coverage shows them as not explorable, not as never reached."""
    kinds = {t.kind for t in tools}
    out = {"tool-error-retry": "only the chaos tools' broken_tool fails on purpose",
           "self-restart": "only the chaos tools' restart_agent kills its own worker",
           "spilled-result": "only the chaos tools' lookup is drawn with a result over the spill limit"}
    if MAX_TURNS < 4:
        out["four-turns"] = f"a conversation over your tools has at most {MAX_TURNS} turns"
    if MAX_CALLS < 5:
        out["block-of-5"] = f"a block over your tools has at most {MAX_CALLS} calls"
    if "at-most-once" not in kinds:
        out["at-most-once"] = "none of your tools is at-most-once"
    if len(kinds) < 2:
        out["mixed-policies"] = "your tools all have one policy"
    if "read-only" not in kinds:
        out["concurrent"] = "none of your tools is read-only, so no block runs concurrently"
        out["segmented"] = "none of your tools is read-only, so no block is split into segments"
    elif kinds == {"read-only"}:
        out["sequential"] = "your tools are all read-only, so every block runs concurrently"
        out["segmented"] = "your tools are all read-only, so no block is split into segments"
    return out


@st.composite
def conversations(draw: Any, tools: tuple[ToolSpec, ...], excluded: Collection[str] = ()) -> Conversation:
    """A conversation over `tools` (every one usable), avoiding the features in `excluded`."""
    return assemble(draw, lambda stream: _turn(tools, excluded, stream), excluded, MAX_TURNS)
