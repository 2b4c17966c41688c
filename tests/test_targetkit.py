"""targetkit: a target is one record, found through an entry point, by the supervisor and the worker alike."""
from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from pluginutil import installed_plugin

from hermes.probes import POINTS
from targetkit import FULL_PROMISES, OptionError, Promises, Target, TargetOption, registry
from targetkit.target import as_worker_args, option_pairs

REPO = Path(__file__).resolve().parents[1]


def test_ours_are_registered_as_entry_points_and_as_the_checkout_fallback_alike() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    declared = project["project"]["entry-points"][registry.GROUP]
    assert declared == registry.BUILTIN
    for name in registry.BUILTIN:
        target = registry.get(name)
        assert target.name == name and set(target.unreachable) <= set(POINTS)
        assert all(reason.strip() for reason in target.unreachable.values())


def test_options_are_checked_by_their_target() -> None:
    promises = {"a": Promises(claims="a"), "b": Promises(claims="b")}
    target = Target("t", "a test target", adapter="x", schema="y",
                    options={"mode": TargetOption(("a", "b"), "a", "how it saves")},
                    promises_with=lambda options: promises[options["mode"]])
    assert target.check_options({}) == {"mode": "a"}
    assert target.promises_for({"mode": "b"}).claims == "b" and target.promises_for().claims == "a"
    with pytest.raises(OptionError, match="has no option 'speed'"):
        target.check_options({"speed": "1"})
    with pytest.raises(OptionError, match="takes a, b, not 'c'"):
        target.check_options({"mode": "c"})
    assert option_pairs(["mode=b", " x = y "]) == {"mode": "b", "x": "y"}
    with pytest.raises(OptionError, match="KEY=VALUE"):
        option_pairs(["mode"])
    assert as_worker_args({"mode": "b"}) == ["--target-option", "mode=b"]
    assert Target("u", "", adapter="x", schema="y").promises_for({}) is FULL_PROMISES


@pytest.mark.parametrize("choices", [("../up",), ("a/b",), ("all",), (".hidden",), ("",)])
def test_an_option_value_that_cannot_name_a_directory_is_refused(choices: tuple[str, ...]) -> None:
    with pytest.raises(ValueError, match="target option values"):
        TargetOption(choices, choices[0])


PLUGIN = '''
from targetkit import Promises, Target, TargetOption

TARGET = Target("toy-loop", "a toy loop from another package", adapter="toy_target.adapter",
                schema="toy_target.schema", promises=Promises(claims="toy docs"),
                options={"flush": TargetOption(("each", "end"), "each", "when it writes")},
                unreachable={"compact.in_txn": "the toy never compacts"})
NOT_A_TARGET = 42
'''


def _installed_plugin(where: Path, entry: str = "toy-loop = toy_target:TARGET") -> dict[str, str]:
    return installed_plugin(where, "toy_target", PLUGIN, registry.GROUP, entry)


def _supervisor(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", "chaos", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120, start_new_session=True)


def test_a_target_from_another_package_is_found_with_no_edit_here(tmp_path: Path) -> None:
    env = _installed_plugin(tmp_path / "site")
    listed = _supervisor(env, "--list-targets")
    assert listed.returncode == 0, listed.stderr
    assert "toy-loop  a toy loop from another package" in listed.stdout
    assert "--target-option flush=each|end  (default each): when it writes" in listed.stdout
    assert "toy-loop  a toy loop from another package\n    workers: forks of the warm template" in listed.stdout
    points = _supervisor(env, "--target", "toy-loop", "--list-points")
    assert "compact.in_txn  (not reached on toy-loop: the toy never compacts)" in points.stdout
    bad = _supervisor(env, "--target", "toy-loop", "--target-option", "flush=never")
    assert bad.returncode == 2 and "takes each, end, not 'never'" in bad.stderr
    worker = subprocess.run([sys.executable, "-m", "worker", "run", "--target", "toy-loop", "--target-option",
                             "speed=1", "--db", str(tmp_path / "w.db"), "--session", "s", "--message", "hi",
                             "--base-url", "http://127.0.0.1:9/v1", "--model", "m"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=120, start_new_session=True)
    assert worker.returncode == 2 and "--target toy-loop has no option 'speed'" in worker.stderr


def test_an_unknown_or_broken_target_is_a_usage_error_naming_what_exists(tmp_path: Path) -> None:
    env = _installed_plugin(tmp_path / "site", "toy-broken = toy_target:NOT_A_TARGET")
    unknown = _supervisor(env, "--target", "nope", "--list-points")
    assert unknown.returncode == 2 and "unknown target 'nope'; known: hermes, hermes-agent" in unknown.stderr
    broken = _supervisor(env, "--target", "toy-broken", "--list-points")
    assert broken.returncode == 2 and "is a int, not a targetkit.Target" in broken.stderr
    listed = _supervisor(env, "--list-targets")
    assert listed.returncode == 0 and "toy-broken  (does not load:" in listed.stdout


def test_a_complete_campaign_owes_every_point_but_those_its_target_declares_unreachable() -> None:
    from supervisor.chaos.plan import unreached
    from supervisor.chaos.scenarios import SCENARIOS

    opts = {"scenarios": sorted(SCENARIOS), "case_ids": [], "probes": [], "mode": "exhaustive"}
    declared = registry.get("openai-agents").unreachable
    reached = set(POINTS) - set(declared) - {"model.chunk"}
    assert unreached({**opts, "target": "openai-agents"}, reached) == ["model.chunk"]
    assert unreached({**opts, "target": "hermes"}, reached) == [p for p in POINTS if p not in reached]
    assert unreached({**opts, "target": "not-installed-here"}, reached) == [p for p in POINTS if p not in reached]


def test_workers_fork_from_the_warm_template_unless_the_target_says_why_not() -> None:
    assert Target("t", "", adapter="x", schema="y").forkserver is True
    refused = Target("t", "", adapter="x", schema="y", forkserver=False, no_fork_reason="it starts threads at import")
    assert refused.workers() == "workers: fresh interpreters (it starts threads at import)"
    silent = Target("t", "", adapter="x", schema="y", forkserver=False)
    assert "without a reason" in silent.workers()


def test_the_kit_exports_what_its_docs_use() -> None:
    """docs/targets.md builds a target with these names: each is exported, so it is under the
    stability promise of targetkit/__init__.py."""
    import re

    import targetkit

    docs = (REPO / "docs" / "targets.md").read_text(encoding="utf-8")
    used = set(re.findall(r"targetkit\.(?:loop\.|sql\.|schema\.|target\.)?([A-Za-z_]\w*)", docs)) - {
        "loop", "sql", "schema", "target", "registry"}
    assert used, "the docs name the kit's parts"
    assert used <= set(targetkit.__all__), sorted(used - set(targetkit.__all__))
    for name in targetkit.__all__:
        assert getattr(targetkit, name) is not None, name


def test_the_promise_presets_say_which_findings_are_damage_and_which_are_documented() -> None:
    from supervisor.chaos.checker.promises import promise_of
    from targetkit import RERUN, at_least_once_framework, plain_loop

    loop = plain_loop("my loop's README")
    assert not loop.dispatch_intents and loop.durable_requests and loop.durable_projections
    assert promise_of(loop, "effect-semantics", RERUN) == ("beyond-promise", "my loop's README")
    framework = at_least_once_framework("the framework's persistence page", "the page on resuming a step")
    assert not framework.durable_projections and not framework.dispatch_intents
    assert promise_of(framework, "effect-semantics", RERUN) == ("documented-behaviour", "the page on resuming a step")
