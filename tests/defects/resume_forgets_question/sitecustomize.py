"""Deliberate defect: a resumed turn goes on without its question.

Loaded only by worker processes (see `worker_only.is_worker`). Recovery looks for the turn's
question among the rows of the session and asks for the wrong turn's, so it finds none and
goes on with an empty one. The model's history is rebuilt from the transcript, so the answer
and every row stay right: only the reports of the turn carry the loss, here the trajectory log
that says which question the turn answered. `outcome-honesty` holds that log to the store.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "resume-forgets-question"


def _arm() -> None:
    import hermes.resume

    user_message = hermes.resume._user_message

    def question_of_no_turn(messages, turn_id, recorded):
        return user_message(messages, None, None)

    hermes.resume._user_message = question_of_no_turn
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
