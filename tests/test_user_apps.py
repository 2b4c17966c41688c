"""A user's own LangGraph graph and Agents SDK agent, crash-tested unchanged
(``--target langgraph --target-option app=MODULE:build``, ``--target openai-agents --target-option
agent=MODULE:agent``): the free-form target options, the tool policies, reading the apps' tools,
and generated campaigns over the two example apps, copied out of the project's tree first."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from procutil import run_bounded

from targetkit import OptionError, Target, TargetOption, parse_policies, tool_policy
from targetkit.policies import UNDECLARED, declared_policy, resolve

REPO = Path(__file__).resolve().parent.parent
APPS = REPO / "examples" / "user_apps"
BOUND_S = 240.0  # only bounds a hang: each campaign here takes 15-60 s
PROMISES = {"broken-promise", "beyond-promise", "documented-behaviour"}
POLICIES = "policies=add_note:at_most_once,save_contact:idempotent"


# ===================================================================== options and policies
def _target(**options: TargetOption) -> Target:
    return Target("t", "a target", adapter="m", schema="m:R", options=options)


def test_an_import_path_option_takes_module_attribute_and_never_a_file() -> None:
    target = _target(app=TargetOption.import_path(), mode=TargetOption(("a", "b"), "a"))
    assert target.check_options({"app": "my_pkg.graphs:build"}) == {"app": "my_pkg.graphs:build", "mode": "a"}
    assert target.check_options({}) == {"mode": "a"}  # not given: absent, so older campaigns keep their options
    for bad in ("user_graph.py", "apps/user_graph:build", "user graph:build", "1x:build", "x:"):
        with pytest.raises(OptionError, match="takes package.module:NAME"):
            target.check_options({"app": bad})
    with pytest.raises(OptionError, match="never a file path"):
        target.check_options({"app": "user_graph.py:build"})


def test_key_all_spreads_a_choice_option_and_refuses_a_free_form_one() -> None:
    target = _target(app=TargetOption.import_path(), mode=TargetOption(("a", "b"), "a"))
    assert target.spread("mode") == ("a", "b")
    with pytest.raises(OptionError, match="KEY=all is for a choice option"):
        target.spread("app")
    with pytest.raises(OptionError, match="has no option 'nope'"):
        target.spread("nope")
    with pytest.raises(ValueError):
        TargetOption(("a",), "a", pattern="x")  # a free-form option has no choices


def test_tool_policies_parse_and_refuse_unknown_policies() -> None:
    assert parse_policies("add_note:at_most_once,lookup:read_only") == {"add_note": "at_most_once",
                                                                        "lookup": "read_only"}
    assert parse_policies("") == {}
    with pytest.raises(OptionError):
        parse_policies("add_note:twice")
    option = TargetOption.tool_policies()
    assert option.refusal("a:idempotent") is None and option.refusal("a=idempotent") is not None


def test_a_policy_comes_from_the_option_then_the_tools_mark_then_at_most_once() -> None:
    from agents import function_tool
    from langchain_core.tools import tool

    @tool_policy("read_only")
    @tool
    def lookup(city: str) -> str:
        """Look a city up."""
        return city

    @tool_policy("idempotent")
    @function_tool
    def save(name: str) -> str:
        """Save a name."""
        return name

    @tool
    @tool_policy("idempotent")
    def marked_below(x: int) -> int:
        """A function marked before @tool wrapped it."""
        return x

    assert declared_policy(lookup) == "read_only" and declared_policy(save) == "idempotent"
    assert declared_policy(marked_below) == "idempotent"
    tools = {"lookup": lookup, "save": save, "other": object()}
    assert resolve(list(tools), tools, "save:at_most_once") == {"lookup": "read_only", "save": "at_most_once",
                                                                "other": UNDECLARED}
    assert UNDECLARED == "at_most_once"
    with pytest.raises(OptionError, match="does not offer"):
        resolve(list(tools), tools, "missing:idempotent")
    with pytest.raises(ValueError):
        tool_policy("sometimes")


# ===================================================================== reading the apps' tools
@pytest.fixture()
def apps(tmp_path: Path) -> Iterator[Path]:
    """The example apps copied to a directory of their own, importable from it (and nowhere in the project)."""
    where = tmp_path / "apps"
    shutil.copytree(APPS, where)
    sys.path.insert(0, str(where))
    try:
        yield where
    finally:
        sys.path.remove(str(where))
        for name in ("user_graph", "user_agent"):
            sys.modules.pop(name, None)


def test_the_graphs_tools_are_read_from_its_tool_node(apps: Path) -> None:
    from worker.targets.langgraph_app import AppUnusable, declared

    tools = {t["name"]: t for t in declared("user_graph:build", {"policies": "save_contact:idempotent"})}
    assert set(tools) == {"add_note", "save_contact"}
    assert tools["save_contact"]["policy"] == "idempotent" and tools["add_note"]["policy"] == "at_most_once"
    assert tools["save_contact"]["parameters"]["required"] == ["name", "phone"]
    assert "OPENAI_BASE_URL" not in os.environ or os.environ["OPENAI_BASE_URL"] != "http://127.0.0.1:9/v1"
    with pytest.raises(AppUnusable, match="cannot import"):
        declared("no_such_app_here:build", {})
    with pytest.raises(OptionError, match="does not offer"):
        declared("user_graph:build", {"policies": "send_mail:idempotent"})


PREBUILT = """
from langchain_openai import ChatOpenAI
from langchain_core.tools import tool
from langgraph.prebuilt import create_react_agent
from targetkit import tool_policy


@tool_policy("read_only")
@tool
def weather(city: str) -> str:
    \"\"\"Today's weather in a city.\"\"\"
    return city + ": sunny"


def build(checkpointer):
    return create_react_agent(ChatOpenAI(model="gpt-4o-mini"), [weather], checkpointer=checkpointer)
"""


@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")  # still what many apps call
def test_a_prebuilt_react_agent_and_a_policy_marked_on_the_tool(apps: Path) -> None:
    from worker.targets.langgraph_app import declared

    (apps / "prebuilt_graph.py").write_text(PREBUILT, encoding="utf-8")
    try:
        tools = declared("prebuilt_graph:build", {})
    finally:
        sys.modules.pop("prebuilt_graph", None)
    assert [(t["name"], t["policy"]) for t in tools] == [("weather", "read_only")]


def test_a_graph_compiled_with_its_own_checkpointer_is_given_ours(apps: Path) -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    from worker.targets.langgraph_app import app_tools, build_graph, discovery_env

    (apps / "own_saver_graph.py").write_text(
        "from langgraph.checkpoint.memory import InMemorySaver\n"
        "import user_graph\n"
        "graph = user_graph.build(InMemorySaver())\n"
        "def make():\n    return graph\n", encoding="utf-8")
    ours = InMemorySaver()
    try:
        for spec in ("own_saver_graph:graph", "own_saver_graph:make", "user_graph:build"):
            with discovery_env():  # the app makes its model at import: a key it is never called with
                built = build_graph(spec, ours)
            assert built.checkpointer is ours and set(app_tools(built)) == {"add_note", "save_contact"}, spec
    finally:
        sys.modules.pop("own_saver_graph", None)


def test_the_agents_function_tools_are_read_with_their_schemas(apps: Path) -> None:
    from worker.targets.openai_agents_app import declared

    tools = {t["name"]: t for t in declared("user_agent:agent", {"policies": POLICIES.partition("=")[2]})}
    assert {n: t["policy"] for n, t in tools.items()} == {"add_note": "at_most_once", "save_contact": "idempotent"}
    assert tools["add_note"]["parameters"]["properties"]["text"]["type"] == "string"


# ===================================================================== campaigns
def _env(apps: Path) -> dict[str, str]:
    return dict(os.environ, NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost",
                PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=os.pathsep.join([str(apps), str(REPO)]))


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_bounded(argv, cwd, env, BOUND_S)


def by_promise(report: dict[str, Any]) -> Counter[tuple[str, str, str]]:
    """(class, promise, invariant) -> violations, over every case of a report."""
    found: Counter[tuple[str, str, str]] = Counter()
    for result in report["results"]:
        for v in result["verdict"].get("violations", []):
            found[(v["class"], v.get("promise"), v["invariant"])] += 1
    return found


def _campaign(apps: Path, tmp_path: Path, *target: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    report = tmp_path / "report"
    done = _run(["-m", "supervisor", "chaos", *target, "--mode", "generated", "--runs", "3", "--seed", "1",
                 "--jobs", "2", "--report", str(report), "--workdir", str(tmp_path / "cases")], apps, _env(apps))
    assert (report / "report.json").exists(), done.stdout[-3000:] + done.stderr[-3000:]
    return done, json.loads((report / "report.json").read_text())


def _judge(done: subprocess.CompletedProcess[str], report: dict[str, Any], tmp_path: Path) -> Counter[Any]:
    said = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 1, said  # these frameworks keep less than our contract: findings, never a crash
    assert report["complete"] and not report["unknown"], said  # every case judged
    assert report["own_tools"]["tools"] == {"add_note": "at-most-once", "save_contact": "idempotent"}, said
    found = by_promise(report)
    assert found and {promise for _c, promise, _i in found} <= PROMISES, found
    # What each run of a wrapped tool returned is in the ledger: no result the checker cannot place.
    assert not any(inv == "result-fidelity" for _c, _p, inv in found), found
    assert sum(r["verdict"]["counts"].get("result-fidelity.results_judged", 0) for r in report["results"]) > 0
    # The tools ran for real, in their cases' own directories.
    assert any((tmp_path / "cases").rglob("notebook.jsonl")) or any((tmp_path / "cases").rglob("contacts"))
    assert not (tmp_path / "apps" / "notebook.jsonl").exists()
    return found


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_a_users_langgraph_app_runs_unchanged_under_a_generated_campaign(apps: Path, tmp_path: Path) -> None:
    done, report = _campaign(apps, tmp_path, "--target", "langgraph", "--target-option", "app=user_graph:build",
                             "--target-option", POLICIES)
    found = _judge(done, report, tmp_path)
    # LangGraph records no dispatch intent: a contract finding it never promised otherwise.
    assert found[("contract", "beyond-promise", "durable-before-effect")] > 0, found
    assert "--target-option app=user_graph:build" in done.stdout


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_a_users_agents_sdk_agent_runs_unchanged_under_a_generated_campaign(apps: Path, tmp_path: Path) -> None:
    done, report = _campaign(apps, tmp_path, "--target", "openai-agents", "--target-option", "agent=user_agent:agent",
                             "--target-option", POLICIES)
    found = _judge(done, report, tmp_path)
    # The SDK stores a run's items after its tools ran, as its Sessions page says.
    assert found[("contract", "documented-behaviour", "durable-before-effect")] > 0, found


def test_an_app_given_as_a_file_or_spread_with_all_is_a_one_line_usage_error(tmp_path: Path) -> None:
    for option, said in (("app=user_graph.py", "never a file path"), ("app=all", "KEY=all is for a choice option"),
                         ("policies=add_note:idempotent", "give it with app=")):
        done = _run(["-m", "supervisor", "chaos", "--target", "langgraph", "--target-option", option], tmp_path,
                    _env(tmp_path))
        assert done.returncode == 2 and said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_the_pytest_plugin_takes_a_users_graph(apps: Path, tmp_path: Path) -> None:
    argv = ["-m", "pytest", "-p", "supervisor.chaos.pytest_plugin", "-p", "no:cacheprovider", "--rootdir",
            str(tmp_path), "--hermes-chaos", f"--target langgraph --target-option app=user_graph:build "
            f"--target-option {POLICIES} --probe tool.dispatch.after", "--junitxml", str(tmp_path / "junit.xml")]
    env = _env(apps)
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # the plugin is loaded once, by -p
    done = _run(argv, apps, env)
    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    assert suite is not None, done.stdout[-3000:]
    names = sorted(case.get("name") for case in suite.iter("testcase"))
    assert names == sorted(["tool-add_note/fault-free", "tool-save_contact/fault-free",
                            "tool-add_note/probe:self@tool.dispatch.after:1@t0p0",
                            "tool-save_contact/probe:self@tool.dispatch.after:1@t0p0"]), done.stdout[-3000:]
    assert done.returncode == 1  # LangGraph writes no dispatch intents: each case has contract findings
