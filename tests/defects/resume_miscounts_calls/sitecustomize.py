"""Deliberate defect: a recovery that finds the answer already stored reports a model call.

Loaded only by worker processes (see `worker_only.is_worker`). A worker killed after its answer
was committed and before its turn was marked done leaves recovery nothing to ask the model:
it marks the turn done and reports the stored answer. Here it reports one model call for it
(the call that made the answer, in an earlier process), so a caller that bills or limits by the
reported count pays twice. Every row stays right; `outcome-honesty` holds the count to the
`model.request` probes of the worker that reported it.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "resume-miscounts-calls"


def _arm() -> None:
    import hermes.resume

    resume = hermes.resume.resume_interrupted_turn

    def counting_the_stored_answer(agent, **kwargs):
        result = resume(agent, **kwargs)
        if result is not None and result.get("completed") and result.get("api_calls") == 0:
            result["api_calls"] = 1
        return result

    hermes.resume.resume_interrupted_turn = counting_the_stored_answer
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
