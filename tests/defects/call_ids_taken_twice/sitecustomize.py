"""Deliberate defect: a tool call keeps an id its turn already used.

Loaded only by worker processes (see `worker_only.is_worker`). A provider that numbers its calls
per response (`append_note:0` on every round) gives the rounds of one turn the same ids. The
runtime renames a taken id before committing the block (`hermes.transcript.turn_unique_calls`);
here it keeps the provider's, so two calls share one dispatch intent and one idempotency key:
an at-most-once tool is recorded as running twice for one call, an idempotent write is told
"stored" under the first call's key and never applied, and a call killed before its dispatch is
taken for one that was dispatched. Only a campaign whose model reuses ids (`--call-ids numbered`)
can show it.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from worker_only import is_worker  # noqa: E402

DEFECT = "call-ids-taken-twice"


def _arm() -> None:
    import hermes.runner

    hermes.runner.turn_unique_calls = lambda calls, messages, turn_id: list(calls)
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if is_worker():
    _arm()
