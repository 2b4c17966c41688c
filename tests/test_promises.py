"""What each violation is to its target: broken-promise, documented-behaviour or beyond-promise, with its document.

The class (damage, contract) is the invariants'; the promise is decided once per case, in
`check_case`, from the target's record (`targetkit.Target`). Constructed violations go through
`check_case` (and, for the conditions a case's kills decide, `label_promises`) for every target;
a real campaign against ours with a planted defect shows that every violation of ours is a broken
promise (the campaigns against LangGraph and the OpenAI Agents SDK are in their own test files).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hermes.state import SessionDB
from supervisor.chaos.checker import INVARIANTS, Violation, check_case
from supervisor.chaos.checker.promises import CONDITIONS, condition_of, label_promises, promise_of, uniform_promise
from supervisor.chaos.checker.verdict import (
    BEYOND_PROMISE,
    BROKEN_PROMISE,
    DOCUMENTED_BEHAVIOUR,
    PROMISE_LABELS,
)
from targetkit import ANY, FULL_PROMISES, RERUN, RERUN_AFTER_CHECKPOINT_KILL, RESULT_PREVIEW, Promises, registry
from targetkit.target import OUR_CONTRACT
from worker.targets import hermes_agent, langgraph, openai_agents

HERMES_AGENT_CLAIMS, HERMES_AGENT_SESSIONS = hermes_agent.CLAIMS_DOC, hermes_agent.SESSIONS_DOC
LG_ASYNC, LG_EXIT, LG_SYNC = (langgraph.MODE_DOCS[mode] for mode in ("async", "exit", "sync"))
LG_CLAIMS, LG_NODE_RERUN = langgraph.CLAIMS_DOC, langgraph.NODE_RERUN_DOC
LG_PENDING_WRITES, LG_RESUME = langgraph.PENDING_WRITES_DOC, langgraph.RESUME_DOC
OA_CLAIMS, OA_STORED_AFTER_RUN = openai_agents.CLAIMS_DOC, openai_agents.STORED_AFTER_RUN_DOC
TARGETS = {name: registry.get(name) for name in registry.BUILTIN}  # ours (an installed example has its own)

REPO = Path(__file__).resolve().parent.parent
DEFECTS = Path(__file__).resolve().parent / "defects"

SYNC = TARGETS["langgraph"].promises_for({"durability": "sync"})
ASYNC = TARGETS["langgraph"].promises_for({"durability": "async"})
EXIT = TARGETS["langgraph"].promises_for({"durability": "exit"})
SDK = TARGETS["openai-agents"].promises_for({})
UPSTREAM = TARGETS["hermes-agent"].promises_for({})


def _effect(call: str = "c1", incarnation: int = 1, *, request: bool = True, intent: bool = False) -> dict[str, Any]:
    return {"t": 0.2, "case": "c", "type": "effect", "incarnation": incarnation, "tool": "append_note",
            "policy": "at_most_once", "tool_call_id": call, "turn": "turn-0", "request_durable": request,
            "intent_durable": intent, "witness": {}}


SHOWN_EARLY = {"t": 0.1, "case": "c", "type": "ui", "kind": "interim", "turn": "turn-0", "text": "Checking.",
               "durable": False, "witness": {}}


def _judged(tmp_path: Path, events: list[dict[str, Any]], promises: Promises) -> dict[tuple[str, str], Any]:
    """(invariant, message) -> violation, of check_case on an empty store (no ledger: effects are not counted)."""
    db = tmp_path / "state.db"
    SessionDB(db).close()
    verdict = check_case(db, None, events, promises=promises)
    return {(v.invariant, v.message): v for v in verdict.violations}


def _labels(tmp_path: Path, events: list[dict[str, Any]], promises: Promises) -> set[tuple[str, str, str | None]]:
    return {(v.invariant, v.promise or "", v.promise_doc) for v in _judged(tmp_path, events, promises).values()}


# ------------------------------------------------------------------ the violation and its JSON
def test_a_violation_carries_its_class_and_its_promise_in_json() -> None:
    v = Violation("durable-before-effect", "ran early", {"event": {}}, "contract")
    assert "promise" not in v.to_json()  # not yet asked of a target
    label_promises([v], SYNC)
    out = json.loads(json.dumps(v.to_json()))
    assert out["class"] == "contract"
    assert (out["promise"], out["promise_doc"]) == (BEYOND_PROMISE, LG_CLAIMS)


def test_check_case_labels_every_violation_and_the_parts_share_them(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    SessionDB(db).close()
    verdict = check_case(db, None, [SHOWN_EARLY, _effect(request=False)], promises=SDK)
    assert verdict.violations and all(v.promise in PROMISE_LABELS and v.promise_doc for v in verdict.violations)
    part = next(p for p in verdict.parts if p.name == "durable-before-visible")
    assert part.violations[0].promise == DOCUMENTED_BEHAVIOUR
    assert all(v["promise"] for v in verdict.to_json()["violations"])


# ------------------------------------------------------------------ ours
def test_every_violation_of_ours_is_a_broken_promise_on_our_contract(tmp_path: Path) -> None:
    labels = _labels(tmp_path, [SHOWN_EARLY, _effect(request=False), _effect("c2", intent=False)], FULL_PROMISES)
    assert {inv for inv, _, _ in labels} == {"durable-before-visible", "durable-before-effect"}
    assert {(p, d) for _, p, d in labels} == {(BROKEN_PROMISE, OUR_CONTRACT)}
    # Whatever the invariant and condition, a rerun included (LangGraph documents that one).
    for inv in INVARIANTS:
        for condition in (*CONDITIONS.get(inv, ()), ANY):
            assert promise_of(TARGETS["hermes"].promises_for({}), inv, condition) == (BROKEN_PROMISE, OUR_CONTRACT)


# ------------------------------------------------------------------ LangGraph
def test_langgraph_sync_promises_the_request_but_never_dispatch_intents(tmp_path: Path) -> None:
    labels = _labels(tmp_path, [SHOWN_EARLY, _effect("c1", request=True), _effect("c2", request=False)], SYNC)
    assert labels == {("durable-before-visible", BEYOND_PROMISE, LG_CLAIMS),
                      ("durable-before-effect", BEYOND_PROMISE, LG_CLAIMS),   # c1: only its intent was missing
                      ("durable-before-effect", BROKEN_PROMISE, LG_SYNC)}     # c2: its request too


@pytest.mark.parametrize(("promises", "doc"), [(ASYNC, LG_ASYNC), (EXIT, LG_EXIT)], ids=["async", "exit"])
def test_langgraph_async_and_exit_document_what_they_do_not_save_in_time(tmp_path: Path, promises: Promises,
                                                                        doc: str) -> None:
    labels = _labels(tmp_path, [SHOWN_EARLY, _effect("c1", request=True), _effect("c2", request=False)], promises)
    assert labels == {("durable-before-visible", DOCUMENTED_BEHAVIOUR, doc),
                      ("durable-before-effect", BEYOND_PROMISE, LG_CLAIMS),
                      ("durable-before-effect", DOCUMENTED_BEHAVIOUR, doc)}


def _probe(name: str, incarnation: int = 1, kill: bool = False, **ctx: Any) -> dict[str, Any]:
    return {"t": 0.3, "case": "c", "type": "probe", "incarnation": incarnation, "name": name, "n": 1,
            "ctx": {"session": "chaos-session", "turn": "turn-0", **ctx}, "kill": kill}


def _rerun_events(kill: dict[str, Any]) -> list[dict[str, Any]]:
    """The tools node ran append_note, its worker died at `kill`, the resumed worker ran it again
    (the events a LangGraph campaign records, as in its case writes/probe:self@flush.begin:7)."""
    return [_probe("tool.dispatch.before", tool_call_id="c1", tool="append_note"), _effect("c1", 1), kill,
            {"t": 0.4, "case": "c", "type": "exit", "incarnation": 1, "returncode": -9, "signal": 9},
            _probe("resume.begin", 2), _effect("c1", 2)]


RERUN_VIOLATION = ("at_most_once tool append_note executed 2 times for call c1", {"rule": "rerun", "tool_call_id": "c1"})
IN_PUT = _probe("flush.begin", kill=True, op="put", step=2, source="loop")
IN_PUT_WRITES = _probe("flush.in_txn", kill=True, op="put_writes", task_path="~__pregel_pull, tools")
MID_NODE = _probe("tool.dispatch.after", kill=True, tool_call_id="c1", tool="append_note")


@pytest.mark.parametrize(("kill", "promises", "expected"), [
    (IN_PUT, SYNC, (BROKEN_PROMISE, LG_PENDING_WRITES)),          # issue #8039's window
    (IN_PUT_WRITES, SYNC, (DOCUMENTED_BEHAVIOUR, LG_NODE_RERUN)),  # the node's writes were not saved yet
    (MID_NODE, SYNC, (DOCUMENTED_BEHAVIOUR, LG_NODE_RERUN)),       # a node killed mid-way runs again
    (IN_PUT, ASYNC, (DOCUMENTED_BEHAVIOUR, LG_ASYNC)),
    (IN_PUT, EXIT, (DOCUMENTED_BEHAVIOUR, LG_EXIT)),
    (MID_NODE, EXIT, (DOCUMENTED_BEHAVIOUR, LG_NODE_RERUN)),
    (IN_PUT, SDK, (BEYOND_PROMISE, OA_CLAIMS)),                    # the SDK never says a tool runs once
    (IN_PUT, FULL_PROMISES, (BROKEN_PROMISE, OUR_CONTRACT)),
], ids=["sync-in-put", "sync-in-put-writes", "sync-mid-node", "async-in-put", "exit-in-put", "exit-mid-node",
        "sdk", "ours"])
def test_a_rerun_is_labelled_by_where_the_kill_landed(kill: dict[str, Any], promises: Promises,
                                                      expected: tuple[str, str]) -> None:
    message, witness = RERUN_VIOLATION
    v = Violation("effect-semantics", message, witness, "damage")
    events = _rerun_events(kill)
    assert condition_of(v, events) == (RERUN_AFTER_CHECKPOINT_KILL if kill is IN_PUT else RERUN)
    label_promises([v], promises, events)
    assert (v.promise, v.promise_doc) == expected


def test_running_without_a_dispatch_intent_is_beyond_every_framework_and_lost_rows_break_them() -> None:
    ran = Violation("effect-semantics", "tool set_value executed 1 time(s) for call c2 but was durably dispatched "
                    "0 time(s)", {"rule": "ran-undispatched", "tool_call_id": "c2"}, "contract")
    for promises, claims in ((SYNC, LG_CLAIMS), (ASYNC, LG_CLAIMS), (EXIT, LG_CLAIMS), (SDK, OA_CLAIMS),
                             (UPSTREAM, HERMES_AGENT_CLAIMS)):
        label_promises([ran], promises)
        assert (ran.promise, ran.promise_doc) == (BEYOND_PROMISE, claims)
    assert promise_of(SYNC, "no-lost-rows") == promise_of(EXIT, "no-lost-rows") == (BROKEN_PROMISE, LG_RESUME)


# ------------------------------------------------------------------ the OpenAI Agents SDK and upstream Hermes
def test_the_sdk_documents_storing_a_run_after_it_ran_and_streamed(tmp_path: Path) -> None:
    labels = _labels(tmp_path, [SHOWN_EARLY, _effect("c1", request=False), _effect("c2", request=True)], SDK)
    assert labels == {("durable-before-visible", DOCUMENTED_BEHAVIOUR, OA_STORED_AFTER_RUN),
                      ("durable-before-effect", DOCUMENTED_BEHAVIOUR, OA_STORED_AFTER_RUN),
                      ("durable-before-effect", BEYOND_PROMISE, OA_CLAIMS)}


def test_upstream_hermes_promises_only_its_stored_history(tmp_path: Path) -> None:
    labels = _labels(tmp_path, [SHOWN_EARLY, _effect("c1", request=False), _effect("c2", request=True)], UPSTREAM)
    assert {(p, d) for _, p, d in labels} == {(BEYOND_PROMISE, HERMES_AGENT_CLAIMS)}
    assert promise_of(UPSTREAM, "no-lost-rows") == (BROKEN_PROMISE, HERMES_AGENT_SESSIONS)
    # One label per invariant whatever the condition, but for a stored preview of an oversized result,
    # which upstream documents: counts stored by (invariant, class) split exactly for the others.
    assert all(uniform_promise(UPSTREAM, inv) is not None for inv in INVARIANTS if inv != "result-fidelity")
    preview = Violation("result-fidelity", "a preview", {"rule": RESULT_PREVIEW}, "damage")
    changed = Violation("result-fidelity", "another result", {}, "damage")
    label_promises([preview, changed], UPSTREAM)
    assert (preview.promise, changed.promise) == (DOCUMENTED_BEHAVIOUR, BEYOND_PROMISE)
    label_promises([preview], SDK)
    assert preview.promise == BEYOND_PROMISE
    assert uniform_promise(SYNC, "effect-semantics") is None and uniform_promise(SYNC, "durable-before-effect") is None


# ------------------------------------------------------------------ the records themselves
def test_every_target_record_names_real_invariants_and_conditions_and_a_document_for_every_label() -> None:
    every = [(t.name, t.promises_for({key: value})) for t in TARGETS.values()
             for key, option in t.options.items() for value in option.choices]
    every += [(t.name, t.promises) for t in TARGETS.values()]
    for name, promises in every:
        assert promises.contract or promises.claims, name
        for (inv, condition), doc in {**promises.promised, **promises.documented}.items():
            assert inv in INVARIANTS, (name, inv)
            assert condition == ANY or condition in CONDITIONS.get(inv, ()), (name, inv, condition)
            assert doc.strip(), (name, inv, condition)
        assert not set(promises.promised) & set(promises.documented), name  # never both at once
    assert [t.name for t in TARGETS.values() if t.promises.contract] == ["hermes"]


# ------------------------------------------------------------------ a real campaign against ours
def _campaign(tmp_path: Path, defect: str, *args: str) -> dict[str, Any]:
    env = dict(os.environ, NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost",
               PYTHONDONTWRITEBYTECODE="1")
    env["PYTHONPATH"] = os.pathsep.join([str(DEFECTS / defect), str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    out = tmp_path / defect
    done = subprocess.run([sys.executable, "-m", "supervisor", "chaos", *args, "--jobs", "2", "--report", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300, start_new_session=True)
    assert (out / "report.json").exists(), done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((out / "report.json").read_text(encoding="utf-8"))


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
@pytest.mark.parametrize(("defect", "args", "invariant"), [
    ("rerun_at_most_once", ("--scenario", "writes", "--probe", "tool.dispatch.after"), "effect-semantics"),
    ("intent_after_dispatch", ("--scenario", "single-tool", "--probe", "tool.dispatch.before"),
     "durable-before-effect"),
], ids=["rerun", "no-intent"])
def test_every_violation_a_planted_defect_causes_in_ours_is_a_broken_promise(tmp_path: Path, defect: str,
                                                                            args: tuple[str, ...],
                                                                            invariant: str) -> None:
    """A rerun of an at-most-once tool and a tool run with no dispatch intent: documented behaviour or
    beyond the promise for a framework, a broken promise for ours, which promises the whole contract."""
    report = _campaign(tmp_path, defect, *args)
    assert report["ok"] is False and invariant in {v["invariant"] for v in report["violations"]}
    assert {(v["promise"], v["promise_doc"]) for v in report["violations"]} == {(BROKEN_PROMISE, OUR_CONTRACT)}
    in_results = [v for r in report["results"] for v in r["verdict"]["violations"]]
    assert in_results and all(v["promise"] == BROKEN_PROMISE for v in in_results)
