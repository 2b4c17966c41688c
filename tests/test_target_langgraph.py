"""The langgraph target (`--target langgraph`): a LangGraph StateGraph in the worker, LangGraph's raw
checkpoint store in the checker, LangGraph's durability modes as a campaign option."""
from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from test_chaos_campaign import read_report, supervisor

from hermes.probes import POINTS
from hermes.state import SessionDB, open_snapshot
from supervisor import cli
from supervisor.chaos.checker import check_structure
from supervisor.chaos.config import CampaignConfig
from supervisor.chaos.durable import load_durable
from supervisor.chaos.generator import Case
from supervisor.chaos.scenarios import MODEL, SCENARIOS, campaign_script
from supervisor.chaos.schema import langgraph as reader
from targetkit import registry
from targetkit.registry import schema_of
from worker import targets as worker_targets
from worker.targets import UsageError
from worker.targets import langgraph as adapter

TARGET = registry.get("langgraph")
needs_langgraph = pytest.mark.skipif(not TARGET.available(), reason="LangGraph is not installed "
                                     "(./scripts/setup langgraph)")
SESSION = "lg-test"


# ------------------------------------------------------------- without LangGraph
def test_a_missing_langgraph_is_a_usage_error_with_the_install_hint(monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    absent = dataclasses.replace(TARGET, modules=("no_such_module_for_the_langgraph_target",))
    real = registry.get
    monkeypatch.setattr(registry, "get", lambda name: absent if name == "langgraph" else real(name))
    assert cli.main(["chaos", "--target", "langgraph", "--scenario", "single-tool"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "scripts/setup langgraph" in err[0]
    with pytest.raises(UsageError, match=r"scripts/setup langgraph"):
        worker_targets.adapter("langgraph")


def test_durability_belongs_to_langgraph_and_its_points_are_listed(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["chaos", "--durability", "sync", "--scenario", "single-tool"]) == cli.EXIT_USAGE
    assert "--target hermes has no option 'durability'" in capsys.readouterr().err
    assert cli.main(["chaos", "--target", "langgraph", "--target-option", "durability=fast"]) == cli.EXIT_USAGE
    assert "takes exit, async, sync, not 'fast'" in capsys.readouterr().err
    assert cli.main(["chaos", "--list-points", "--target", "langgraph"]) == cli.EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(POINTS)
    assert [line.split()[0] for line in lines if "not reached on langgraph" in line] == list(TARGET.unreachable)


def test_target_options_reach_every_worker_and_every_repro_line(tmp_path: Path) -> None:
    from supervisor.chaos.runner import CaseRunner

    config = CampaignConfig(scenarios=["single-tool"], target="langgraph", target_options=(("durability", "exit"),))
    runner = CaseRunner(Case("single-tool"), tmp_path, "http://127.0.0.1:9/v1", None, None, config)  # type: ignore[arg-type]
    argv = runner.worker_args("resume", tmp_path / "state.db", tmp_path / "effects.db", "http://127.0.0.1:9/v1")
    assert argv[-4:] == ["--target", "langgraph", "--target-option", "durability=exit"]
    assert runner._repro_flags() == ("--target langgraph", "--target-option durability=exit")


def test_the_reader_recognizes_only_a_langgraph_store(tmp_path: Path) -> None:
    ours = tmp_path / "ours.db"
    SessionDB(ours).close()
    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    conn.executescript("CREATE TABLE checkpoints (thread_id TEXT); CREATE TABLE writes (x);")
    conn.close()
    for path in (ours, other):
        conn = open_snapshot(path)
        try:
            assert not reader.recognizes(conn)
        finally:
            conn.close()


# --------------------------------------------------------------- with LangGraph
def _args(db: Path, command: str, url: str, *extra: str) -> Any:
    from worker import main as worker_main

    argv = [command, "--target", "langgraph", "--db", str(db), "--session", SESSION, "--base-url", url,
            "--model", MODEL, "--ledger", str(db.parent / "effects.db"), *extra]
    args = worker_main._parser().parse_args(argv)
    worker_main._validate(args)
    return args


def _execute(args: Any) -> dict[str, Any]:
    outcomes: list[dict[str, Any]] = []
    adapter.execute(args, None, lambda out: outcomes.append(out) or 0)
    return outcomes[-1]


@pytest.fixture
def model_url() -> Any:
    from testkit.modelserver import ScriptedModelServer

    with ScriptedModelServer(campaign_script([SCENARIOS["writes"]]), model=MODEL) as server:
        yield server.base_url


@needs_langgraph
def test_a_turn_runs_and_the_reader_reads_the_raw_store(tmp_path: Path, model_url: str) -> None:
    db = tmp_path / "state.db"
    turn = SCENARIOS["writes"].turns[0]
    out = _execute(_args(db, "run", model_url, "--message", turn.message, "--turn-id", "turn-0"))
    assert out["outcome"] == "completed" and out["final_response"] == turn.answer and out["durability"] == "sync"

    conn = open_snapshot(db)
    try:
        assert reader.recognizes(conn) and schema_of(conn) is reader
        assert reader.turn_state(conn, SESSION, "turn-0") == "done"
        assert reader.turn_state(conn, SESSION, "turn-1") is None
        assert [r.role for r in reader.turn_rows(conn, SESSION, "turn-0")] == ["user", "assistant", "tool", "tool",
                                                                               "assistant"]
        assert reader.intent_attempts(conn, SESSION, "turn-0", "any") == []
    finally:
        conn.close()
    durable = load_durable(db)
    assert durable.error is None and durable.sessions == [SESSION] and durable.dispatches == []
    assert [(t["id"], t["state"], t["user_text"]) for t in durable.turns] == [("turn-0", "done", turn.message)]
    calls = durable.rows[1]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["append_note", "set_value"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"text": "remember the flag"}
    assert [r["tool_call_id"] for r in durable.rows[2:4]] == [c["id"] for c in calls]
    assert check_structure(db).valid is True

    again = _execute(_args(db, "run", model_url, "--message", turn.message, "--turn-id", "turn-0"))
    assert again["turn_exit_reason"] == "already_finished" and again["api_calls"] == 0
    assert len(load_durable(db).rows) == 5, "a finished turn asked again is a no-op, never a second copy"


@needs_langgraph
def test_saved_pending_writes_count_as_durable_and_resume_replays_them(tmp_path: Path, model_url: str) -> None:
    """Cut the thread back to the checkpoint before the final answer's: the agent task's saved
    writes (the answer) are durable, and LangGraph's resume applies them without a model call."""
    db = tmp_path / "state.db"
    turn = SCENARIOS["writes"].turns[0]
    _execute(_args(db, "run", model_url, "--message", turn.message, "--turn-id", "turn-0"))
    conn = sqlite3.connect(db)
    last = conn.execute("SELECT checkpoint_id FROM checkpoints ORDER BY checkpoint_id DESC LIMIT 1").fetchone()[0]
    conn.execute("DELETE FROM checkpoints WHERE checkpoint_id = ?", (last,))
    conn.commit()
    conn.close()
    durable = load_durable(db)
    assert [t["state"] for t in durable.turns] == ["done"] and durable.rows[-1]["content"] == turn.answer

    resumed = _execute(_args(db, "resume", model_url))
    assert resumed["outcome"] == "completed" and resumed["final_response"] == turn.answer
    assert resumed["api_calls"] == 0, "the agent's saved writes were replayed, not recomputed"
    assert len(load_durable(db).rows) == 5 and check_structure(db).valid is True
    assert _execute(_args(db, "resume", model_url))["outcome"] == "nothing to resume"


@needs_langgraph
def test_a_task_whose_writes_were_not_saved_runs_again_on_resume(tmp_path: Path, model_url: str) -> None:
    """Cut the thread back to before the final answer, writes included: the turn is running
    (four rows durable), and LangGraph's resume runs the agent node again."""
    db = tmp_path / "state.db"
    turn = SCENARIOS["writes"].turns[0]
    _execute(_args(db, "run", model_url, "--message", turn.message, "--turn-id", "turn-0"))
    conn = sqlite3.connect(db)
    ids = [r[0] for r in conn.execute("SELECT checkpoint_id FROM checkpoints ORDER BY checkpoint_id DESC LIMIT 2")]
    conn.execute("DELETE FROM checkpoints WHERE checkpoint_id = ?", (ids[0],))
    conn.execute("DELETE FROM writes WHERE checkpoint_id IN (?, ?)", tuple(ids))
    conn.commit()
    conn.close()
    durable = load_durable(db)
    assert [t["state"] for t in durable.turns] == ["running"] and len(durable.rows) == 4

    resumed = _execute(_args(db, "resume", model_url))
    assert resumed["outcome"] == "completed" and resumed["api_calls"] == 1
    assert [t["state"] for t in load_durable(db).turns] == ["done"] and check_structure(db).valid is True


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
@needs_langgraph
def test_a_short_exhaustive_campaign_judges_every_case(tmp_path: Path) -> None:
    out = tmp_path / "report"
    done = supervisor("chaos", "--target", "langgraph", "--durability", "sync", "--mode", "exhaustive",
                      "--scenario", "single-tool", "--probe", "flush.in_txn", "--probe", "tool.dispatch.after",
                      "--probe", "finalize.before", "--jobs", "2", "--report", str(out))
    report = read_report(out)
    assert done.returncode == (0 if report["ok"] else 1), done.stdout[-3000:] + done.stderr[-3000:]
    assert report["cases"] > 1 and report["kills"] > 0 and report["unknown"] == []
    assert all(v["class"] in ("damage", "contract") for v in report["violations"])
    # LangGraph records no dispatch intents: a CONTRACT finding, never DAMAGE.
    assert {v["class"] for v in report["violations"] if v["invariant"] == "durable-before-effect"} <= {"contract"}
    assert all("--target langgraph --target-option durability=sync" in r["repro"] for r in report["results"])


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
@needs_langgraph
def test_a_sync_campaign_labels_each_violation_with_what_langgraph_promised(tmp_path: Path) -> None:
    """Under "sync": no dispatch intent is beyond what LangGraph claims, a tools node killed mid-way runs
    again as it documents, and a rerun after a kill inside the next checkpoint's save is the promise it
    breaks (issue #8039). That last one depends on a race between two background saves, so it is
    required only to be labelled right where it occurs (the unit tests in test_promises.py force it)."""
    out = tmp_path / "report"
    done = supervisor("chaos", "--target", "langgraph", "--durability", "sync", "--mode", "exhaustive",
                      "--scenario", "writes", "--probe", "tool.dispatch.after", "--probe", "flush.begin",
                      "--probe", "flush.in_txn", "--jobs", "2", "--report", str(out))
    report = read_report(out)
    assert done.returncode == 1 and report["unknown"] == [], done.stdout[-3000:] + done.stderr[-3000:]
    labels = {(v["invariant"], v["class"], v["promise"]) for v in report["violations"]}
    assert {("durable-before-effect", "contract", "beyond-promise"), ("effect-semantics", "contract", "beyond-promise"),
            ("effect-semantics", "damage", "documented-behaviour")} <= labels, labels
    # The model's tool-call message is saved before its tools run, as "sync" promises: no request was missing.
    assert not any(v["invariant"] == "durable-before-effect" and v["promise"] != "beyond-promise"
                   for v in report["violations"])
    for v in report["violations"]:
        assert v["promise_doc"] and v["promise"] in ("broken-promise", "documented-behaviour", "beyond-promise")
        if v["promise"] == "broken-promise":
            assert v["invariant"] == "effect-semantics" and (v["probe"] or "").startswith("flush."), v
            assert "langgraph/issues/8039" in v["promise_doc"]
    reruns = [v for v in report["violations"]
              if v["class"] == "damage" and (v["probe"] or "").startswith("tool.dispatch")]
    assert reruns and {v["promise"] for v in reruns} == {"documented-behaviour"}


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
@needs_langgraph
def test_an_exit_campaign_finds_only_what_langgraph_documents_or_never_claimed(tmp_path: Path) -> None:
    """Under "exit" nothing is saved before the run ends: every tool runs before anything durable asks for
    it and every step is shown before it is saved (documented), and no dispatch intent is ever written
    (beyond its claims); nothing it promises is broken. The fault-free case alone already shows both."""
    out = tmp_path / "report"
    done = supervisor("chaos", "--target", "langgraph", "--durability", "exit", "--mode", "exhaustive",
                      "--scenario", "writes", "--probe", "tool.dispatch.after", "--jobs", "2", "--report", str(out))
    report = read_report(out)
    assert done.returncode == 1 and report["unknown"] == [], done.stdout[-3000:] + done.stderr[-3000:]
    by_label = {v["promise"] for v in report["violations"]}
    assert by_label == {"documented-behaviour", "beyond-promise"}, by_label
    fault_free = [v for v in report["violations"] if v["probe"] is None]
    assert {(v["invariant"], v["promise"]) for v in fault_free} >= {
        ("durable-before-effect", "documented-behaviour"), ("durable-before-visible", "documented-behaviour"),
        ("effect-semantics", "beyond-promise")}
    assert all('durability "exit"' in v["promise_doc"] for v in report["violations"]
               if v["invariant"] in ("durable-before-effect", "durable-before-visible"))


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
@needs_langgraph
def test_durability_all_runs_one_campaign_per_mode(tmp_path: Path) -> None:
    out = tmp_path / "report"
    done = supervisor("chaos", "--target", "langgraph", "--durability", "all", "--case", "single-tool/fault-free",
                      "--report", str(out), "--workdir", str(tmp_path / "work"))
    figures = json.loads((out / "durability.json").read_text())
    assert list(figures) == ["exit", "async", "sync"]
    assert done.returncode == max(f["exit"] for f in figures.values()), done.stdout[-3000:]
    for mode in figures:
        report = read_report(out / mode)
        assert report["cases"] == 1
        assert report["results"][0]["repro"].endswith(f"--target langgraph --target-option durability={mode}")
        assert (tmp_path / "work" / mode).is_dir()
