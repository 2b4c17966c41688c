"""Deliberate defect: the final answer is taken for durable before it is written.

Loaded only by worker processes (see `worker_only.is_worker`). The answer message is appended
to the live transcript already stamped `_db_persisted` (as rows loaded from the database
are), so the flush in `finalize_turn` finds nothing pending, reports success, and the turn
is marked 'done' while its answer exists only in memory. The checker must report
`answer-once`: a completed turn without a final answer.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "answer-never-flushed"


def _arm() -> None:
    import hermes.runner

    fill_or_append_answer = hermes.runner.fill_or_append_answer

    def append_answer_stamped_durable(messages, text, turn_id):
        message = fill_or_append_answer(messages, text, turn_id)
        message["_db_persisted"] = True
        return message

    hermes.runner.fill_or_append_answer = append_answer_stamped_durable
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
