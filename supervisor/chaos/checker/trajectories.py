"""The trajectory log, held to the store: a report of each finished turn, judged by outcome-honesty.

Our runtime can append every turn it finishes to `trajectories.jsonl` in its home (the question,
the transcript, whether the turn completed), a log people train and audit on. A campaign turns it
on (`--save-trajectories`), so that what the log says of a turn is judged as what the worker
reports is: the runtime writes a line only after the turn is durably done, so every line must
name a turn of its session that is `done` in the store, say it completed, and carry that turn's
own question and its durable answer.

The file is not synced, and a kill may land mid-write: a line may be missing, or torn at its
end and joined to the next. A line that is not a JSON object is not judged. A missing line is a
violation only where nothing excuses it: the worker that finished the turn wrote its line before it
reported the turn completed, so a turn a worker reported finishing must have one, unless a power
cut came after the report (the log is not synced) or the case filled the disk (the runtime answers
a log it cannot write with a warning, never by failing the turn).
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


# The turn_exit_reason of an outcome that found its turn already ended (worker.targets.hermes): the
# reporting worker did not finish it, so it wrote no line for it.
FOUND_FINISHED = "already_finished"


def unlogged_completions(events: list[dict[str, Any]], lines: list[dict[str, Any]]) -> list[Violation]:
    """A violation for each turn a worker reported it finished (completed, with an answer) that has
    no line in the log, where nothing excuses the missing line (the module docstring)."""
    if any(e.get("type") == "storage_fault" and e.get("fault") == "disk" for e in events):
        return []
    logged = {line.get("turn") for line in lines}
    cuts = [i for i, e in enumerate(events) if e.get("type") == "power_cut"]
    violations = []
    for index, event in enumerate(events):
        if event.get("type") != "outcome":
            continue
        result = event.get("result") or {}
        if (result.get("outcome") != "completed" or result.get("final_response") is None
                or result.get("turn_exit_reason") == FOUND_FINISHED or any(cut > index for cut in cuts)):
            continue
        turn_id = result.get("turn_id")
        if turn_id not in logged:
            violations.append(Violation(
                OUTCOME_HONESTY, f"worker {event.get('incarnation')} reported turn {turn_id} completed, and the "
                                 "trajectory log has no line for it", {"turn": turn_id, "outcome": result}))
    return violations
