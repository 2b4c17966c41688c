"""Deliberate defect: a tool call's dispatch intent is recorded after the tool ran.

Loaded only by worker processes (see `worker_only.is_worker`). The executors ask the turn to
record the dispatch intents of the calls they are about to run; here that request only
remembers the calls, and each intent is written together with its call's result, once the
tool has returned (as if "dispatched" meant "dispatched and finished"). Every tool therefore
runs while no durable row says it was started, and the supervisor, looking the intent up at
the instant of the effect, finds none: the checker must report `durable-before-effect`.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "intent-after-dispatch"


def _arm() -> None:
    from hermes import executor
    from hermes.turn import Turn

    record_now = Turn.record_intents
    finish_call = executor._finish_call

    def remember_intents(self, calls):
        self.__dict__.setdefault("_intents_not_yet_recorded", {}).update((c["id"], c) for c in calls)
        return True  # claims the intents are durable; nothing was written

    def record_with_result(turn, call, args, raw_result, messages):
        deferred = turn.__dict__.setdefault("_intents_not_yet_recorded", {})
        if deferred.pop(call["id"], None) is not None and not record_now(turn, [call]):
            return False
        return finish_call(turn, call, args, raw_result, messages)

    Turn.record_intents = remember_intents
    executor._finish_call = record_with_result
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
