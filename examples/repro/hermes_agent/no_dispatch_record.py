#!/usr/bin/env python3
"""hermes-agent: no record says a tool was started, so after a kill its store cannot tell a tool
that ran from one that never started.

Standalone: upstream's public API (`run_agent.AIAgent` with `tool_start_callback` and
`tool_complete_callback`, and `hermes_state.SessionDB`, the store behind its sessions), its own
`write_file` tool, the standard library and a loopback model server of a few lines. Its home is a
private temporary directory; nothing leaves loopback.

Two turns, each in a child process of its own (its own session), each asked to write a file by
the model (the loopback server): one SIGKILLs itself in `tool_start_callback`, before the tool
runs (the file is never written); the other in `tool_complete_callback`, after it ran (the file
is written). The parent reads both stores with `SessionDB.get_messages_as_conversation()`: the
same rows (the question and the assistant's tool call, no result), so nothing durable says
which of the two tools ran. Upstream's own resume replay (the gateway's,
`agent.replay_cleanup.sanitize_replay_history`) tells the model the same for both: the effect is
unknown.

This is a rule of this project's contract (a durable dispatch intent before a tool runs), which
upstream's documents never claim: its Sessions page says what state.db keeps (messages, tool
calls, tool results), nothing about a record of a tool being started.

Exit 1: the two stores hold the same rows. Exit 0: upstream's store tells them apart. Exit 2:
a run went wrong.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SESSION = "s1"
TIMEOUT = 300  # seconds a child may take before it is killed as hung


# ------------------------------------------------------------- loopback model
def start_model(target: str) -> ThreadingHTTPServer:
    """An OpenAI-style chat endpoint, streaming when asked: ask for write_file (a fresh call id
    each time) until a tool result is in the conversation, then answer."""

    class Model(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # the body ends when the socket closes

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if body["messages"][-1]["role"] == "tool":
                delta, finish = {"role": "assistant", "content": "written"}, "stop"
            else:
                arguments = json.dumps({"path": target, "content": "hello\n"})
                delta, finish = {"role": "assistant", "content": None, "tool_calls": [{
                    "index": 0, "id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                    "function": {"name": "write_file", "arguments": arguments}}]}, "tool_calls"
            base = {"id": "r1", "created": 0, "model": "loopback"}
            usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
            self.send_response(200)
            if body.get("stream"):
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for chunk in ({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
                              {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
                              {"choices": [], "usage": usage}):
                    event = {**base, "object": "chat.completion.chunk", **chunk}
                    self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
            else:
                message = {k: v for k, v in delta.items()}
                for call in message.get("tool_calls") or []:
                    call.pop("index", None)
                out = json.dumps({**base, "object": "chat.completion", "usage": usage, "choices": [
                    {"index": 0, "message": message, "finish_reason": finish}]}).encode()
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(out)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Model)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# ---------------------------------------------------------------- the child
def private_home(workdir: Path) -> None:
    """Upstream reads HERMES_HOME when imported: a home of this run's own, with a context length
    in its config so upstream never looks the model up on the network; and a temporary directory
    of its own, where upstream's file tools keep their shell snapshot (else in /tmp, left behind)."""
    home = workdir / "hermes-home"
    home.mkdir(exist_ok=True)
    (home / "config.yaml").write_text("model:\n  context_length: 128000\n")
    os.environ["HERMES_HOME"] = str(home)
    scratch = workdir / "tmp"
    scratch.mkdir(exist_ok=True)
    os.environ["TMPDIR"] = str(scratch)


def child(model_url: str, workdir: str, shown: str, kill_at: str) -> None:
    private_home(Path(workdir))
    from hermes_state import SessionDB
    from run_agent import AIAgent

    def tool_start(call_id: str, name: str, _args: Any) -> None:
        if kill_at == "start":  # before the tool runs
            Path(shown).write_text(json.dumps({"call_id": call_id, "tool": name}))
            os.kill(os.getpid(), signal.SIGKILL)

    def tool_complete(call_id: str, name: str, _args: Any, result: Any) -> None:
        if kill_at == "complete":  # after it ran
            Path(shown).write_text(json.dumps({"call_id": call_id, "tool": name, "result": result}))
            os.kill(os.getpid(), signal.SIGKILL)

    agent = AIAgent(base_url=model_url, api_key="x", provider="custom", model="loopback", session_id=SESSION,
                    session_db=SessionDB(db_path=Path(workdir) / "state.db"), enabled_toolsets=["file"],
                    quiet_mode=True, skip_context_files=True, skip_memory=True, save_trajectories=False,
                    tool_start_callback=tool_start, tool_complete_callback=tool_complete)
    agent.run_conversation("Write hello to the file.")


# ------------------------------------------------------------------ parent
def spawn(args: list[str]) -> int:
    """Run this script as a child in its own session; return its exit status (-9: SIGKILLed).

    The child is waited for without being reaped, so its pid still names its process group when
    that group is killed (whatever the child left running goes with it); only then is it reaped.
    A child still running after TIMEOUT seconds is killed the same way."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, __file__, *args], start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=err)
        timer = threading.Timer(TIMEOUT, os.killpg, (proc.pid, signal.SIGKILL))
        timer.start()
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        timer.cancel()
        timer.join()
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        if proc.returncode not in (0, -signal.SIGKILL):
            err.seek(0)
            sys.stderr.write(err.read().decode(errors="replace"))
    return proc.returncode


def killed_turn(kill_at: str, work: Path) -> int:
    """One turn, killed in the named callback, in a child process with a model server of its own;
    the child's exit status."""
    work.mkdir()
    server = start_model(str(work / "out" / "note.txt"))
    try:
        return spawn(["child", f"http://127.0.0.1:{server.server_address[1]}/v1", str(work),
                      str(work / "shown.json"), kill_at])
    finally:
        server.shutdown()


def what_it_left(kill_at: str, work: Path, rc: int) -> dict[str, Any]:
    """Whether the file was written, the stored rows, and what upstream's resume replay says of the call."""
    shown = work / "shown.json"
    if rc != -signal.SIGKILL or not shown.exists():
        raise RuntimeError(f"the turn was not killed in tool_{kill_at}_callback (exit {rc})")
    call_id = json.loads(shown.read_text())["call_id"]
    private_home(work)  # upstream's classes read the store in the same home
    from agent.replay_cleanup import sanitize_replay_history
    from hermes_state import SessionDB

    db = SessionDB(db_path=work / "state.db")
    stored = db.get_messages_as_conversation(SESSION)
    db.close()
    # Each row as far as it can say whether the tool ran: its role, its text, the tools it calls
    # (call ids and the file's path differ between the two turns by construction).
    rows = [(m["role"], m.get("content"), [c["function"]["name"] for c in m.get("tool_calls") or []])
            for m in stored]
    replay = sanitize_replay_history([{k: v for k, v in m.items() if k != "timestamp"} for m in stored])
    told = [m.get("content") for m in replay if m.get("role") == "tool" and m.get("tool_call_id") == call_id]
    return {"ran": (work / "out" / "note.txt").exists(), "rows": rows, "told": told[0] if told else None,
            "shape": ", ".join(m["role"] + ("(tool_calls)" if m.get("tool_calls") else "") for m in stored)}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        child(*sys.argv[2:6])
        return 0
    from importlib.metadata import version

    print(f"hermes-agent {version('hermes-agent')}")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            # The two turns are independent: run them side by side, then read what each left.
            rcs: dict[str, int] = {}
            runs = [threading.Thread(target=lambda k=kill_at: rcs.__setitem__(k, killed_turn(k, Path(tmp) / k)))
                    for kill_at in ("start", "complete")]
            for run in runs:
                run.start()
            for run in runs:
                run.join()
            before = what_it_left("start", Path(tmp) / "start", rcs.get("start", 0))
            after = what_it_left("complete", Path(tmp) / "complete", rcs.get("complete", 0))
    except RuntimeError as exc:
        print(f"error: {exc}")
        return 2
    for name, r in (("tool_start_callback", before), ("tool_complete_callback", after)):
        print(f"killed in {name}: write_file ran = {r['ran']}; stored rows: {r['shape']}; "
              f"upstream's resume replay tells the model: {r['told']}")
    if before["ran"] != after["ran"] and before["rows"] == after["rows"]:
        print("FOUND: the two stores hold the same rows, though write_file ran in one and never started in the "
              "other: nothing durable records that a tool was started")
        return 1
    print("upstream's store tells a started tool from one never started")
    return 0


if __name__ == "__main__":
    sys.exit(main())
