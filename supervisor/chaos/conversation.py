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

from supervisor.chaos.scenarios import SCENARIOS, SPILLED_PAD, Scenario, Turn
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
    "compaction": "older turns compacted",
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
    policies = {"read" if t in READ_ONLY else "once" if t in AT_MOST_ONCE_TOOLS else "write" for t in tools}
    if len(policies) >= 2:
        found.add("mixed-policies")
    if "once" in policies:
        found.add("at-most-once")
    if "restart_agent" in tools:
        found.add("self-restart")
    if any(c.tool == "lookup" and dict(c.arguments).get("pad", 0) >= SPILLED_PAD for c in calls):
        found.add("spilled-result")
    # How the runtime's executor splits a block: runs of read-only calls together, others alone.
    runs = [t in READ_ONLY for i, t in enumerate(tools) if i == 0 or (t in READ_ONLY) != (tools[i - 1] in READ_ONLY)]
    if len(runs) >= 2:
        found.add("segmented")
    elif runs == [True] and len(calls) >= 2:
        found.add("concurrent")
    elif runs == [False]:
        found.add("sequential")
    return found


def observed(conversation: Conversation, trace: list[tuple[int, int, str, int]]) -> set[str]:
    """The features `conversation` exercised in a run whose probe trace (turn, process, probe, n),
    in the order hit, is `trace`: those it declares, less the ones the trace does not show."""
    found = conversation.features()
    names = {name for (_t, _p, name, _n) in trace}
    for feature, probe in OBSERVED.items():
        if feature in found and probe not in names:
            found.discard(feature)
    if "compaction-mid-turn" in found and not _compacted_after_a_tool(trace):
        found.discard("compaction-mid-turn")
    return found


def _compacted_after_a_tool(trace: list[tuple[int, int, str, int]]) -> bool:
    """Did a process compact after it had dispatched a tool of its turn?"""
    dispatched: set[tuple[int, int]] = set()
    for turn, process, name, _n in trace:
        if name == "tool.dispatch.after":
            dispatched.add((turn, process))
        elif name == "compact.in_txn" and (turn, process) in dispatched:
            return True
    return False


def is_generated(name: str) -> bool:
    return bool(_NAME.fullmatch(name))


# ---------------------------------------------------------------- the process's conversations
_known: dict[str, Conversation] = {}
_known_lock = threading.Lock()


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
    return lookup(name).scenario()


def known_name(name: str) -> bool:
    """Could `name` name a case's scenario (a script, or a conversation whether known here or not)?"""
    return name in SCENARIOS or is_generated(name)
