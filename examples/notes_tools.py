"""A notebook agent's tools: add a note, list the latest ones.

Run it with ``python -m worker run --tools examples.notes_tools ...`` (see examples/README.md).
The notes are JSON lines in ``$NOTES_DIR/notes.jsonl`` (default ``$HERMES_HOME/notes``, else
``~/.hermes/notes``), a 0600 file in a 0700 directory.

``add_note`` is at-most-once: adding a note is an effect nobody wants twice, so if a worker
dies between starting it and recording its result, recovery does not run it again; it tells
the model the outcome is unknown (the model can then call ``list_notes`` to see). Each note
keeps the call's idempotency key, so a second run of the same call is visible, and is refused
rather than written twice. ``list_notes`` only reads: idempotent, and safe to run in parallel.
"""
from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from hermes.private_files import FILE_MODE, make_private_dirs
from hermes.tools import ToolContext, tool

TOOLSET = "notes"


def notes_file() -> Path:
    """Where the notes are kept (read from the environment at each call)."""
    home = os.environ.get("HERMES_HOME") or str(Path.home() / ".hermes")
    folder = Path(os.environ.get("NOTES_DIR") or Path(home) / "notes")
    return make_private_dirs(folder) / "notes.jsonl"


def _read_notes(fh: Any) -> list[dict[str, Any]]:
    fh.seek(0)
    notes = []
    for line in fh.read().splitlines():
        try:
            notes.append(json.loads(line))
        except ValueError:
            continue  # a line cut short by a crash mid-write is not a note
    return notes


@tool(policy="at_most_once")
def add_note(text: Annotated[str, Field(min_length=1, max_length=4000)], ctx: ToolContext) -> dict[str, Any]:
    """Write a note down in the user's notebook. Use it once per thing to remember.

    Args:
        text: The note, in the user's words.
    """
    key = ctx.idempotency_key or f"{ctx.session_id}:{ctx.turn_id}:{ctx.tool_call_id}"
    fd = os.open(notes_file(), os.O_RDWR | os.O_APPEND | os.O_CREAT, FILE_MODE)
    with os.fdopen(fd, "r+", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # one writer at a time, across processes
        notes = _read_notes(fh)
        earlier = next((n for n in notes if n.get("key") == key), None)
        if earlier is not None:
            return {"added": False, "id": earlier["id"], "text": earlier["text"],
                    "reason": "this call already added this note; it was not written again"}
        note = {"id": len(notes) + 1, "text": text, "key": key, "session": ctx.session_id, "turn": ctx.turn_id,
                "added_at": round(time.time(), 3)}
        fh.write(json.dumps(note, ensure_ascii=False) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return {"added": True, "id": note["id"], "text": text}


@tool(policy="idempotent", parallel_safe=True)
def list_notes(limit: Annotated[int, Field(ge=1, le=100)] = 10) -> list[dict[str, Any]]:
    """List the latest notes of the user's notebook, newest last.

    Args:
        limit: How many of the latest notes to list.
    """
    path = notes_file()
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_SH)
        notes = _read_notes(fh)
    return [{"id": n["id"], "text": n["text"], "added_at": n["added_at"]} for n in notes[-limit:]]
