"""Deliberate defect: recovery "repairs" the interrupted assistant row in place.

Loaded only by worker processes (see `worker_only.is_worker`). Some agents, finding an
assistant message whose tool calls have no results (the process died mid-batch), make the
transcript look valid again by rewriting that message: the unanswered calls are stripped
from it with an UPDATE. Here recovery does that before reconciling. The durable row the
killed worker committed (and the supervisor saw) now says something else, which the
contract forbids ("recovery never rewrites a row it did not append"): the checker must
report `sanitize-pure`. (With every call stripped, the row's text then passes for the
turn's answer, so other invariants usually fail too.)
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "resume-rewrites-dangling"


def _arm() -> None:
    import hermes.resume
    from hermes.transcript import trailing_tool_block

    original = hermes.resume.resume_interrupted_turn

    def strip_dangling_calls_then_resume(agent, **kwargs):
        db = agent.session_db
        turn = db.running_turn(agent.session_id) if db is not None else None
        if turn is not None:
            block, answered = trailing_tool_block(db.load_live_messages(agent.session_id))
            if (block is not None and block.get("_turn_id") == turn["id"]
                    and any(c["id"] not in answered for c in block["tool_calls"])):
                kept = [c for c in block["tool_calls"] if c["id"] in answered]
                db._execute_write(lambda conn: conn.execute(
                    "UPDATE messages SET tool_calls = ? WHERE id = ?",
                    (json.dumps(kept) if kept else None, block["_row_id"])), session_id=agent.session_id)
        return original(agent, **kwargs)

    # worker.main imports the name from hermes.resume after this module has run.
    hermes.resume.resume_interrupted_turn = strip_dangling_calls_then_resume
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
