"""The systems a campaign can crash-test, and the promises each one makes.

A promise decides a violation's class: breaking a rule that rests on a promise the
target never made is a CONTRACT finding, anything else is DAMAGE (see supervisor.checker).
"""
from __future__ import annotations

from supervisor.checker import FULL_PROMISES, Promises

PROMISES: dict[str, Promises] = {
    "hermes": FULL_PROMISES,
    # Upstream hermes-agent records no dispatch intents, shows results before its flush commits
    # them, and streams without ever retracting: findings there are CONTRACT, not DAMAGE.
    "hermes-agent": Promises(dispatch_intents=False, stream_retraction=False, durable_projections=False),
}
TARGETS = tuple(PROMISES)
