"""Generated mode's draws: conversations and kill schedules, by Hypothesis.

Case `i` of a campaign with seed `S` is drawn by one Hypothesis run seeded from (S, i) alone
(`draw`), so a shard draws its own cases without the others', and the shrinker replays the very
same draw and shrinks from it (supervisor.chaos.shrink): Hypothesis's first example of a run is
its simplest one, its second is the case. What is drawn is a `Drawn`: a conversation, and a kill
schedule that does not know the conversation's probes yet:

    kills   1-3 aims (turn, probe, n): the n-th hit of a kill point in a turn; fewer aims mean
            fewer kills, and each shrinks towards the first turn, the first kill point, n = 1
    mode    how each kill is made (`self` or `external`, from the campaign's kill modes)

`schedule()` resolves the aims against the fault-free run's trace (`_aim`): one kill per turn at
most (the first aim that lands in it), each at a point that run reached, chained turn by turn.
A kill is only ever planned where the fault-free run went, so it lands unless the run under it
went elsewhere, which the checker reports rather than excuses.

The strategies draw what the scripts never did: up to five turns, repeated messages, blocks of
up to six calls mixing every effect policy, tool errors retried, streamed and empty answers,
compaction inside a tool turn, content parts, NUL and astral text, results over the spill
limit. Every choice is ordered simplest first, which is the direction Hypothesis shrinks in.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from hermes.probes import POINTS
from supervisor.chaos.conversation import Call, Conversation, Step, TurnPlan
from supervisor.chaos.nemesis import Fault
from supervisor.chaos.scenarios import SPILLED_PAD

MAX_TURNS = 5
MAX_STEPS = 3
MAX_CALLS = 6
MAX_KILLS = 3
MAX_HIT = 24  # the n of a kill at the n-th hit of a probe

# Simplest first: Hypothesis shrinks a sampled choice towards the front of its list.
TOOLS = ("lookup", "set_value", "append_note", "slow_lookup", "broken_tool", "restart_agent")
# Text is one choice from these (a text drawn character by character shrinks one character per
# case run): plain words, then what a transcript must keep exactly: other scripts, combining
# marks, astral characters, invisible ones, control characters, NUL.
TEXTS = ("a", "b c", "hello there", "é", "Straße", "漢字", "עברית", "e\u0301", "😀", "𝔘𝔫𝔦", "zero\u200bwidth",
         "tab\tnew\nline", "nul\x00byte", "\x00", "trailing ", "emoji 👩\u200d💻 joined")
_PLAIN = st.sampled_from(TEXTS)
_NO_NUL = st.sampled_from([t for t in TEXTS if "\x00" not in t])


def _text(draw: Any, allow_nul: bool) -> str:
    return draw(_PLAIN if allow_nul else _NO_NUL)


@st.composite
def calls(draw: Any, excluded: Collection[str], text: str) -> Call:
    """One call, its text arguments the round's text: a call is one choice (two for the rarer
    kinds), so the shrinker spends its runs deleting calls rather than simplifying each."""
    tools = [t for t in TOOLS if not (t == "restart_agent" and "self-restart" in excluded)]
    tool = draw(st.sampled_from(tools))
    if tool == "restart_agent" and draw(st.integers(0, 3)) != 3:
        tool = "lookup"  # a worker that kills itself is rarer than the other calls
    if tool == "lookup":
        pad = SPILLED_PAD if "spilled-result" not in excluded and draw(st.integers(0, 7)) == 7 else 0
        return Call(tool, (("key", text),) + ((("pad", pad),) if pad else ()))
    if tool == "slow_lookup":
        return Call(tool, (("key", text), ("seconds", 0.01)))
    if tool == "set_value":
        return Call(tool, (("key", text), ("value", text)))
    if tool == "append_note":
        return Call(tool, (("text", text),))
    if tool == "broken_tool":
        return Call(tool, (("reason", text),))
    return Call(tool)


@st.composite
def rounds(draw: Any, excluded: Collection[str]) -> tuple[Step, ...]:
    """One tool round, and when a call of it failed, maybe a second retrying that call with a tool that works."""
    text = _text(draw, "nul" not in excluded)
    block = tuple(draw(st.lists(calls(excluded, text), min_size=1, max_size=MAX_CALLS)))
    step = Step(block, text if draw(st.booleans()) else None)
    broken = [c for c in block if c.tool == "broken_tool"]
    if broken and draw(st.booleans()):
        return step, Step((Call("lookup", (("key", dict(broken[0].arguments)["reason"]),)),), "retrying")
    return (step,)


@st.composite
def turns(draw: Any, excluded: Collection[str], stream: bool) -> TurnPlan:
    allow_nul = "nul" not in excluded
    steps = tuple(step for group in draw(st.lists(rounds(excluded), max_size=MAX_STEPS)) for step in group)
    empty = stream and "empty-streamed-answer" not in excluded and draw(st.integers(0, 5)) == 5
    parts = "list-content" not in excluded and draw(st.integers(0, 3)) == 3
    return TurnPlan(_text(draw, allow_nul), steps, "" if empty else "ans " + _text(draw, allow_nul), parts)


@st.composite
def conversations(draw: Any, excluded: Collection[str] = ()) -> Conversation:
    """A conversation avoiding the features in `excluded` (what the target cannot take)."""
    return assemble(draw, lambda stream: turns(excluded, stream), excluded)


def assemble(draw: Any, turn_plans: Callable[[bool], st.SearchStrategy[TurnPlan]],
             excluded: Collection[str], max_turns: int = MAX_TURNS) -> Conversation:
    """A conversation of turns drawn by `turn_plans(stream)`: whether it streams, 1 to `max_turns`
    turns (some asking an earlier turn's message again), then whether older turns are compacted.
    One order of draws for every kind of conversation, so a seed always draws the same one."""
    stream = "streaming" not in excluded and draw(st.booleans())
    # Each turn comes with a number saying whether it asks an earlier turn's message again (a list
    # of whole turns, so Hypothesis shrinks by deleting turns).
    drawn_turns = draw(st.lists(st.tuples(st.integers(0, 4), turn_plans(stream)), min_size=1, max_size=max_turns))
    plans: list[TurnPlan] = []
    for index, (again, plan) in enumerate(drawn_turns):
        if index and again == 4 and "repeated-message" not in excluded:
            plan = TurnPlan("", answer="", repeat_of=(index - 1) // 2)
        plans.append(plan)
    compact = 0
    if "compaction" not in excluded and len(plans) >= 2 and draw(st.booleans()):
        compact = draw(st.sampled_from((8, 6, 4)))
    return Conversation(tuple(plans), stream, compact)


Kill = tuple[int, str, int]  # (turn, probe, n): a kill aimed at the n-th hit of a probe in a turn


@dataclass(frozen=True)
class Drawn:
    """One drawn case: a conversation and its kill schedule (see the module docstring)."""

    conversation: Conversation
    kills: tuple[Kill, ...]
    mode: str

    def schedule(self, trace: list[tuple[int, int, str, int]]) -> Fault | None:
        """The kills of this case on a run whose fault-free trace is `trace` (None: it reached no point)."""
        points = list(dict.fromkeys(p for p in trace if p[1] >= 0))
        if not points:
            return None
        turns = sorted({p[0] for p in points})
        chosen: dict[int, tuple[int, int, str, int]] = {}
        for turn_pick, probe, n in self.kills:
            turn = turns[turn_pick % len(turns)]
            if turn not in chosen:
                chosen[turn] = _aim([p for p in points if p[0] == turn], probe, n)
        fault = None
        for turn, process, probe, n in sorted(chosen.values(), reverse=True):
            fault = Fault("probe", turn, process, probe=probe, n=n, mode=self.mode, then=fault)
        return fault


def _aim(points: list[tuple[int, int, str, int]], probe: str, n: int) -> tuple[int, int, str, int]:
    """The point of `points` (one turn's, in the order hit) a kill at the n-th `probe` lands on: the
    last hit of that probe numbered n or lower (its first, if all are higher); a probe the turn never
    hits gives way to the first point of the next probe in POINTS order that it does hit. So a
    kill keeps its place while the conversation around it shrinks, and shrinks to earlier points."""
    for offset in range(len(POINTS)):
        name = POINTS[(POINTS.index(probe) + offset) % len(POINTS)]
        hits = [p for p in points if p[2] == name]
        if hits:
            return next((p for p in reversed(hits) if p[3] <= n), hits[0])
    return points[0]


def drawn(excluded: Collection[str], kill_modes: tuple[str, ...],
          talk: st.SearchStrategy[Conversation] | None = None) -> st.SearchStrategy[Drawn]:
    """Drawn cases: conversations over the chaos tools, or those `talk` draws (a user's own
    tools': supervisor.chaos.own_draws), each with its kill schedule."""
    kill = st.tuples(st.integers(0, MAX_TURNS - 1), st.sampled_from(POINTS), st.integers(1, MAX_HIT))
    case = st.builds(Drawn, conversations(excluded) if talk is None else talk,
                     st.lists(kill, min_size=1, max_size=MAX_KILLS).map(tuple), st.sampled_from(kill_modes))
    # A run's second example must differ from its first (the simplest) somewhere, and Hypothesis
    # makes it differ at the first choice it can: a salt drawn first takes that, so the case's own
    # choices are all drawn freely (without it, the first yes/no of every case came out "yes").
    return st.tuples(st.integers(0, 2**63 - 1), case).map(lambda salted: salted[1])


def case_seed(campaign_seed: int, index: int) -> int:
    """The seed of case `index`'s Hypothesis run: from the campaign's seed and the index alone."""
    digest = hashlib.sha256(f"hermes-generated/{campaign_seed}/{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def hypothesis_settings(phases: tuple[Phase, ...] = (Phase.generate,)) -> settings:
    """One run's settings: two examples (the simplest, then the case), nothing remembered
    between runs, no timing checks (a draw's speed says nothing about the case)."""
    return settings(max_examples=2, database=None, deadline=None, phases=phases, derandomize=False,
                    suppress_health_check=list(HealthCheck), print_blob=False, report_multiple_bugs=False)


def draw(campaign_seed: int, index: int, excluded: Collection[str] = (),
         kill_modes: tuple[str, ...] = ("self",), talk: st.SearchStrategy[Conversation] | None = None) -> Drawn:
    """Case `index` of a generated campaign with seed `campaign_seed` (its conversation drawn by
    `talk`, when given)."""
    seen: list[Drawn] = []

    @seed(case_seed(campaign_seed, index))
    @hypothesis_settings()
    @given(drawn(tuple(sorted(excluded)), kill_modes, talk))
    def collect(case: Drawn) -> None:
        seen.append(case)

    collect()
    return seen[-1]
