"""The trajectory log, held to the store: a report of each finished turn, judged by outcome-honesty.

Our runtime can append every turn it finishes to `trajectories.jsonl` in its home (the question,
the transcript, whether the turn completed), a log people train and audit on. A campaign turns it
on (`--save-trajectories`), so that what the log says of a turn is judged as what the worker
reports is: the runtime writes a line only after the turn is durably done, so every line must
name a turn of its session that is `done` in the store, say it completed, and carry that turn's
own question and its durable answer.

The file is not synced, and a kill may land mid-write: a line may be missing, or torn at its
end and joined to the next. A missing line is no violation, and a line that is not a JSON
object is not judged.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from supervisor.chaos.checker.evidence import final_answers, quote
from supervisor.chaos.checker.verdict import OUTCOME_HONESTY, Violation
from supervisor.chaos.durable import Durable
from supervisor.chaos.history import canonical_json

TRAJECTORIES = "trajectories.jsonl"  # the runtime's name for it, in its home


def read_trajectories(path: Path) -> list[dict[str, Any]]:
    """The log's judgeable lines: each one a JSON object. No file is an empty log; an unreadable
    file raises OSError (the caller cannot judge what it cannot read)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    lines = []
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue  # torn by a kill mid-write
        if isinstance(value, dict):
            lines.append(value)
    return lines


def trajectory_violations(d: Durable, lines: list[dict[str, Any]], *, lossy: bool) -> list[Violation]:
    """What the log says of each turn, against the durable state. `lossy`: a power cut at a level
    that documents losing the last commits came in the case, so a turn it logged may durably be
    unfinished again (power-cut-durability reports that loss)."""
    turns = {t["id"]: t for t in d.turns}
    questions = {r["turn_id"]: r["content"] for r in d.rows if r["role"] == "user" and r["cloned_from"] is None}
    answers = final_answers(d)
    violations = []
    for index, line in enumerate(lines):
        turn_id = line.get("turn")
        turn = turns.get(turn_id) if isinstance(turn_id, str) else None
        where = {"line": index + 1, "turn": turn_id}

        def wrong(message: str, **witness: Any) -> None:
            violations.append(Violation(OUTCOME_HONESTY, f"the trajectory log's line {index + 1}: {message}",
                                        {**where, **witness}))

        if turn is None or turn["state"] != "done":
            if not lossy:
                wrong(f"records turn {turn_id} finished; durably it is {'absent' if turn is None else turn['state']}")
            continue
        if line.get("session") != turn["session_id"]:
            wrong(f"records turn {turn_id} in session {line.get('session')!r}; durably it is in "
                  f"{turn['session_id']!r}")
        if line.get("completed") is not True:
            wrong(f"records turn {turn_id} as not completed, though it is durably done",
                  completed=line.get("completed"))
        if turn_id in questions and canonical_json(line.get("user")) != canonical_json(questions[turn_id]):
            wrong(f"records a question that is not turn {turn_id}'s", logged=quote(line.get("user")),
                  durable=quote(questions[turn_id]))
        messages = line.get("messages")
        last = messages[-1] if isinstance(messages, list) and messages else None
        said = last.get("content") if isinstance(last, dict) else None
        durable = [a["content"] for a in answers.get(turn_id, ())]
        if durable and said not in durable:
            wrong(f"ends turn {turn_id} with a message that is not its durable answer", logged=quote(said),
                  durable=quote(durable[-1]))
    return violations
