"""The daemon's built-in demo model, served when `serve` is given no `--base-url`: the scripted
model server on 127.0.0.1 with a script that looks each message up, then echoes it."""
from __future__ import annotations

from testkit.modelserver import Reply, Script, ScriptedModelServer, ToolCallSpec, last_user_text, reply_index


def echo_script() -> Script:
    """The built-in model: to any message, a `lookup` call, then an answer echoing the message."""

    def script(messages: list[dict]) -> Reply:
        text = last_user_text(messages) or ""
        if reply_index(messages) == 0:
            return Reply(tool_calls=(ToolCallSpec("lookup", {"key": " ".join(text.split())[:60]}),))
        return Reply(content=f"You said: {text}" if text.strip() else "You said nothing.")

    return script


def start_model(model: str) -> ScriptedModelServer:
    """Start the demo model (answering as `model`) on a free loopback port; the caller stops it."""
    return ScriptedModelServer(echo_script(), model=model, request_log=0).start()
