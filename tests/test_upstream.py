"""The upstream target (`--target hermes-agent`): upstream Hermes in the worker, its schema in the checker."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from hermes.probes import POINTS
from supervisor import cli
from supervisor.chaos.checker import check_structure
from supervisor.chaos.schema import hermes_agent as upstream_schema
from worker.targets import hermes_agent as upstream


def _upstream_like_db(path: Path, rows: list[tuple[str, str | None, str | None, str | None]]) -> Path:
    """A database in the shape of upstream's messages table (just the columns the reader uses)."""
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT NOT NULL, started_at REAL NOT NULL);"
        "CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, role TEXT NOT NULL,"
        " content TEXT, tool_call_id TEXT, tool_calls TEXT, tool_name TEXT, timestamp REAL NOT NULL,"
        " active INTEGER NOT NULL DEFAULT 1);")
    conn.execute("INSERT INTO sessions VALUES ('s', 'cli', 1.0)")
    for i, (role, content, call_id, calls) in enumerate(rows):
        conn.execute("INSERT INTO messages (session_id, role, content, tool_call_id, tool_calls, timestamp) "
                     "VALUES ('s', ?, ?, ?, ?, ?)", (role, content, call_id, calls, float(i)))
    conn.commit()
    conn.close()
    return path


CALL = json.dumps([{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}])


def test_reader_derives_turns_from_upstream_rows(tmp_path: Path) -> None:
    db = _upstream_like_db(tmp_path / "state.db", [
        ("user", "q0", None, None), ("assistant", None, None, CALL), ("tool", "r", "c1", None),
        ("assistant", "a0", None, None), ("user", "q1", None, None), ("assistant", None, None, CALL)])
    assert upstream_schema.is_upstream(db)
    sessions, rows, turns = upstream_schema.read(db)
    assert sessions == ["s"]
    assert [r["turn_id"] for r in rows] == ["turn-0"] * 4 + ["turn-1"] * 2
    assert [(t["id"], t["state"]) for t in turns] == [("turn-0", "done"), ("turn-1", "running")]
    assert rows[1]["tool_calls"][0]["id"] == "c1"


def test_a_resent_interrupted_message_is_the_same_turn(tmp_path: Path) -> None:
    db = _upstream_like_db(tmp_path / "state.db", [
        ("user", "q0", None, None), ("assistant", None, None, CALL),
        ("user", "q0", None, None), ("assistant", "a0", None, None)])
    _sessions, rows, turns = upstream_schema.read(db)
    assert {r["turn_id"] for r in rows} == {"turn-0"} and [t["state"] for t in turns] == ["done"]


def test_the_gateways_recovery_row_resumes_the_interrupted_turn(tmp_path: Path) -> None:
    # Upstream's gateway resumes a killed turn with its recovery note and stores the event's empty
    # text in its place: that row belongs to the interrupted turn and asks no second question.
    result = json.dumps({"status": "ok"})
    db = _upstream_like_db(tmp_path / "state.db", [
        ("user", "q0", None, None), ("assistant", None, None, CALL), ("tool", result, "c1", None),
        ("user", "", None, None), ("assistant", "a0", None, None), ("user", "q1", None, None),
        ("assistant", "a1", None, None)])
    _sessions, rows, turns = upstream_schema.read(db)
    assert [r["turn_id"] for r in rows] == ["turn-0"] * 5 + ["turn-1"] * 2
    assert [(t["id"], t["state"], t["user_text"]) for t in turns] == [("turn-0", "done", "q0"),
                                                                     ("turn-1", "done", "q1")]
    assert [r.get("resumes_turn", False) for r in rows] == [False, False, False, True, False, False, False]
    assert check_structure(db).valid is True
    # A user row after the turn's answer is a new turn, whatever it says.
    db2 = _upstream_like_db(tmp_path / "after.db", [("user", "q0", None, None), ("assistant", "a0", None, None),
                                                    ("user", "", None, None), ("assistant", "a1", None, None)])
    assert [t["id"] for t in upstream_schema.read(db2)[2]] == ["turn-0", "turn-1"]


def test_the_scripted_model_answers_the_recovery_note_as_the_interrupted_turn() -> None:
    from supervisor.chaos.scenarios import SCENARIOS, campaign_script
    from worker.targets.hermes_agent_resume import RECOVERY_NOTE_START

    scenario = SCENARIOS["writes"]
    script = campaign_script([scenario])
    question, (calls, answer) = scenario.turns[0].text, scenario.turns[0].replies
    note = RECOVERY_NOTE_START + " a gateway interruption; ...]"
    # The replay ends with the question: upstream sends question and note as one message.
    assert script([{"role": "user", "content": question + "\n\n" + note}]) == calls
    # The note after the interrupted call's (stubbed) results: the turn's next reply.
    call = {"id": "c", "type": "function", "function": {"name": "append_note", "arguments": "{}"}}
    replay = [{"role": "user", "content": question}, {"role": "assistant", "content": None, "tool_calls": [call]},
              {"role": "tool", "tool_call_id": "c", "content": "unknown"}, {"role": "user", "content": note}]
    assert script(replay) == answer


def test_resume_is_upstreams_own_path_unless_the_caller_resends() -> None:
    assert upstream.TARGET.check_options({}) == {"resume": "gateway"}
    assert upstream.TARGET.check_options({"resume": "resend"}) == {"resume": "resend"}


def test_check_reads_upstream_schema(tmp_path: Path) -> None:
    db = _upstream_like_db(tmp_path / "state.db", [("user", "q0", None, None), ("assistant", None, None, CALL),
                                                   ("assistant", "a0", None, None)])
    verdict = check_structure(db)
    assert verdict.valid is False  # the tool call c1 has no result
    assert any("c1" in v.message for v in verdict.violations)


def test_without_hermes_agent_the_command_says_how_to_get_it(capsys: pytest.CaptureFixture[str]) -> None:
    if upstream.TARGET.available():
        pytest.skip("hermes-agent is installed; the missing-package message cannot be shown")
    assert cli.main(["chaos", "--target", "hermes-agent", "--scenario", "single-tool"]) == cli.EXIT_USAGE
    assert "scripts/setup upstream" in capsys.readouterr().err


@pytest.mark.chaos
@pytest.mark.upstream  # needs hermes-agent: skipped without it, failed in CI (tests/conftest.py)
def test_one_upstream_case_end_to_end(tmp_path: Path) -> None:
    from supervisor.chaos.campaign import Campaign
    from supervisor.chaos.config import CampaignConfig

    config = CampaignConfig(scenarios=["single-tool"], jobs=1, workdir=tmp_path, keep=True, target="hermes-agent",
                            case_ids=("single-tool/probe:self@callback.tool_complete.after:1@t0p0",))
    [result] = Campaign(config).run()
    assert result.fired == ["callback.tool_complete.after:1"]  # the probe around upstream's callback fired
    db = next(tmp_path.glob("*/state.db"))
    assert upstream_schema.is_upstream(db)  # upstream wrote its own schema
    assert result.verdict.valid is False  # upstream shows the tool result before it is durable
    names = {v.invariant for v in result.verdict.violations}
    assert "durable-before-visible" in names, names


@pytest.mark.chaos
@pytest.mark.upstream  # needs hermes-agent: skipped without it, failed in CI (tests/conftest.py)
def test_the_adapter_places_the_model_flush_txn_and_resume_probes(tmp_path: Path) -> None:
    from supervisor.chaos.campaign import Campaign
    from supervisor.chaos.config import CampaignConfig
    from supervisor.chaos.generator import case_file_stem

    in_txn = "single-tool/probe:self@flush.in_txn:2@t0p0+probe:self@resume.reconciled:1@t0p1"
    chunk = "single-tool/probe:self@model.chunk:3@t0p0+probe:self@resume.begin:1@t0p1"
    config = CampaignConfig(scenarios=["single-tool", "writes"], jobs=2, workdir=tmp_path / "work",
                            target="hermes-agent", case_ids=("writes/fault-free", in_txn, chunk),
                            case_files=tmp_path / "cases")
    results = {r.case.case_id: r for r in Campaign(config).run()}

    # A fault-free turn (writes has interim text) meets every point but compaction (upstream does
    # not compact a few hundred tokens) and recovery (nothing to recover).
    assert results["writes/fault-free"].reached == set(POINTS) - {"compact.in_txn", "resume.begin",
                                                                   "resume.reconciled"}
    assert results[in_txn].fired == ["flush.in_txn:2", "resume.reconciled:1"]
    assert results[chunk].fired == ["model.chunk:3", "resume.begin:1"]

    # flush.in_txn sits inside the row's transaction: the killed worker's second row (the assistant's
    # tool call, written but not committed) is gone, only the first (the user message) is durable.
    events = json.loads((tmp_path / "cases" / f"{case_file_stem(in_txn)}.json").read_text())["events"]
    first = next(e for e in events if e["type"] == "snapshot")
    assert [row["role"] for row in first["rows"].values()] == ["user"]
