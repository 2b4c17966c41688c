"""Per-turn limits that hold across restarts: worker starts (`attempts`) and model calls
(`model_calls`), both counted on the turn's row. A turn over either ends 'failed' with a reason
to act on, its transcript well-formed, and the session's later turns run. Real processes."""
from __future__ import annotations

from pathlib import Path

import pytest

from hermes.state import SessionDB
from supervisor.daemon import inbox
from testkit.modelserver import Reply, ScriptedModelServer, ToolCallSpec, last_user_text, reply_index

from daemon_helpers.harness import Daemons, assert_well_formed, cli, env_for, wait_for  # isort: skip

pytestmark = [pytest.mark.chaos, pytest.mark.xdist_group("chaos")]


def turn_row(db: Path, turn: str) -> dict:
    with SessionDB(db, readonly=True) as handle:
        return handle.get_turn(turn)


def ended(db: Path, turn: str) -> bool:
    return turn_row(db, turn)["state"] in ("done", "failed")


def requests_of(model: ScriptedModelServer, text: str) -> list[dict]:
    return [r for r in model.requests if r.get("path") == "/v1/chat/completions"
            and last_user_text(r["messages"]) == text]


def test_the_model_call_limit_holds_across_a_worker_crash(tmp_path: Path, daemons: Daemons) -> None:
    """The model never answers: it asks for a lookup, then for restart_agent (the worker dies),
    then lookups forever. The second worker must not get a fresh allowance."""
    def script(messages: list[dict]) -> Reply:
        if last_user_text(messages) == "after":
            return Reply(content="the session goes on")
        n = reply_index(messages)
        if n == 1:
            return Reply(tool_calls=(ToolCallSpec("restart_agent", {}),))
        return Reply(tool_calls=(ToolCallSpec("lookup", {"key": f"k{n}"}),))

    db = tmp_path / "state.db"
    env = env_for(tmp_path)
    with ScriptedModelServer(script) as model:
        daemon = daemons(db, "--base-url", model.base_url, "--model", "scripted-model", "--tools", "chaos",
                         "--max-model-calls", "4", "--max-attempts", "20", "--crash-limit", "20",
                         "--backoff-base", "0.05", env=env)
        looping, _ = inbox.submit(db, "s", "never answers")
        after, _ = inbox.submit(db, "s", "after")
        got = cli("result", "--db", str(db), after, "--wait", "--timeout", "60", env=env)
        assert (got.returncode, got.stdout) == (0, "the session goes on\n"), got.stderr + daemon.output()[-3000:]
        failed = cli("result", "--db", str(db), looping, env=env)
        assert failed.returncode == 1 and failed.stderr.count("\n") == 1
        assert "model-call limit" in failed.stderr and "--max-model-calls" in failed.stderr
        row = turn_row(db, looping)
        assert row["state"] == "failed" and row["attempts"] == 2  # the crash, then the worker stopped at the limit
        # Counted before each call, and refused before the 5th is made: exactly the limit, over both
        # workers. A fresh allowance per worker would make 7.
        assert row["model_calls"] == 4
        assert len(requests_of(model, "never answers")) == 4
        assert daemon.stop() == 0
    assert_well_formed(db, "s")


def test_a_turn_that_dies_after_every_step_ends_at_the_attempt_limit(tmp_path: Path, daemons: Daemons) -> None:
    """Each worker saves something (the previous restart_agent's unknown outcome) and then dies:
    never a crash loop by the no-progress rule, which alone would retry it forever."""
    def script(messages: list[dict]) -> Reply:
        if last_user_text(messages) == "after":
            return Reply(content="the session goes on")
        return Reply(tool_calls=(ToolCallSpec("restart_agent", {}),))

    db = tmp_path / "state.db"
    env = env_for(tmp_path)
    with ScriptedModelServer(script) as model:
        daemon = daemons(db, "--base-url", model.base_url, "--model", "scripted-model", "--tools", "chaos",
                         "--max-attempts", "3", "--crash-limit", "3", "--max-model-calls", "100",
                         "--backoff-base", "0.05", env=env)
        dying, _ = inbox.submit(db, "s", "restart forever")
        after, _ = inbox.submit(db, "s", "after")
        got = cli("result", "--db", str(db), after, "--wait", "--timeout", "60", env=env)
        assert (got.returncode, got.stdout) == (0, "the session goes on\n"), got.stderr + daemon.output()[-3000:]
        failed = cli("result", "--db", str(db), dying, env=env)
        assert failed.returncode == 1 and "attempt limit: 3 workers were started" in failed.stderr
        assert "crash loop" not in failed.stderr and "--max-attempts" in failed.stderr
        row = turn_row(db, dying)
        assert row["state"] == "failed" and row["attempts"] == 3 and row["model_calls"] == 3
        assert len(requests_of(model, "restart forever")) == 3
        assert daemon.stop() == 0

        # The counts are durable: a daemon started later on a turn at its limit does not start a worker.
        with SessionDB(db) as handle:
            handle.submit_turn("t", "at-limit", "restart forever")
            for _ in range(3):
                handle.add_turn_attempt("at-limit")
        daemon = daemons(db, "--base-url", model.base_url, "--model", "scripted-model", "--tools", "chaos",
                         "--max-attempts", "3", env=env)
        wait_for("the turn at its limit to end", lambda: ended(db, "at-limit"))
        row = turn_row(db, "at-limit")
        assert row["state"] == "failed" and row["error"].startswith("attempt limit: 3 workers")
        assert "leased turn session=t" not in daemon.output()
        assert daemon.stop() == 0
    assert_well_formed(db, "s", "t")
