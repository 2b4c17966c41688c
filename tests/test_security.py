"""What the project leaves on the machine and on the network, and what sessions can touch.

* Files it creates (databases, ledgers, history, reports, spilled results) are 0600 and its
  directories 0700, even under a umask of 0 that would leave anything else world-writable.
* Every server binds 127.0.0.1 only, so no other address of the machine reaches it.
* The worker's control channel is an inherited socketpair: a running worker listens nowhere.
* An API key given in the environment never lands in a database, ledger, history or report.
* Row ids are per session: a flush or a compaction in one session never touches another's rows.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from workerutil import CHORES, REPO, SCRIPT, WorkerProcess, worker_argv, worker_env

from hermes.runner import AIAgent
from hermes.state import SessionDB
from hermes.tools import IDEMPOTENT, Tool, registry
from supervisor.chaos.checker import check_structure
from testkit.modelserver import Reply, ScriptedModelServer, ToolCallSpec, turn_script


# ---------------------------------------------------------------- the chaos CLI: modes and secrets
@pytest.fixture(scope="module")
def chaos_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One real `python -m supervisor chaos` campaign, run under umask 0 with a recognisable API key."""
    root = tmp_path_factory.mktemp("chaos-cli")
    paths = {"report": root / "report", "workdir": root / "work", "history": root / "history.jsonl",
             "home": root / "home"}
    key = f"sk-test-{secrets.token_hex(16)}"
    env = dict(os.environ, OPENAI_API_KEY=key, HERMES_HOME=str(paths["home"]), NO_PROXY="127.0.0.1,localhost",
               no_proxy="127.0.0.1,localhost")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    argv = [sys.executable, "-m", "supervisor", "chaos", "--scenario", "writes", "--probe", "tool.dispatch.after",
            "--report", str(paths["report"]), "--workdir", str(paths["workdir"]), "--history", str(paths["history"])]
    out, err = root / "stdout.txt", root / "stderr.txt"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                                start_new_session=True, umask=0)
    try:
        returncode = proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the group is the recorded pid
            proc.wait()
    yield {"key": key, "returncode": returncode, "stdout": out.read_bytes(), "stderr": err.read_bytes(), **paths}


def _everything_under(*roots: Path) -> list[Path]:
    found = []
    for root in roots:
        if root.is_file():
            found.append(root)
        elif root.is_dir():
            found.append(root)
            found += sorted(root.rglob("*"))
    return found


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_chaos_campaign_passes(chaos_run: dict[str, Any]) -> None:
    assert chaos_run["returncode"] == 0, chaos_run["stdout"][-3000:] + chaos_run["stderr"][-3000:]
    report = json.loads((chaos_run["report"] / "report.json").read_text())
    assert report["ok"] is True and report["cases"] >= 3


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_the_api_key_is_never_written_anywhere(chaos_run: dict[str, Any]) -> None:
    key = chaos_run["key"].encode()
    secret_part = key[len(b"sk-test-"):]
    files = [p for p in _everything_under(chaos_run["report"], chaos_run["workdir"], chaos_run["history"],
                                          chaos_run["home"]) if p.is_file()]
    assert any(p.name == "state.db" for p in files) and any(p.name == "report.json" for p in files)
    corpus = {str(p): p.read_bytes() for p in files}
    corpus["stdout"], corpus["stderr"] = chaos_run["stdout"], chaos_run["stderr"]
    # A scan that reads nothing finds nothing: the scenario's own words must be found.
    assert any(b"[writes] note it down" in data for data in corpus.values())
    leaks = [name for name, data in corpus.items() if key in data or secret_part in data]
    assert leaks == [], f"the API key was written to {leaks}"


@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_files_are_private_even_under_umask_zero(chaos_run: dict[str, Any]) -> None:
    entries = _everything_under(chaos_run["report"], chaos_run["workdir"], chaos_run["history"], chaos_run["home"])
    assert any(p.suffix == ".db" for p in entries) and chaos_run["history"] in entries
    wrong = {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in entries
             if stat.S_IMODE(p.stat().st_mode) != (0o700 if p.is_dir() else 0o600)}
    assert wrong == {}, f"not private (files must be 0600, directories 0700): {wrong}"


def test_worker_files_and_spilled_results_are_private(tmp_path: Path, db_path: Path, agent_home: Path,
                                                      serve) -> None:
    """In-process: the state database (and its WAL files), trajectories and a spilled result, under umask 0."""
    registry.register(Tool("sec_big", "A large result.", lambda args, ctx: "x" * 200_000, policy=IDEMPOTENT),
                      "security_tests")
    server = serve(turn_script({"spill": [Reply(tool_calls=(ToolCallSpec("sec_big", {}),)), Reply("Spilled.")]}))
    old = os.umask(0)
    try:
        with SessionDB(db_path) as db:
            agent = AIAgent(api_key="k", base_url=server.base_url, model="m", session_db=db, session_id="sec",
                            enabled_toolsets=["security_tests"], max_retries=0)
            agent.save_trajectories = True
            assert agent.run_conversation("spill")["completed"] is True
            created = [p for p in tmp_path.rglob("*")]
            wrong = {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in created
                     if stat.S_IMODE(p.stat().st_mode) != (0o700 if p.is_dir() else 0o600)}
    finally:
        os.umask(old)
    names = {p.name for p in created}
    assert {"state.db", "state.db-wal", "state.db-shm", "trajectories.jsonl", "tool_results"} <= names, names
    assert wrong == {}, f"not private: {wrong}"


# ---------------------------------------------------------------- servers bind loopback only
def test_model_server_binds_127_0_0_1_and_nothing_else() -> None:
    with ScriptedModelServer(turn_script({})) as server:
        host, port = server._httpd.socket.getsockname()[:2]
        assert (host, port) == ("127.0.0.1", server.port)
        listening = [c for c in psutil.Process().net_connections(kind="inet")
                     if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
        assert [c.laddr.ip for c in listening] == ["127.0.0.1"]
        # Bound to the one address, not to the wildcard: another loopback address is refused.
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.2", port), timeout=2).close()
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    with pytest.raises(ValueError, match="non-loopback"):
        ScriptedModelServer(turn_script({}), host="0.0.0.0")


NAMESPACE_PROBE = r"""
import json, socket, subprocess, sys
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
subprocess.run(["ip", "addr", "add", "192.0.2.1/32", "dev", "lo"], check=True)
from testkit.modelserver import ScriptedModelServer, turn_script

def reach(address, port):
    try:
        socket.create_connection((address, port), timeout=2).close()
        return "connected"
    except OSError as exc:
        return type(exc).__name__

with ScriptedModelServer(turn_script({})) as server:
    result = {"server_via_test_address": reach("192.0.2.1", server.port),
              "server_via_loopback": reach("127.0.0.1", server.port)}
control = socket.socket()
control.bind(("0.0.0.0", 0))
control.listen()
result["wildcard_control_via_test_address"] = reach("192.0.2.1", control.getsockname()[1])
print(json.dumps(result))
"""


def test_model_server_is_unreachable_from_a_non_loopback_address(tmp_path: Path) -> None:
    """In a network namespace of its own (so no traffic leaves it), the machine gets the
    documentation address 192.0.2.1; the server must refuse connections made to it, while a
    wildcard-bound control socket accepts them (so the refusal is the bind, not the network)."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs unshare and ip (iproute2) to make a private network namespace")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(["unshare", "--net", sys.executable, "-c", NAMESPACE_PROBE], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60, start_new_session=True)
    if done.returncode != 0 and ("Operation not permitted" in done.stderr or "unshare failed" in done.stderr):
        pytest.skip(f"cannot create a network namespace here: {done.stderr.strip()[-300:]}")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result == {"server_via_test_address": "ConnectionRefusedError", "server_via_loopback": "connected",
                      "wildcard_control_via_test_address": "connected"}, result


# ---------------------------------------------------------------- the control channel listens nowhere
@pytest.mark.chaos
@pytest.mark.xdist_group("chaos")
def test_a_running_worker_has_no_listening_socket(tmp_path: Path) -> None:
    with ScriptedModelServer(SCRIPT) as server:
        worker = WorkerProcess(worker_argv("run", tmp_path / "state.db", "s-sock", server.base_url, message=CHORES),
                               workdir=tmp_path, env=worker_env(tmp_path / "home"), control=True)
        sockets: list[Any] = []
        try:
            while (frame := worker.recv()) is not None:
                if frame.get("type") == "ui" and not sockets:
                    # The worker is parked, waiting for this ack: look at its sockets now.
                    process = psutil.Process(worker.pid)
                    sockets = process.net_connections(kind="all")
                    assert process.children(recursive=True) == []
                if "seq" in frame:
                    worker.ack(frame)
            finished = worker.finish()
        finally:
            worker.cleanup()
    assert finished.returncode == 0, finished.describe()
    assert sockets, "the worker was never seen parked"
    assert [c for c in sockets if c.status == psutil.CONN_LISTEN] == []
    assert any(c.family == socket.AF_UNIX for c in sockets), sockets  # the inherited channel
    assert all(c.family == socket.AF_UNIX or c.raddr for c in sockets), sockets  # no unconnected inet socket


# ---------------------------------------------------------------- session isolation
ISOLATION_SCRIPT = turn_script({
    "a: first": [Reply("A answers first.")], "a: second": [Reply("A answers second.")],
    "b: first": [Reply("B answers first.")], "b: second": [Reply("B answers second.")],
    "b: third": [Reply("B answers third.")],
})


def test_row_ids_of_one_session_never_touch_another(db: SessionDB, db_path: Path, serve, agent_home: Path) -> None:
    server = serve(ISOLATION_SCRIPT)

    def agent(session: str) -> AIAgent:
        return AIAgent(api_key="k", base_url=server.base_url, model="m", session_db=db, session_id=session,
                       enabled_toolsets=[], max_retries=0)

    a, b = agent("session-a"), agent("session-b")
    for session, text in (("a", "a: first"), ("b", "b: first"), ("a", "a: second"), ("b", "b: second")):
        history = db.load_live_messages(f"session-{session}")
        assert (a if session == "a" else b).run_conversation(text, conversation_history=history)["completed"]
    # B gets a blank assistant row (the kind a flush would repair in place) and is compacted as the
    # runtime compacts (everything before the newest question summarized, from it on kept), so it has
    # archived rows with active clones too.
    b_blank = db.write_pending("session-b", [{"role": "user", "content": "b: an aside"},
                                             {"role": "assistant", "content": ""}])[1][0]
    b_rows = db.get_messages("session-b")
    db.archive_and_compact("session-b", [{"role": "user", "content": "[summary of b]"}],
                           watermark=b_rows[-3]["id"])
    b_before = db.get_messages("session-b", include_inactive=True)
    b_ids = [r["id"] for r in b_before]

    # A flushes messages that carry every one of B's ids: blank, non-blank, archived, clones.
    forged = [{"role": "assistant", "content": f"A's own text {n}", "_row_id": row_id, "_turn_id": "turn-forged"}
              for n, row_id in enumerate(b_ids)]
    assert a._flush_messages_to_session_db(forged) is True
    # Each was inserted into A as a new row: nothing of B's was updated, nor adopted into A.
    assert [m["content"] for m in forged] == [f"A's own text {n}" for n in range(len(b_ids))]
    assert not {m["_row_id"] for m in forged} & set(b_ids)
    assert db.get_messages("session-b", include_inactive=True) == b_before
    assert b_blank in b_ids

    # A compaction of A, with a watermark among B's ids, archives and clones A's rows only.
    a_rows = db.get_messages("session-a")
    db.archive_and_compact("session-a", [{"role": "user", "content": "[summary of a]"}], watermark=b_ids[2])
    assert db.get_messages("session-b", include_inactive=True) == b_before
    a_after = db.get_messages("session-a", include_inactive=True)
    assert {r["session_id"] for r in a_after} == {"session-a"}
    assert {r["cloned_from"] for r in a_after if r["cloned_from"]} <= {r["id"] for r in a_rows}

    # B itself may fill its blank row (it follows the compaction clone); A's flush above could not.
    assert b._flush_messages_to_session_db([{"role": "assistant", "content": "B fills its blank",
                                            "_row_id": b_blank}]) is True
    filled = [r for r in db.get_messages("session-b") if r["content"] == "B fills its blank"]
    assert len(filled) == 1 and filled[0]["cloned_from"] == b_blank

    # Both sessions go on: B's next turn sees only B's transcript.
    done = b.run_conversation("b: third", conversation_history=db.load_live_messages("session-b"))
    assert done["completed"] is True
    seen = server.requests[-1]["messages"]
    assert all("A's" not in (m.get("content") or "") and "a:" not in (m.get("content") or "") for m in seen)
    assert check_structure(db_path, "session-b").valid is True
