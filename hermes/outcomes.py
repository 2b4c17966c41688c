"""What a tool call left without a result is answered: one vocabulary, one function.

A call can be left without a result when the process running it dies, when its turn is
interrupted mid-batch, or when the daemon ends its turn (cancelled, or given up). The transcript
must still answer it, truthfully: two facts decide the words, whether the call was dispatched
(its dispatch intent may be durable: it may have taken effect) and why its turn stopped.

    dispatched, any reason       -> the outcome is unknown: check before relying on it
                                     (a JSON object whose "status" is "outcome_unknown")
    not dispatched, interrupted  -> CANCELLED_RESULT
    not dispatched, ended        -> "Not run: ..." (a JSON object with an "error")

A call that crashed before it was dispatched is not answered here: recovery runs it.
"""
from __future__ import annotations

import json

CRASHED = "crashed"          # the process running the turn stopped; recovery answers the call
INTERRUPTED = "interrupted"  # the turn's interrupt cut the batch short
CANCELLED = "cancelled"      # a cancel request ended the turn (also the error such a turn ends 'failed' with)
GIVEN_UP = "given_up"        # the daemon gave the turn up (a crash loop, a limit), for a reason

# Written by recovery for an at_most_once call whose process died, and by the executors for a
# call their turn's interrupt cut off: worded to be true in both places.
UNKNOWN_OUTCOME = json.dumps({
    "status": "outcome_unknown",
    "error": ("This tool call was dispatched, then cut off before its result was saved: the process "
              "running it stopped, or its turn was cancelled while it ran. It was not run again, so its "
              "effect may or may not have happened. Check before relying on it or asking for it again."),
})
# Only for a call that never started: one that may have run is answered UNKNOWN_OUTCOME.
CANCELLED_RESULT = "[cancelled: the turn was interrupted before this tool call finished]"

_ENDED_UNKNOWN = {
    CANCELLED: ("The turn was cancelled while this tool call was running, so its result was never saved: it "
                "may or may not have taken effect. Check before relying on it or asking for it again."),
    GIVEN_UP: ("The daemon gave this turn up before this tool call's result was saved. The call was "
               "dispatched: it may or may not have taken effect. Check before relying on it or asking "
               "for it again. Reason: {reason}"),
}
_ENDED_NOT_RUN = {
    CANCELLED: "Not run: the turn was cancelled before the tool was dispatched.",
    GIVEN_UP: "Not run: the daemon gave this turn up before the tool was dispatched. Reason: {reason}",
}


def dangling_result(dispatched: bool, why: str, reason: str = "") -> str:
    """The result text of a call left without one (the table in the module docstring); `reason`:
    why a GIVEN_UP turn was given up."""
    if why in (CRASHED, INTERRUPTED):
        if dispatched:
            return UNKNOWN_OUTCOME
        if why == INTERRUPTED:
            return CANCELLED_RESULT
        raise ValueError("a call that crashed before its dispatch is run by recovery, not answered")
    if why not in _ENDED_UNKNOWN:
        raise ValueError(f"no answer for a call left by a turn that stopped as {why!r}")
    if dispatched:
        return json.dumps({"status": "outcome_unknown", "error": _ENDED_UNKNOWN[why].format(reason=reason)})
    return json.dumps({"error": _ENDED_NOT_RUN[why].format(reason=reason)})
