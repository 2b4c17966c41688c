"""Generated mode's drawing: conversations and kill schedules from (seed, index) alone, what a
conversation exercises, and how a drawn kill schedule lands on a fault-free run's trace."""
from __future__ import annotations

import pytest

from supervisor.chaos import explore
from supervisor.chaos.conversation import (
    FEATURES,
    Call,
    Conversation,
    Step,
    TurnPlan,
    UnknownConversation,
    is_generated,
    observed,
    register,
    scenario_named,
)
from supervisor.chaos.explore import Drawn
from supervisor.chaos.generator import Case
from supervisor.chaos.scenarios import SPILLED_PAD, CampaignScript


def test_a_case_is_drawn_from_its_seed_and_index_alone() -> None:
    first = [explore.draw(7, i) for i in range(6)]
    again = [explore.draw(7, i) for i in reversed(range(6))][::-1]  # another order: the same cases
    assert first == again
    assert len({d.conversation.name for d in first}) == len(first)
    assert explore.draw(8, 0) != first[0]


def test_draws_reach_every_feature_and_avoid_what_a_target_cannot_take() -> None:
    seen: set[str] = set()
    for index in range(150):
        seen |= explore.draw(3, index).conversation.features()
    assert seen == set(FEATURES)
    excluded = {"list-content", "nul", "streaming", "compaction", "repeated-message", "self-restart"}
    for index in range(40):
        found = explore.draw(3, index, excluded).conversation.features()
        assert not found & excluded, index


def test_a_conversation_survives_json_and_keeps_its_name() -> None:
    for index in range(30):
        conversation = explore.draw(11, index).conversation
        back = Conversation.from_json(conversation.to_json())
        assert back == conversation and back.name == conversation.name and is_generated(back.name)


@pytest.mark.parametrize("bad", [{}, {"turns": []}, {"turns": [{"message": "a", "repeat_of": 0}]},
                                 {"turns": [{"message": "a", "steps": [{"calls": [["lookup"]]}]}]}])
def test_a_broken_conversation_is_refused_plainly(bad: dict) -> None:
    with pytest.raises(ValueError, match="conversation|turn"):
        Conversation.from_json(bad)


def _conversation() -> Conversation:
    reads = Step((Call("lookup", (("key", "a"),)), Call("slow_lookup", (("key", "b"), ("seconds", 0.01)))))
    mixed = Step((Call("lookup", (("key", "x"), ("pad", SPILLED_PAD))), Call("append_note", (("text", "n\x00"),)),
                  Call("broken_tool", (("reason", "r"),))), "checking")
    retry = Step((Call("lookup", (("key", "r"),)),), "retrying")
    return Conversation((TurnPlan("first é", (reads,), "ans one", parts=True),
                         TurnPlan("second", (mixed, retry), "", parts=False),
                         TurnPlan("", repeat_of=0, answer=""),
                         TurnPlan("fourth", (), "ans four")), stream=True, compact_above=4)


def test_features_follow_from_the_conversation_and_its_trace() -> None:
    conversation = _conversation()
    declared = conversation.features()
    assert {"four-turns", "repeated-message", "list-content", "concurrent", "segmented", "mixed-policies",
            "at-most-once", "spilled-result", "tool-error-retry", "multi-step", "streaming", "empty-streamed-answer",
            "unicode", "nul", "compaction", "compaction-mid-turn", "block-of-3"} <= declared
    assert "block-of-5" not in declared and "self-restart" not in declared
    # Declared is not done: compaction and streaming count only where the fault-free run shows them.
    plain = [(0, 0, "turn.start", 1), (1, 0, "tool.dispatch.after", 1), (1, 0, "model.request", 1)]
    assert not {"compaction", "compaction-mid-turn", "streaming"} & observed(conversation, plain)
    between_turns = [(1, 0, "compact.in_txn", 1), (1, 0, "tool.dispatch.after", 1), (0, 0, "model.chunk", 1)]
    assert {"compaction", "streaming"} <= observed(conversation, between_turns)
    assert "compaction-mid-turn" not in observed(conversation, between_turns)
    mid_turn = [(1, 0, "turn.start", 1), (1, 0, "tool.dispatch.after", 1), (1, 0, "compact.in_txn", 1)]
    assert "compaction-mid-turn" in observed(conversation, mid_turn)
    assert "compaction" not in observed(conversation, mid_turn)  # compacted inside a turn only


def test_a_conversation_runs_as_a_scenario_the_campaign_model_answers() -> None:
    conversation = _conversation()
    register(conversation)
    scenario = scenario_named(conversation.name)
    assert Case.parse(f"{conversation.name}/fault-free").scenario == conversation.name
    assert [t.text for t in scenario.turns][2] == scenario.turns[0].text  # a repeated message is the same text
    assert isinstance(scenario.turns[0].message, list) and scenario.turns[0].message[1]["type"] == "image_url"
    assert scenario.expectation().final_answers == ("ans one", "", "ans one", "ans four")
    script = CampaignScript([])
    script.add(scenario)
    second = scenario.turns[1]
    replies = [script([{"role": "user", "content": second.message}] + [{"role": "assistant"}] * i) for i in range(3)]
    assert [len(r.tool_calls) for r in replies] == [3, 1, 0] and replies[1].content == "retrying"
    with pytest.raises(UnknownConversation, match="not known here"):
        scenario_named("gen-000000000000")


TRACE = [(0, 0, "turn.start", 1), (0, 0, "model.request", 1), (0, 0, "tool.dispatch.before", 1),
         (0, 0, "tool.dispatch.before", 2), (0, 0, "finalize.before", 1),
         (1, 0, "turn.start", 1), (1, 0, "model.request", 1), (1, 1, "resume.begin", 1), (1, 1, "finalize.before", 1)]


def _drawn(*kills: tuple[int, str, int]) -> Drawn:
    return Drawn(_conversation(), tuple(kills), "self")


def test_a_kill_schedule_lands_only_where_the_fault_free_run_went() -> None:
    fault = _drawn((0, "tool.dispatch.before", 2)).schedule(TRACE)
    assert fault is not None and (fault.turn, fault.process, fault.point, fault.then) == (0, 0, "tool.dispatch.before:2",
                                                                                          None)
    # n past the last hit: the last hit; a probe the turn never hits: the next one in POINTS order it does.
    assert _drawn((0, "tool.dispatch.before", 9)).schedule(TRACE).point == "tool.dispatch.before:2"
    resumed = _drawn((1, "resume.begin", 3)).schedule(TRACE)
    assert (resumed.turn, resumed.process, resumed.point) == (1, 1, "resume.begin:1")
    never = _drawn((0, "compact.in_txn", 1)).schedule(TRACE)
    assert (never.turn, never.process) == (0, 0) and (never.turn, never.process, never.probe, never.n) in TRACE
    # One kill per turn (the first aim at it), chained in turn order; a turn past the last wraps around.
    chained = _drawn((6, "model.request", 1), (0, "turn.start", 1), (1, "finalize.before", 1)).schedule(TRACE)
    assert chained.label() == "probe:self@model.request:1@t0p0+probe:self@finalize.before:1@t1p1"
    assert _drawn((0, "turn.start", 1)).schedule([]) is None
