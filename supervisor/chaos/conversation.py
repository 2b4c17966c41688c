"""A drawn conversation: what generated mode explores instead of the seven scripts.

A `Conversation` is data: its turns, each a user message (text, or a list of content parts)
and the model's replies to it (tool rounds, then the answer), and whether replies stream and
when older turns are compacted. It says nothing of kills; those are drawn apart
(supervisor.chaos.explore) and resolved against its fault-free run.

A conversation is named by a hash of its content (`gen-` and 12 hex digits), so the same
conversation has the same name in every process and every report, and a name that parses is
never confused with a script's. Running it needs a `Scenario` (supervisor.chaos.scenarios):
`scenario()` tags every message with the name (one model server answers all conversations at
once) and with its turn, so two turns never share a message unless the conversation repeats one.

`features()` names what a conversation exercises, and `FEATURES` says what each name means:
the coverage a report shows (supervisor.chaos.coverage).
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from supervisor.chaos.scenarios import SCENARIOS, Scenario, Turn, spills
from testkit.script import Reply, ToolCallSpec

GENERATED_PREFIX = "gen-"
_NAME = re.compile(r"gen-[0-9a-f]{12}")

# What a conversation can exercise, by the name the coverage table shows.
FEATURES: dict[str, str] = {
    "multi-turn": "two or more turns",
    "four-turns": "four or more turns, each with the growing history of the ones before",
    "multi-step": "a turn with two or more tool rounds",
    "block-of-3": "a tool block of three or more calls",
    "block-of-5": "a tool block of five or more calls",
    "mixed-policies": "a block mixing effect policies (read-only, idempotent write, at-most-once)",
    "sequential": "a block run one call at a time",
    "concurrent": "a block of two or more read-only calls run concurrently",
    "segmented": "a block split into concurrent and sequential segments",
    "at-most-once": "a call that must never run twice",
    "tool-error-retry": "a tool error, then the call retried in the next round",
    "self-restart": "a tool that kills its own worker",
    "repeated-message": "a user message asked again in a later turn",
    "streaming": "replies streamed",
    "empty-streamed-answer": "a streamed turn whose answer is empty",
    "compaction": "older turns compacted before a turn",
    "compaction-mid-turn": "compaction between two tool rounds of one turn",
    "list-content": "a user message made of content parts (text and an image)",
    "unicode": "non-ASCII text: accents, other scripts, astral characters",
    "nul": "a NUL character in a message, an argument or an answer",
    "spilled-result": "a tool result over the transcript's spill limit",
}
# Features a conversation only declares: whether they happened shows in its fault-free run's trace.
OBSERVED = {"compaction": "compact.in_txn", "compaction-mid-turn": "compact.in_txn", "streaming": "model.chunk"}

READ_ONLY = frozenset({"lookup", "slow_lookup"})       # parallel-safe: run concurrently
AT_MOST_ONCE_TOOLS = frozenset({"append_note", "restart_agent"})
# A campaign over a user's own tools (supervisor.chaos.own_tools) says how each is declared:
# tool -> "read-only", "idempotent" or "at-most-once".
_tool_kinds: dict[str, str] = {}
IMAGE_PART = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


@dataclass(frozen=True)
class Call:
    """One tool call the model asks for: a chaos tool and its arguments (JSON values)."""

    tool: str
    arguments: tuple[tuple[str, Any], ...] = ()

    def spec(self) -> ToolCallSpec:
        return ToolCallSpec(self.tool, dict(self.arguments))


@dataclass(frozen=True)
class Step:
    """One tool round: the model's text beside its calls (None: no text), and the calls."""

    calls: tuple[Call, ...]
    text: str | None = None


@dataclass(frozen=True)
class TurnPlan:
    """One user turn: the message (text, or content parts whose first is the text), the tool
    rounds the model asks for, and its answer ("" in a streamed turn: an empty answer)."""

    message: str
    steps: tuple[Step, ...] = ()
    answer: str = "done"
    parts: bool = False          # send the message as content parts: its text, then an image
    repeat_of: int | None = None  # the earlier turn whose message (and replies) this one repeats


@dataclass(frozen=True)
class Conversation:
    turns: tuple[TurnPlan, ...]
    stream: bool = False
    compact_above: int = 0  # active rows above which older turns are compacted (0: never)

    # ------------------------------------------------------------ identity
    def to_json(self) -> dict[str, Any]:
        return {"turns": [{"message": t.message, "parts": t.parts, "repeat_of": t.repeat_of, "answer": t.answer,
                           "steps": [{"text": s.text, "calls": [[c.tool, dict(c.arguments)] for c in s.calls]}
                                     for s in t.steps]} for t in self.turns],
                "stream": self.stream, "compact_above": self.compact_above}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Conversation":
        try:
            turns = tuple(TurnPlan(
                message=str(t["message"]), parts=bool(t.get("parts", False)), repeat_of=t.get("repeat_of"),
                answer=str(t.get("answer", "")),
                steps=tuple(Step(tuple(Call(str(tool), tuple(sorted(dict(args).items()))) for tool, args in s["calls"]),
                                 s.get("text")) for s in t.get("steps", ())))
                for t in data["turns"])
            conversation = cls(turns, bool(data.get("stream", False)), int(data.get("compact_above", 0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a conversation: {exc!r}") from None
        if not turns:
            raise ValueError("not a conversation: it has no turns")
        for index, turn in enumerate(turns):
            if turn.repeat_of is not None and not 0 <= turn.repeat_of < index:
                raise ValueError(f"turn {index} repeats turn {turn.repeat_of}, which does not come before it")
        return conversation

    @cached_property
    def name(self) -> str:
        text = json.dumps(self.to_json(), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        return GENERATED_PREFIX + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]

    # ------------------------------------------------------------ running it
    def turn_content(self, index: int) -> str | list[dict[str, Any]]:
        """The user message of turn `index` as sent: tagged text, or content parts."""
        source = self.turns[index].repeat_of if self.turns[index].repeat_of is not None else index
        plan = self.turns[source]
        text = f"[{self.name}] t{source}: {plan.message}"
        return [{"type": "text", "text": text}, dict(IMAGE_PART)] if plan.parts else text

    def scenario(self) -> Scenario:
        turns = []
        for index, plan in enumerate(self.turns):
            source = self.turns[plan.repeat_of] if plan.repeat_of is not None else plan
            replies = tuple(Reply(content=s.text, tool_calls=tuple(c.spec() for c in s.calls)) for s in source.steps)
            turns.append(Turn(self.turn_content(index), (*replies, Reply(source.answer))))
        return Scenario(self.name, f"a drawn conversation of {len(turns)} turn(s)", tuple(turns), stream=self.stream,
                        compact_above=self.compact_above)

    # ------------------------------------------------------------ what it exercises
    def features(self) -> set[str]:
        """The features this conversation declares (those in OBSERVED still need its trace: `observed`)."""
        found: set[str] = set()
        turns = [self.turns[t.repeat_of] if t.repeat_of is not None else t for t in self.turns]
        if len(turns) >= 2:
            found.add("multi-turn")
        if len(turns) >= 4:
            found.add("four-turns")
        if any(t.repeat_of is not None for t in self.turns):
            found.add("repeated-message")
        if self.stream:
            found.add("streaming")
            if any(t.answer == "" for t in turns):
                found.add("empty-streamed-answer")
        if self.compact_above and len(turns) >= 2:
            found.add("compaction")
            if any(len(t.steps) >= 1 for t in turns[1:]):
                found.add("compaction-mid-turn")
        texts: list[str] = []
        for turn in turns:
            texts += [turn.message, turn.answer]
            if turn.parts:
                found.add("list-content")
            if len(turn.steps) >= 2:
                found.add("multi-step")
            for i, step in enumerate(turn.steps):
                found |= _block_features(step.calls)
                if step.text:
                    texts.append(step.text)
                texts += [str(v) for c in step.calls for _, v in c.arguments]
                if any(c.tool == "broken_tool" for c in step.calls) and i + 1 < len(turn.steps):
                    found.add("tool-error-retry")
        joined = "".join(texts)
        if not joined.isascii():
            found.add("unicode")
        if "\x00" in joined:
            found.add("nul")
        return found


def _block_features(calls: tuple[Call, ...]) -> set[str]:
    found: set[str] = set()
    tools = [c.tool for c in calls]
    if len(calls) >= 3:
        found.add("block-of-3")
    if len(calls) >= 5:
        found.add("block-of-5")
    policies = {_policy(t) for t in tools}
    if len(policies) >= 2:
        found.add("mixed-policies")
    if "once" in policies:
        found.add("at-most-once")
    if "restart_agent" in tools:
        found.add("self-restart")
    if any(c.tool == "lookup" and spills(dict(c.arguments)) for c in calls):
        found.add("spilled-result")
    # How the runtime's executor splits a block: runs of read-only calls together, others alone.
    reads = [_policy(t) == "read" for t in tools]
    runs = [r for i, r in enumerate(reads) if i == 0 or r != reads[i - 1]]
    if len(runs) >= 2:
        found.add("segmented")
    elif runs == [True] and len(calls) >= 2:
        found.add("concurrent")
    elif runs == [False]:
        found.add("sequential")
    return found


def _policy(tool: str) -> str:
    kind = _tool_kinds.get(tool)
    if kind is not None:
        return {"read-only": "read", "at-most-once": "once"}.get(kind, "write")
    return "read" if tool in READ_ONLY else "once" if tool in AT_MOST_ONCE_TOOLS else "write"


def set_tool_kinds(kinds: dict[str, str]) -> None:
    """How a user's own tools are declared (tool -> read-only, idempotent, at-most-once), for `features`."""
    _tool_kinds.update(kinds)


def observed(conversation: Conversation, trace: list[tuple[int, int, str, int]]) -> set[str]:
    """The features `conversation` exercised in a run whose probe trace (turn, process, probe, n),
    in the order hit, is `trace`: those it declares, less the ones the trace does not show."""
    found = conversation.features()
    names = {name for (_t, _p, name, _n) in trace}
    for feature, probe in OBSERVED.items():
        if feature in found and probe not in names:
            found.discard(feature)
    if "compaction" in found and _first_compaction_before_its_turn(trace) is None:
        found.discard("compaction")
    if "compaction-mid-turn" in found and not _compacted_after_a_tool(trace):
        found.discard("compaction-mid-turn")
    return found


def first_seen(conversation: Conversation, trace: list[tuple[int, int, str, int]]) -> dict[str, dict[str, Any]]:
    """Where in a run whose probe trace is `trace` each feature it exercised (`observed`) first
    happened: the hit at which it was there to be killed, as {"turn", "process", "point", "n",
    "hit" (its index in `trace`), "before" (that worker's hits of each probe before it)}. A turn's
    own feature (its message, a repeat, content parts) happens at the turn's first hit; a tool
    block's at the model reply that asks for it; an answer's at its reply; compaction and streaming
    at their probes. A feature the trace cannot place is left out: no kill is counted after it."""
    turns = [conversation.turns[t.repeat_of] if t.repeat_of is not None else t for t in conversation.turns]
    starts: dict[int, int] = {}
    replies: dict[int, list[int]] = {}
    for index, (turn, _process, name, _n) in enumerate(trace):
        starts.setdefault(turn, index)
        if name == "model.response":
            replies.setdefault(turn, []).append(index)

    def reply(turn: int, k: int) -> int | None:  # the k-th model reply of a turn (0 is the first)
        got = replies.get(turn, [])
        return got[k] if k < len(got) else None

    places: dict[str, list[int | None]] = {}

    def at(feature: str, index: int | None) -> None:
        places.setdefault(feature, []).append(index)

    at("multi-turn", starts.get(1))
    at("four-turns", starts.get(3))
    for u, (plan, own) in enumerate(zip(turns, conversation.turns)):
        if own.repeat_of is not None:
            at("repeated-message", starts.get(u))
        if plan.parts:
            at("list-content", starts.get(u))
        if len(plan.steps) >= 2:
            at("multi-step", reply(u, 1))
        answer = reply(u, len(plan.steps))
        if conversation.stream and plan.answer == "":
            at("empty-streamed-answer", answer)
        texts = [(plan.message, starts.get(u)), (plan.answer, answer)]
        for i, step in enumerate(plan.steps):
            for feature in _block_features(step.calls):
                at(feature, reply(u, i))
            if any(c.tool == "broken_tool" for c in step.calls) and i + 1 < len(plan.steps):
                at("tool-error-retry", reply(u, i + 1))
            texts.append((step.text or "", reply(u, i)))
            texts += [(str(v), reply(u, i)) for c in step.calls for _, v in c.arguments]
        for text, index in texts:
            if not text.isascii():
                at("unicode", index)
            if "\x00" in text:
                at("nul", index)
    at("streaming", next((i for i, p in enumerate(trace) if p[2] == "model.chunk"), None))
    at("compaction", _first_compaction_before_its_turn(trace))
    at("compaction-mid-turn", _first_compaction_after_a_tool(trace))
    seen = {}
    for feature in sorted(observed(conversation, trace)):
        known = [i for i in places.get(feature, ()) if i is not None]
        if known:
            seen[feature] = _position(trace, min(known))
    return seen


def _position(trace: list[tuple[int, int, str, int]], index: int) -> dict[str, Any]:
    turn, process, name, n = trace[index]
    before: dict[str, int] = {}
    for t, p, other, _n in trace[:index]:
        if (t, p) == (turn, process):
            before[other] = before.get(other, 0) + 1
    return {"turn": turn, "process": process, "point": name, "n": n, "hit": index, "before": before}


def after_feature(kill: tuple[int, int, str, int], seen: dict[str, Any]) -> bool:
    """Is the kill at (turn, process, probe, n) of a run at or after the hit `seen` (`first_seen`)
    of the same run? Turns and a turn's processes follow one another; within one worker, the
    n-th hit of a probe comes after the feature when the worker hit that probe fewer than n times
    before it."""
    turn, process, name, n = kill
    if (turn, process) != (seen["turn"], seen["process"]):
        return (turn, process) > (seen["turn"], seen["process"])
    return n > int((seen.get("before") or {}).get(name, 0))


def _first_compaction_before_its_turn(trace: list[tuple[int, int, str, int]]) -> int | None:
    """The index in `trace` of the first compaction by a process before it started its turn: the one
    between turns (a compaction inside a turn comes after the turn's start)."""
    started: set[tuple[int, int]] = set()
    for index, (turn, process, name, _n) in enumerate(trace):
        if name == "turn.start":
            started.add((turn, process))
        elif name == "compact.in_txn" and (turn, process) not in started:
            return index
    return None


def _compacted_after_a_tool(trace: list[tuple[int, int, str, int]]) -> bool:
    """Did a process compact after it had dispatched a tool of its turn?"""
    return _first_compaction_after_a_tool(trace) is not None


def _first_compaction_after_a_tool(trace: list[tuple[int, int, str, int]]) -> int | None:
    """The index in `trace` of the first compaction by a process that had dispatched a tool of its turn."""
    dispatched: set[tuple[int, int]] = set()
    for index, (turn, process, name, _n) in enumerate(trace):
        if name == "tool.dispatch.after":
            dispatched.add((turn, process))
        elif name == "compact.in_txn" and (turn, process) in dispatched:
            return index
    return None


def is_generated(name: str) -> bool:
    return bool(_NAME.fullmatch(name))


# ---------------------------------------------------------------- the process's conversations
_known: dict[str, Conversation] = {}
_known_lock = threading.Lock()
# The scripts of a user's own tools (supervisor.chaos.own_tools), by name: tool-<tool name>.
_scripts: dict[str, Scenario] = {}
_OWN_SCRIPT = re.compile(r"tool-[A-Za-z0-9_-]{1,64}")


def register_script(scenario: Scenario) -> str:
    """Make a script of a user's own tools runnable by name in this process."""
    with _known_lock:
        _scripts[scenario.name] = scenario
    return scenario.name


def register(conversation: Conversation) -> str:
    """Make `conversation` runnable by name in this process (a case names its scenario only)."""
    with _known_lock:
        _known.setdefault(conversation.name, conversation)
    return conversation.name


class UnknownConversation(LookupError):
    """A case names a drawn conversation this process does not know."""


def lookup(name: str) -> Conversation:
    with _known_lock:
        found = _known.get(name)
    if found is None:
        raise UnknownConversation(f"conversation {name} is not known here: it is drawn by `chaos --mode generated` with its "
                       "campaign's seed and runs, or read from a report (`hermes-supervisor shrink REPORT_DIR CASE`)")
    return found


def scenario_named(name: str) -> Scenario:
    """The scenario a case names: one of the scripts, or a conversation known in this process."""
    if name in SCENARIOS:
        return SCENARIOS[name]
    with _known_lock:
        script = _scripts.get(name)
    if script is not None:
        return script
    if _OWN_SCRIPT.fullmatch(name):
        raise UnknownConversation(f"{name} is the script of a tool of your own: give the campaign its --tools MODULE")
    return lookup(name).scenario()


def known_name(name: str) -> bool:
    """Could `name` name a case's scenario (a script, or a conversation whether known here or not)?"""
    return name in SCENARIOS or is_generated(name) or bool(_OWN_SCRIPT.fullmatch(name))
