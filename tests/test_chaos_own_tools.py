"""`hermes-supervisor chaos --tools MODULE`: a user's own @tool module crash-tested on our runtime.

Real campaigns over examples/notes_tools.py (an at-most-once `add_note` writing a JSON-lines
file under $HERMES_HOME, a read-only `list_notes`), kept small: exhaustive and generated modes
pass, a case reruns from its repro line, a planted defect (tests/defects/own_tool_policy_ignored:
the runtime ignores the policy a user's tool declares, so recovery reruns add_note) fails the
campaign with effect-semantics in both modes (and shrinks over the same tools), and the pytest
plugin takes --tools in its ARGS. Around them,
unit tests of what the campaign reads and draws: the tools' declared policies, arguments drawn
from JSON schemas (each accepted by the tool's own validation; what cannot be drawn refused with
its reason), the wrapped tools' ledger records, and the checker's rules for them.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import xml.etree.ElementTree as ET
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal
from uuid import UUID

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from procutil import run_bounded
from pydantic import BaseModel, Field
from test_checker import SID, Scenario, call

from hermes.tools import AT_MOST_ONCE, IDEMPOTENT, ToolContext, function_tool
from supervisor.chaos import own_tools
from supervisor.chaos.checker import effect_semantics, result_fidelity
from supervisor.chaos.checker.own_results import load_own
from supervisor.chaos.config import CampaignConfig
from supervisor.chaos.plan import options_hash
from supervisor.chaos.schema_draws import Undrawable, strategy
from worker.ledgered_tools import ToolLedger, ledgered

REPO = Path(__file__).resolve().parent.parent
DEFECT = Path(__file__).resolve().parent / "defects" / "own_tool_policy_ignored"
MODULE = "examples.notes_tools"
BOUND_S = 240.0  # only bounds a hang: each campaign here takes 5-40 s


# ===================================================================== processes
def _env(defect: bool = False) -> dict[str, str]:
    path = [*([str(DEFECT)] if defect else []), str(REPO)]
    return dict(os.environ, NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost",
                PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=os.pathsep.join(path))


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_bounded(argv, cwd, env, BOUND_S)


def chaos(*args: str, defect: bool = False) -> subprocess.CompletedProcess[str]:
    return _run(["-m", "supervisor", "chaos", *args], REPO, _env(defect))


def _said(done: subprocess.CompletedProcess[str]) -> str:
    return done.stdout[-4000:] + done.stderr[-4000:]


def _report(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "report.json").read_text())


def _repro_args(repro: str) -> list[str]:
    words = shlex.split(repro)
    assert words[:2] == ["hermes-supervisor", "chaos"], repro
    return words[2:]


# ===================================================================== campaigns
@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_exhaustive_campaign_over_the_notes_tools_passes_and_its_cases_name_tools(tmp_path: Path) -> None:
    done = chaos("--tools", MODULE, "--probe", "tool.dispatch.after", "--jobs", "2", "--report", str(tmp_path))
    assert done.returncode == 0, _said(done)
    assert f"--tools {MODULE}: add_note (at-most-once), list_notes (read-only)" in done.stdout
    report = _report(tmp_path)
    assert report["own_tools"] == {"module": MODULE, "tools": {"add_note": "at-most-once", "list_notes": "read-only"},
                                   "left_out": {}}
    assert report["campaign"]["options"]["tools"] == MODULE
    cases = {json.loads(p.read_text())["case"]: json.loads(p.read_text()) for p in (tmp_path / "cases").glob("*.json")}
    killed = "tool-add_note/probe:self@tool.dispatch.after:1@t0p0"
    assert set(cases) == {"tool-add_note/fault-free", "tool-list_notes/fault-free", killed,
                          "tool-list_notes/probe:self@tool.dispatch.after:1@t0p0"}
    assert cases[killed]["kills"] == 1
    assert cases[killed]["repro"] == f"hermes-supervisor chaos --case '{killed}' --tools {MODULE}"
    counts = cases["tool-add_note/fault-free"]["verdict"]["counts"]
    assert counts["effect-semantics.executions"] == 1  # the user's tool ran through the ledger ...
    assert counts["result-fidelity.results_judged"] == 1  # ... and its result was judged by what it returned
    assert counts["durable-before-effect.effects"] == 1
    again = chaos(*_repro_args(cases[killed]["repro"]))
    assert again.returncode == 0, _said(again)
    assert "kills landed 1" in again.stdout


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_generated_campaign_over_the_notes_tools_passes_and_a_case_reruns_from_its_repro(tmp_path: Path) -> None:
    done = chaos("--tools", MODULE, "--mode", "generated", "--runs", "4", "--seed", "1", "--jobs", "2",
                 "--report", str(tmp_path))
    assert done.returncode == 0, _said(done)
    report = _report(tmp_path)
    conversations = report["campaign"]["conversations"]
    called = {c[0] for conv in conversations.values() for t in conv["conversation"]["turns"]
              for s in t["steps"] for c in s["calls"]}
    assert called <= {"add_note", "list_notes"} and called, conversations
    # What no draw over these tools can have is said, with why, not listed as never reached.
    coverage = report["coverage"]
    assert {"four-turns", "self-restart", "spilled-result"} <= set(coverage["unsupported"]), coverage["unsupported"]
    assert not {"four-turns", "self-restart", "spilled-result"} & set(coverage["unreached"]), coverage["unreached"]
    assert report["campaign"]["undrawn"] == coverage["unsupported"]
    assert "self-restart" in done.stdout and "only the chaos tools' restart_agent" in done.stdout
    case = next(json.loads(p.read_text()) for p in sorted((tmp_path / "cases").glob("*.json"))
                if "fault-free" not in p.name and json.loads(p.read_text())["kills"])
    assert case["repro"].endswith(f"--mode generated --seed 1 --runs 4 --tools {MODULE}"), case["repro"]
    again = chaos(*_repro_args(case["repro"]))
    assert again.returncode == 0, _said(again)
    assert f"kills landed {case['kills']}" in again.stdout


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_a_runtime_that_ignores_the_declared_policy_fails_the_campaign(tmp_path: Path) -> None:
    done = chaos("--tools", MODULE, "--probe", "tool.dispatch.after", "--jobs", "2", "--report", str(tmp_path),
                 defect=True)
    # The warm worker template says so on the supervisor's stderr; a fresh worker in workers.log.
    said = done.stderr + (tmp_path / "workers.log").read_text()
    assert "defect armed: own-tool-policy-ignored" in said and "Error in sitecustomize" not in said, _said(done)
    assert done.returncode == 1, _said(done)
    violations = _report(tmp_path)["violations"]
    assert {(v["invariant"], v["case"]) for v in violations} == {
        ("effect-semantics", "tool-add_note/probe:self@tool.dispatch.after:1@t0p0")}, violations
    assert "at_most_once tool add_note executed 2 times" in violations[0]["message"]
    assert violations[0]["repro"].endswith(f"--tools {MODULE}")


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_generated_mode_finds_the_defect_and_shrinks_it_over_the_same_tools(tmp_path: Path) -> None:
    """Seed 1's tenth and eleventh draws kill a worker after an add_note ran: the defect shows; its
    regression test calls the same tools, fails with the defect and passes without it."""
    report_dir, tests_dir = tmp_path / "report", tmp_path / "regression"
    done = chaos("--tools", MODULE, "--mode", "generated", "--runs", "11", "--seed", "1", "--jobs", "2",
                 "--report", str(report_dir), "--shrink", "--shrink-budget", "8", "--regression-out", str(tests_dir),
                 defect=True)
    assert done.returncode == 1, _said(done)
    report = _report(report_dir)
    assert {v["invariant"] for v in report["violations"]} == {"effect-semantics"}, report["violations"]
    shrunk = report["shrunk"]
    assert [s["invariant"] for s in shrunk] == ["effect-semantics"], shrunk
    calls = [c[0] for t in shrunk[0]["conversation"]["turns"] for st in t["steps"] for c in st["calls"]]
    assert "add_note" in calls and set(calls) <= {"add_note", "list_notes"}, shrunk[0]
    test_file = Path(shrunk[0]["regression_file"])
    assert test_file.parent == tests_dir and f"TOOLS = {MODULE!r}" in test_file.read_text()
    pytest_args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", str(test_file)]
    with_bug = _run(pytest_args, REPO, _env(defect=True))
    assert with_bug.returncode == 1 and "effect-semantics" in with_bug.stdout, _said(with_bug)
    fixed = _run(pytest_args, REPO, _env())
    assert fixed.returncode == 0 and "1 passed" in fixed.stdout, _said(fixed)


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_the_pytest_plugin_takes_tools_in_its_args(tmp_path: Path) -> None:
    load = ["-p", "supervisor.chaos.pytest_plugin"]
    argv = ["-m", "pytest", *load, "-p", "no:cacheprovider", "--rootdir", str(tmp_path), "--hermes-chaos",
            f"--tools {MODULE} --probe tool.dispatch.after", "--junitxml", str(tmp_path / "junit.xml")]
    env = _env()
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # the plugin is loaded once, by -p
    done = _run(argv, tmp_path, env)
    assert done.returncode == 0, _said(done)
    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    assert suite is not None
    names = sorted(case.get("name") for case in suite.iter("testcase"))
    assert names == sorted(["tool-add_note/fault-free", "tool-list_notes/fault-free",
                            "tool-add_note/probe:self@tool.dispatch.after:1@t0p0",
                            "tool-list_notes/probe:self@tool.dispatch.after:1@t0p0"])
    repro = [p.get("value") for p in suite.iter("property") if p.get("name") == "repro"]
    assert repro and all(r.endswith(f"--tools {MODULE}") for r in repro), repro


def test_usage_errors_are_one_line() -> None:
    missing = chaos("--tools", "no_such_module_here", "--list-points")
    assert missing.returncode == 0  # listing needs no tools
    refused = chaos("--tools", "no_such_module_here", "--limit", "1")
    assert refused.returncode == 2 and "neither a toolset" in refused.stderr, _said(refused)
    assert len(refused.stderr.strip().splitlines()) == 1
    both = chaos("--tools", MODULE, "--scenario", "writes")
    assert both.returncode == 2 and "--scenario" in both.stderr, _said(both)


# ===================================================================== what the campaign reads
def test_policies_are_read_from_the_declarations_and_scripts_call_each_tool() -> None:
    loaded = own_tools.load(MODULE)
    assert {t.name: (t.policy, t.parallel_safe, t.kind) for t in loaded.tools} == {
        "add_note": (AT_MOST_ONCE, False, "at-most-once"), "list_notes": (IDEMPOTENT, True, "read-only")}
    own = own_tools.prepare(MODULE, "exhaustive")
    assert own.refused == {}
    scripts = {s.name: s for s in own_tools.scripts(own)}
    assert sorted(scripts) == own_tools.script_names(own) == ["tool-add_note", "tool-list_notes"]
    first = scripts["tool-add_note"].turns[0].replies[0].tool_calls[0]
    assert (first.name, first.arguments) == ("add_note", {"text": "example"})
    assert scripts["tool-list_notes"].turns[0].replies[0].tool_calls[0].arguments == {}


def test_every_worker_gets_the_tools_and_the_plan_hash_names_the_module() -> None:
    plain = CampaignConfig(scenarios=["tool-add_note"])
    own = CampaignConfig(scenarios=["tool-add_note"], tools=MODULE)
    assert own_tools.worker_args(plain) == [] and own_tools.repro_flags(plain) == []
    assert own_tools.worker_args(own) == ["--tools", MODULE, "--ledger-tools"]
    assert own_tools.repro_flags(own) == [f"--tools {MODULE}"]
    assert options_hash(plain) != options_hash(own)
    assert options_hash(own) != options_hash(CampaignConfig(scenarios=["tool-add_note"], tools="other.tools"))


def test_generated_draws_call_only_the_modules_tools_and_follow_from_seed_and_index() -> None:
    drawn = [own_tools.draw_case(3, i, MODULE) for i in range(6)]
    assert [d.conversation.name for d in drawn] == [own_tools.draw_case(3, i, MODULE).conversation.name
                                                   for i in range(6)]
    calls = [c for d in drawn for t in d.conversation.turns for s in t.steps for c in s.calls]
    assert {c.tool for c in calls} == {"add_note", "list_notes"}
    for c in calls:
        arguments = dict(c.arguments)
        if c.tool == "add_note":
            assert set(arguments) == {"text"} and 1 <= len(arguments["text"]) <= 4000
        else:
            assert set(arguments) <= {"limit"} and 1 <= arguments.get("limit", 1) <= 100


class Colour(str, Enum):
    RED = "red"
    BLUE = "blue"


class Point(BaseModel):
    x: int
    y: float = 0.0


def _varied(name: Annotated[str, Field(min_length=2, max_length=9)], count: Annotated[int, Field(ge=-3, lt=40)],
            ratio: Annotated[float, Field(gt=0, le=1)], flag: bool, colour: Colour, mode: Literal["a", "b"],
            tags: Annotated[list[str], Field(min_length=1, max_length=3)], scores: dict[str, int],
            at: datetime, ident: UUID, where: Point, maybe: int | None = None,
            code: Annotated[str, Field(pattern=r"^[A-Z]{3}-[0-9]{2}$")] = "ABC-12") -> str:
    return "ok"


VARIED = function_tool(_varied)


@settings(max_examples=60, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@given(strategy(VARIED.parameters))
def test_drawn_arguments_pass_the_tools_own_validation(arguments: dict[str, Any]) -> None:
    json.dumps(arguments, allow_nan=False)  # what the model server sends
    result = VARIED.handler(json.loads(json.dumps(arguments)), ToolContext(None, None))
    assert result == "ok", (arguments, result)


@pytest.mark.parametrize("schema, reason", [
    ({"type": "string", "format": "ipv4"}, "format 'ipv4'"),
    ({"type": "object", "properties": {"a": {"not": {"type": "null"}}}}, "keyword(s) not"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf without a discriminator"),
    ({"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"},
     "recursive"),
    ({"type": "array", "minItems": 3, "maxItems": 1}, "maxItems below minItems"),
    ({"type": "string", "minLength": 1, "patternProperties": {}}, "patternProperties"),
])
def test_a_schema_that_cannot_be_drawn_is_refused_with_its_reason(schema: dict[str, Any], reason: str) -> None:
    with pytest.raises(Undrawable, match=re.escape(reason)):
        strategy(schema)


def test_an_undrawable_tool_is_left_out_with_the_reason() -> None:
    from supervisor.chaos.own_draws import undrawable
    from supervisor.chaos.own_tools import ToolSpec

    good = ToolSpec("good", IDEMPOTENT, True, {"type": "object", "properties": {"k": {"type": "string"}}})
    odd = ToolSpec("odd", AT_MOST_ONCE, False, {"type": "object", "required": ["ip"],
                                                "properties": {"ip": {"type": "string", "format": "ipv4"}}})
    assert undrawable([good, odd]) == {"odd": "no arguments can be drawn from its schema: a string of format 'ipv4'"}


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_coverage_calls_unexplorable_only_what_no_draw_over_the_tools_can_have(data: st.DataObject) -> None:
    """The features own_draws.undrawn excuses never occur in a conversation over those tools: the
    coverage says why they are not explored instead of calling them never reached."""
    from supervisor.chaos.conversation import set_tool_kinds
    from supervisor.chaos.own_draws import conversations, undrawn
    from supervisor.chaos.own_tools import ToolSpec

    schema = {"type": "object", "properties": {"k": {"type": "string"}}}
    every = {"read": ToolSpec("read", IDEMPOTENT, True, schema), "write": ToolSpec("write", IDEMPOTENT, False, schema),
             "once": ToolSpec("once", AT_MOST_ONCE, False, schema)}
    chosen = data.draw(st.sets(st.sampled_from(sorted(every)), min_size=1), label="tools")
    tools = tuple(every[name] for name in sorted(chosen))
    set_tool_kinds({t.name: t.kind for t in tools})
    excused = undrawn(tools)
    assert {"four-turns", "block-of-5", "self-restart"} <= set(excused)
    assert ("at-most-once" in excused) == ("once" not in chosen)
    talk = data.draw(conversations(tools), label="conversation")
    assert not talk.features() & set(excused), (talk.features() & set(excused), excused)


# ===================================================================== the ledger and the checker
def test_a_wrapped_tool_records_each_run_and_what_it_returned(tmp_path: Path) -> None:
    ledger = ToolLedger(tmp_path / "effects.db", incarnation=1)
    seen: list[dict[str, Any]] = []
    tool = function_tool(_echo, name="echo", policy=AT_MOST_ONCE)
    wrapped = ledgered(tool, ledger, seen.append)
    ctx = ToolContext("task", "c-1", "k-1", SID, "t1")
    assert wrapped.handler({"text": "hi"}, ctx) == '{"echo": "hi"}'
    failed = wrapped.handler({"text": "boom"}, ctx)
    assert json.loads(failed)["error"].startswith("tool 'echo' failed: ZeroDivisionError")
    assert [e["tool"] for e in seen] == ["echo", "echo"]  # each effect reported before it ran
    ledger.close()
    records = load_own(tmp_path / "effects.db")
    assert not isinstance(records, str)
    assert records.returned == {(SID, "t1", "c-1"): ['{"echo": "hi"}', failed]}
    assert records.declared == {"echo": {"policy": AT_MOST_ONCE, "read_only": False}}


def _echo(text: str) -> dict[str, Any]:
    if text == "boom":
        raise ZeroDivisionError("division by zero")
    return {"echo": text}


@pytest.fixture
def scenario(tmp_path: Path) -> Any:
    s = Scenario(tmp_path)
    s.ledger.close()
    s.ledger = ToolLedger(s.ledger_path, incarnation=1)
    yield s
    s.close()


def _run_tool(s: Scenario, c: dict[str, Any], policy: str, returned: str, *, read_only: bool = False,
              key: str | None = None) -> None:
    execution = s.ledger.record_call(session_id=SID, turn_id="t1", tool_call_id=c["id"], tool=c["function"]["name"],
                                     policy=policy, idempotency_key=key or f"{SID}:t1:{c['id']}", read_only=read_only)
    s.ledger.record_return(execution, returned)


def test_result_fidelity_holds_a_users_tool_to_what_its_run_returned(scenario: Scenario) -> None:
    s = scenario
    note = call("c-add", "add_note", '{"text": "milk"}')
    s.user("t1", "note milk")
    s.assistant("t1", None, (note,))
    s.dispatch("t1", note, AT_MOST_ONCE)
    _run_tool(s, note, AT_MOST_ONCE, '{"added": true, "id": 1, "text": "milk"}')
    s.result("t1", note, '{"added": true, "id": 7, "text": "milk"}')  # not what the run returned
    s.assistant("t1", "Noted.")
    s.finish("t1")
    verdict = result_fidelity(s.db_path, own=load_own(s.ledger_path))
    assert verdict.valid is False
    assert "is not what any run of it returned" in verdict.violations[0].message
    assert verdict.violations[0].witness["clean_results"] == ['{"added": true, "id": 1, "text": "milk"}']
    assert result_fidelity(s.db_path).counts["results_unjudged"] == 1  # without the ledger's returns: not judged


def test_result_fidelity_passes_the_recorded_return(scenario: Scenario) -> None:
    s = scenario
    note = call("c-add", "add_note", '{"text": "milk"}')
    s.user("t1", "note milk")
    s.assistant("t1", None, (note,))
    s.dispatch("t1", note, AT_MOST_ONCE)
    _run_tool(s, note, AT_MOST_ONCE, '{"added": true, "id": 1, "text": "milk"}')
    s.result("t1", note, '{"added": true, "id": 1, "text": "milk"}')
    s.assistant("t1", "Noted.")
    s.finish("t1")
    verdict = result_fidelity(s.db_path, own=load_own(s.ledger_path))
    assert verdict.valid is True and verdict.counts["results_judged"] == 1, verdict.to_json()


def test_a_read_only_tool_may_rerun_freely_an_idempotent_one_only_under_one_key(scenario: Scenario) -> None:
    s = scenario
    read = call("c-list", "list_notes", "{}")
    s.user("t1", "list")
    s.assistant("t1", None, (read,))
    s.dispatch("t1", read, IDEMPOTENT)
    s.dispatch("t1", read, IDEMPOTENT)
    _run_tool(s, read, IDEMPOTENT, "[]", read_only=True, key="k-1")
    _run_tool(s, read, IDEMPOTENT, "[]", read_only=True, key="k-2")
    s.result("t1", read, "[]")
    s.assistant("t1", "Nothing yet.")
    s.finish("t1")
    own = load_own(s.ledger_path)
    assert not isinstance(own, str) and own.read_only == {"list_notes"}
    assert effect_semantics(s.db_path, s.ledger_path, read_only=own.read_only).valid is True
    judged_as_idempotent = effect_semantics(s.db_path, s.ledger_path)
    assert judged_as_idempotent.valid is False
    assert "under 2 different idempotency keys" in judged_as_idempotent.violations[0].message


def test_a_wrapped_tool_that_never_ran_cannot_have_a_result(scenario: Scenario) -> None:
    """The worker records every wrapped tool's declaration when it wraps them: a success result of
    one with no run behind it is made up, whichever run it claims."""
    s = scenario
    s.ledger.declare([function_tool(_echo, name="add_note", policy=AT_MOST_ONCE)])
    note = call("c-add", "add_note", '{"text": "milk"}')
    s.user("t1", "note milk")
    s.assistant("t1", None, (note,))
    s.dispatch("t1", note, AT_MOST_ONCE)
    s.result("t1", note, '{"added": true, "id": 1, "text": "milk"}')
    s.assistant("t1", "Noted.")
    s.finish("t1")
    own = load_own(s.ledger_path)
    assert not isinstance(own, str) and set(own.declared) == {"add_note"} and own.returned == {}
    assert result_fidelity(s.db_path, own=own).valid is False
    verdict = s.check()
    assert {v.invariant for v in verdict.violations} == {"effect-semantics", "result-fidelity"}, verdict.to_json()
