"""A fleet: several `serve --store postgresql://...` daemons share one PostgreSQL store.

Each turn is run by exactly one daemon at a time (claims, `FOR UPDATE SKIP LOCKED`); a daemon
SIGKILLed mid-turn stops renewing its claims and another one finishes its turns; every turn ends
done exactly once, and the store passes the same structural check as a SQLite file.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers.harness import Daemons, env_for, slow_script, wait_for
from pgfixtures import pg_cluster, pg_url  # noqa: F401  (fixtures)

from supervisor.daemon import inbox
from testkit.modelserver import Reply, ScriptedModelServer, last_user_text, reply_index


def fleet_args(url: str, home: Path, ledger: Path, model: ScriptedModelServer, *extra: str) -> list[str]:
    return ["--store", url, "--home", str(home), "--ledger", str(ledger), "--base-url", model.base_url,
            "--model", "scripted-model", "--tools", "chaos", "--claim-ttl", "2", "--backoff-base", "0.05",
            "--workers", "2", *extra]


def start_fleet(daemons: Daemons, tmp_path: Path, url: str, model: ScriptedModelServer,
                env: dict[str, str]) -> list[Any]:
    """Daemons a and b on `url`, each with its home under `tmp_path`, sharing one effects ledger."""
    return [daemons(None, *fleet_args(url, tmp_path / name, tmp_path / "effects.db", model), env=env,
                    files=tmp_path / name / "fleet") for name in ("a", "b")]


def store_turns(url: str) -> list[dict[str, Any]]:
    from hermes.store.pg.sessiondb import PgSessionDB

    with PgSessionDB(url, readonly=True) as db:
        return db.get_turns()


def session_rows(url: str, session: str) -> list[dict[str, Any]]:
    from hermes.store.pg.sessiondb import PgSessionDB

    with PgSessionDB(url, readonly=True) as db:
        return db.get_messages(session, include_inactive=True)


def assert_store_clean(url: str, env: dict[str, str]) -> None:
    """`check --store` finds every transcript of the store well-formed, no row twice, every answer once."""
    check = subprocess.run([sys.executable, "-m", "supervisor", "check", "--store", url, "--json"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr
    assert json.loads(check.stdout)["valid"] is True


def counts(url: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for turn in store_turns(url):
        out[turn["state"]] = out.get(turn["state"], 0) + 1
    return out


class HeldTurn:
    """A model whose answer to the turn "held" waits, for its first worker only, until `release`."""

    def __init__(self) -> None:
        self.reached, self.release = threading.Event(), threading.Event()
        self.answers = 0
        self.quick = slow_script({}, others=0.0)

    def __call__(self, messages: list[dict]) -> Reply:
        if last_user_text(messages) == "held" and reply_index(messages) == 1:
            self.answers += 1
            if self.answers == 1:
                self.reached.set()
                self.release.wait(120)
        return self.quick(messages)


def running_held(fleet: list[Any]) -> tuple[Any, Any]:
    """(the daemon whose worker runs the held turn, the other one)."""
    victim = next(d for d in fleet if any(w["turn"] == "t-held" for w in d.live_workers()))
    return victim, next(d for d in fleet if d is not victim)


@pytest.mark.chaos  # a real daemon SIGKILLed (or SIGSTOPped) mid-turn
@pytest.mark.xdist_group("chaos")
def test_two_daemons_one_sigkilled_mid_turn_finish_200_turns_exactly_once(
        tmp_path: Path, daemons: Daemons, pg_url: str) -> None:  # noqa: F811
    env = env_for(tmp_path)
    # The turn "held" is held mid-turn (its tool call and result durable) until the daemon running it
    # is dead; its second worker is answered at once. Every other turn: one lookup, then the answer.
    script = HeldTurn()
    with ScriptedModelServer(script) as model:
        fleet = start_fleet(daemons, tmp_path, pg_url, model, env)
        inbox.submit(pg_url, "s-held", "held", "t-held")
        for i in range(199):
            inbox.submit(pg_url, f"s{i % 19:02d}", f"message {i}", f"t{i:03d}")
        try:
            wait_for("a worker to wait for the held turn's answer", script.reached.is_set, timeout=60)
            victim, survivor = running_held(fleet)
            workers = victim.live_workers()
            # SIGKILL that daemon, mid-turn (only the daemon: its workers see their channel close and
            # kill themselves).
            os.kill(victim.pid, signal.SIGKILL)
            victim.proc.wait(30)
            wait_for("the killed daemon's workers to be gone", lambda: not any(
                inbox.process_alive(w["pid"], w["create_time"]) for w in workers))
        finally:
            script.release.set()
        wait_for("all 200 turns to end", lambda: sum(counts(pg_url).get(s, 0) for s in ("done", "failed")) == 200,
                 timeout=240, every=0.2)
        assert survivor.stop() == 0

    turns = {t["id"]: t for t in store_turns(pg_url)}
    assert {t["state"] for t in turns.values()} == {"done"}, counts(pg_url)
    # The killed daemon's worker, then the survivor's; on a starved machine the survivor may also miss a
    # renewal of its 2 s claim, take the session again under a new epoch and fence its own worker: one
    # more attempt, never one more answer (below: one user row and one final answer a turn).
    assert turns["t-held"]["attempts"] >= 2
    assert script.answers >= 2
    # Exactly once: each turn has one user row and one final answer, in its session's order.
    for session in {t["session_id"] for t in turns.values()}:
        rows = [r for r in session_rows(pg_url, session) if r["cloned_from"] is None]
        users = [r["turn_id"] for r in rows if r["role"] == "user"]
        answers = [r["turn_id"] for r in rows if r["role"] == "assistant" and r["content"] and not r["tool_calls"]]
        expected = [t for t in turns.values() if t["session_id"] == session]  # get_turns: submission order
        assert users == [t["id"] for t in expected] == answers, session
    assert_store_clean(pg_url, env)
    # Nothing a daemon started is left (the victim's by their channel closing; the survivor's by its drain).
    assert not victim.survivors(timeout=10) and not survivor.survivors(timeout=10)


def final_answers(url: str, session: str, turn: str) -> list[str]:
    return [r["content"] for r in session_rows(url, session) if r["turn_id"] == turn and r["role"] == "assistant"
            and r["content"] and not r["tool_calls"] and r["cloned_from"] is None]


@pytest.mark.chaos  # a real daemon SIGKILLed (or SIGSTOPped) mid-turn
@pytest.mark.xdist_group("chaos")
def test_a_paused_daemon_loses_its_session_and_its_worker_writes_nothing_after(
        tmp_path: Path, daemons: Daemons, pg_url: str) -> None:  # noqa: F811
    """The daemon running a turn and its worker are stopped (SIGSTOP) past the claim's time to live:
    the other daemon takes the session over and finishes the turn. Resumed, the old worker gets its
    answer and tries to write it: the fencing check refuses it; the old daemon sees the claim lost."""
    env = env_for(tmp_path)
    model_script = HeldTurn()
    with ScriptedModelServer(model_script) as model:
        fleet = start_fleet(daemons, tmp_path, pg_url, model, env)
        inbox.submit(pg_url, "s-held", "held", "t-held")
        stopped: list[int] = []
        try:
            wait_for("a worker to wait for the held turn's answer", model_script.reached.is_set, timeout=60)
            paused, other = running_held(fleet)
            workers = paused.live_workers()
            for pid in [paused.pid, *(w["pid"] for w in workers)]:
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
            wait_for("the other daemon to finish the held turn", lambda: turn_state(pg_url, "t-held") == "done",
                     timeout=60)
            # The old worker first, its daemon still stopped: it gets its answer and tries to write it.
            while len(stopped) > 1:
                os.kill(stopped.pop(), signal.SIGCONT)
            model_script.release.set()
            wait_for("the paused daemon's worker to stop", lambda: not any(
                inbox.process_alive(w["pid"], w["create_time"]) for w in workers))
        finally:
            for pid in stopped:  # still stopped, so still alive
                os.kill(pid, signal.SIGCONT)
            model_script.release.set()
        inbox.submit(pg_url, "s-held", "after", "t-after")
        wait_for("the session to go on", lambda: turn_state(pg_url, "t-after") == "done", timeout=60)
        assert paused.stop() == 0 and other.stop() == 0
    assert "lost the claim on a session to another daemon" in paused.output()
    assert "lease lost" in paused.output()  # the old worker's refused write, in its daemon's log
    assert final_answers(pg_url, "s-held", "t-held") == ["done: held"]
    assert_store_clean(pg_url, env)


def test_a_cancel_taken_by_any_daemon_stops_the_turn_where_it_runs(
        tmp_path: Path, daemons: Daemons, pg_url: str) -> None:  # noqa: F811
    from hermes.outcomes import CANCELLED
    from hermes.store.pg.sessiondb import PgSessionDB

    env = env_for(tmp_path)
    model_script = HeldTurn()
    with ScriptedModelServer(model_script) as model:
        fleet = start_fleet(daemons, tmp_path, pg_url, model, env)
        inbox.submit(pg_url, "s-held", "held", "t-held")
        try:
            wait_for("a worker to wait for the held turn's answer", model_script.reached.is_set, timeout=60)
            running, _ = running_held(fleet)
            with PgSessionDB(pg_url) as db:  # what any daemon's API does with a cancel request
                assert db.request_cancel("t-held") is True
            wait_for("the turn to end cancelled", lambda: turn_state(pg_url, "t-held") == "failed", timeout=60)
        finally:
            model_script.release.set()
        for daemon in fleet:
            assert daemon.stop() == 0
    turn = next(t for t in store_turns(pg_url) if t["id"] == "t-held")
    assert turn["error"] == CANCELLED
    assert "worker stopped for a cancel request" in running.output()
    assert_store_clean(pg_url, env)


def turn_state(url: str, turn_id: str) -> str | None:
    return next((t["state"] for t in store_turns(url) if t["id"] == turn_id), None)


@pytest.mark.parametrize(("args", "says"), [
    (["serve", "--store", "state.db", "--home", "h"], "--store takes a postgresql:// URL"),
    (["serve", "--store", "postgresql:///x"], "--store needs --home DIR"),
    (["serve", "--db", "state.db", "--home", "h"], "--home and --claim-ttl are for a fleet daemon"),
    (["serve", "--db", "state.db", "--claim-ttl", "3"], "--home and --claim-ttl are for a fleet daemon"),
    (["submit", "--store", "postgresql:///x", "--create", "--session", "s", "hi"], "--create is for a SQLite --db"),
    (["status", "--store", "postgresql:///x", "--wait"], "needs --home DIR"),
    (["status", "--db", "state.db", "--home", "h"], "--home goes with --store"),
    (["result", "--store", "mysql://x", "t1"], "--store takes a postgresql:// URL"),
    (["submit", "--store", "postgresql:///x", "--db", "state.db", "--session", "s", "hi"], "not allowed with"),
])
def test_fleet_flags_are_checked_before_anything_starts(tmp_path: Path, args: list[str], says: str) -> None:
    got = subprocess.run([sys.executable, "-m", "supervisor.daemon.cli", *args], cwd=tmp_path, env=env_for(tmp_path),
                         capture_output=True, text=True, timeout=60)
    assert got.returncode == 2 and says in got.stderr, got.stderr
    assert got.stderr.count("\n") == 1 and not (tmp_path / "h").exists()


def test_a_config_file_names_the_fleet_store_and_its_home_relative_to_itself(tmp_path: Path) -> None:
    from supervisor.daemon import config

    (tmp_path / "etc").mkdir()
    conf = tmp_path / "etc" / "daemon.toml"
    conf.write_text('store = "postgresql://db.example/hermes"\nhome = "../daemon-a"\nclaim_ttl = 5\n'
                    'ledger = "effects.db"\n', encoding="utf-8")
    loaded = config.load(conf)
    assert loaded == {"store": "postgresql://db.example/hermes", "home": tmp_path / "etc" / ".." / "daemon-a",
                      "claim_ttl": 5.0, "ledger": tmp_path / "etc" / "effects.db"}
    conf.write_text('store = "postgresql://db.example/hermes"\ndb = "state.db"\n', encoding="utf-8")
    with pytest.raises(config.ConfigError, match="db and store exclude each other"):
        config.load(conf)
    conf.write_text("claim_ttl = 0\n", encoding="utf-8")
    with pytest.raises(config.ConfigError, match="claim_ttl"):
        config.load(conf)
