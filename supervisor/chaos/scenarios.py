"""Workloads: a scripted model, the chaos tool set and the user messages of one session.

Every user message starts with the scenario's tag, so one model server can serve
all scenarios at once: a reply is keyed on the last user message and on how many
assistant replies the turn already has. A scenario also declares what its end state
must be (`Expectation`), which the checker holds the durable state to.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from hermes.compaction import SUMMARY_PROMPT
from hermes.executor import SPILL_THRESHOLD_CHARS
from testkit.script import Reply, ToolCallSpec, content_text, last_user_text, reply_index
from worker.chaos_tools import clean_results
from worker.targets.hermes_agent_resume import without_recovery_note

SESSION = "chaos-session"  # every case runs one session of this id
MODEL = "scripted-model"   # the name the scripted model answers as
DEFAULT_MAX_RESTARTS = 10


@dataclass(frozen=True)
class Expectation:
    """What a scenario declares about its end state."""

    turns: int                              # number of user turns that must end
    final_answers: tuple[str, ...] = ()     # expected final answer per turn, in order ("" = don't check)
    max_restarts: int = DEFAULT_MAX_RESTARTS
    compact_above: int = 0                  # the workers' compaction bound (0: none)


@dataclass(frozen=True)
class Turn:
    message: str | list[dict[str, Any]]  # text, or content parts (a drawn conversation's)
    replies: tuple[Reply, ...]

    @property
    def answer(self) -> str:
        return self.replies[-1].content or ""

    @property
    def text(self) -> str:
        """The message's text: what the model server keys its replies on."""
        return content_text(self.message)


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    turns: tuple[Turn, ...]
    stream: bool = False
    compact_above: int = 0
    worker_args: tuple[str, ...] = field(default=())
    # The scripted model gives every request fresh call ids, as a real model does; a scenario
    # that needs a re-sent request to get the same ids again says so (its campaign's model then
    # repeats ids for every scenario it serves).
    fixed_call_ids: bool = False

    def expectation(self) -> Expectation:
        return Expectation(turns=len(self.turns), final_answers=tuple(t.answer for t in self.turns),
                           compact_above=self.compact_above)

    def extra_args(self, command: str) -> list[str]:
        """Worker arguments this scenario adds to `command` (the same for a turn's first worker and
        for the ones that resume it: a resumed turn compacts where its first worker would have)."""
        args = list(self.worker_args)
        if self.stream:
            args.append("--stream")
        if self.compact_above:
            args += ["--compact-above", str(self.compact_above)]
        return args


# Padding that makes a lookup's result too big for the transcript (hermes.executor spills it).
SPILLED_PAD = 120_000


def spills(arguments: dict[str, Any]) -> bool:
    """Is the result of a lookup with these arguments over the runtime's spill limit? (Told from
    its padding: the result itself would be built for nothing.)"""
    return int(arguments.get("pad") or 0) >= pad_to(str(arguments.get("key", "")), SPILL_THRESHOLD_CHARS + 1)


def pad_to(key: str, chars: int) -> int:
    """The `pad` that makes a lookup of `key` return exactly `chars` characters."""
    return chars - (len(next(iter(clean_results("lookup", {"key": key, "pad": 1})))) - 1)


def _call(name: str, **arguments: object) -> ToolCallSpec:
    return ToolCallSpec(name, arguments)


def _tools(content: str | None, *calls: ToolCallSpec) -> Reply:
    return Reply(content=content, tool_calls=tuple(calls))


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("single-tool", "one tool call, then the answer", (
        Turn("[single-tool] what is alpha?", (
            _tools(None, _call("lookup", key="alpha")),
            Reply("alpha is value-of-alpha."))),)),
    # The two large results sit on either side of the spill limit: a runtime that spills one
    # character early or late breaks its promise on one of them.
    Scenario("parallel-read", "a read-only batch run concurrently; one result right at the spill limit is kept, "
             "one just over it is spilled to a file", (
        Turn("[parallel-read] compare a, b and c", (
            _tools("Looking up all three at once.", _call("lookup", key="a", pad=pad_to("a", SPILL_THRESHOLD_CHARS)),
                   _call("slow_lookup", key="b", seconds=0.05),
                   _call("lookup", key="c", pad=pad_to("c", SPILL_THRESHOLD_CHARS + 1))),
            Reply("a, b and c are all known."))),)),
    Scenario("mixed-batch", "reads, a write, a read: a segmented batch", (
        Turn("[mixed-batch] read two keys, store one, read again", (
            _tools("Reading, then writing.", _call("lookup", key="x"), _call("lookup", key="y"),
                   _call("set_value", key="z", value="from x and y"), _call("lookup", key="z")),
            Reply("Stored z after reading x and y."))),)),
    # Sized so that both moments compact, and so that the bound is met exactly once with an older turn
    # to summarize: the first two turns leave six live rows, over the bound of five, so the session is
    # compacted before the third turn; the third leaves five, at the bound and not over it, so the
    # fourth begins uncompacted (with two turns older than it); the fourth's tool block takes the
    # session over the bound, so it is compacted inside that turn. (A tool block in the second turn
    # would compact inside it, and the compaction between turns would never be due; one in the third
    # would leave only a summary older than the fourth, which no compaction takes, so a runtime that
    # compacted at the bound would do nothing different there.) The first turn's four rows make the row
    # a compaction keeps from the older turns' last one a choice that shows.
    Scenario("multi-turn-compaction", "four turns; older turns are compacted before the third and inside the "
             "fourth, which begins at the bound", (
        Turn("[multi-turn-compaction] first, store two", (
            _tools("Storing it.", _call("set_value", key="two", value="2")), Reply("two is stored."))),
        Turn("[multi-turn-compaction] second, remember that one is 1", (Reply("Noted: one is 1."),)),
        Turn("[multi-turn-compaction] third, thanks", (Reply("You are welcome."),)),
        Turn("[multi-turn-compaction] fourth, look up three", (
            _tools(None, _call("lookup", key="three")), Reply("three is known, and I remember the rest."))),
    ), compact_above=5),
    Scenario("streamed-answer", "a tool call and a streamed final answer", (
        Turn("[streamed-answer] look up the weather and tell me at length", (
            _tools("Let me check.", _call("lookup", key="weather")),
            Reply("The weather key says value-of-weather; that is all the lookup returned today."))),),
        stream=True),
    Scenario("writes", "an at-most-once write and an idempotent write", (
        Turn("[writes] note it down and store the flag", (
            _tools("Writing both.", _call("append_note", text="remember the flag"),
                   _call("set_value", key="flag", value="on")),
            Reply("Noted, and the flag is on."))),)),
    Scenario("self-kill", "a tool restarts its own worker after earlier tools produced results", (
        Turn("[self-kill] prepare, restart, then check", (
            _tools("Preparing before the restart.", _call("lookup", key="before"),
                   _call("set_value", key="stage", value="pre-restart"), _call("restart_agent"),
                   _call("lookup", key="after")),
            Reply("Restarted; the restart's outcome is unknown, everything else is done."))),)),
)}

SUMMARY_REPLY = "Earlier: two was stored, and one is 1."


class CampaignScript:
    """The scripted model of a campaign: it answers every turn of the scenarios it was given, and
    of those `add`ed while it serves (a drawn conversation is known once it is drawn), plus the
    compaction summary request. A reply is keyed on the last user message (without the white space
    at its ends, which some runtimes strip from what the user sent) and on how many assistant
    replies its turn already has."""

    def __init__(self, scenarios: list[Scenario]) -> None:
        self._replies: dict[str, tuple[Reply, ...]] = {SUMMARY_PROMPT.strip(): (Reply(SUMMARY_REPLY),)}
        self._lock = threading.Lock()
        # Read by testkit.modelserver.ScriptedModelServer when it is started with this script.
        self.call_ids = "fixed" if any(s.fixed_call_ids for s in scenarios) else "fresh"
        for scenario in scenarios:
            self.add(scenario)

    def add(self, scenario: Scenario) -> None:
        with self._lock:
            for turn in scenario.turns:
                self._replies.setdefault(turn.text.strip(), turn.replies)

    def __call__(self, messages: list[dict]) -> Reply:
        # A runtime's note asking to continue an interrupted turn (upstream hermes-agent's gateway
        # recovery note) is answered as that turn: with the reply it would have had next. The note
        # comes as a message of its own, or appended to the interrupted question.
        last = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
        question = None if last is None else without_recovery_note(content_text(messages[last].get("content")))
        if last is not None and question == "":
            messages = messages[:last] + messages[last + 1:]
        elif last is not None and question is not None:
            messages = messages[:last] + [{**messages[last], "content": question}] + messages[last + 1:]
        text = last_user_text(messages)
        index = reply_index(messages)
        with self._lock:
            replies = self._replies.get(text.strip()) if text is not None else None
        if replies is not None and index < len(replies):
            return replies[index]
        return Reply(content=f"scripted model: no reply for {text!r} at index {index}")


def campaign_script(scenarios: list[Scenario]) -> CampaignScript:
    """One script answering every turn of `scenarios`, plus the compaction summary request."""
    return CampaignScript(scenarios)
