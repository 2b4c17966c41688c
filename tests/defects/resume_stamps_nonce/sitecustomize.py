"""Deliberate defect: recovery stamps a fresh random id into the results it writes.

Loaded only by worker processes (see `worker_only.is_worker`). When recovery finds an
at_most_once call that was dispatched and never answered, it records (and shows) a result
saying the outcome is unknown. Here each recovery draws an "incident" id, a fresh uuid4,
and stamps it into those results so that an operator can find them in the logs: a
well-meant addition that makes recovery depend on something other than the durable state.
Two recoveries of byte-identical copies of one crashed state then write different
transcripts, and the checker must report `recovery-determinism`.
"""
import json
import os
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "resume-stamps-nonce"


def _arm() -> None:
    import hermes.resume

    original = hermes.resume.resume_interrupted_turn
    plain = hermes.resume.UNKNOWN_OUTCOME

    def resume_with_incident_id(agent, **kwargs):
        # Read by recovery when it writes (and shows) an unknown outcome: this recovery's own text.
        hermes.resume.UNKNOWN_OUTCOME = json.dumps(dict(json.loads(plain), incident=uuid.uuid4().hex))
        return original(agent, **kwargs)

    # worker.main imports the name from hermes.resume after this module has run.
    hermes.resume.resume_interrupted_turn = resume_with_incident_id
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
