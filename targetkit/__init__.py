"""targetkit: describe a system under test so `hermes-supervisor chaos --target NAME` can crash-test it.

A target is one `Target` record, found through the entry-point group `hermes_supervisor.targets`
(`targetkit.registry`): its worker-side adapter module, its schema reader (`targetkit.schema`),
what it promises (`Promises`), its options, and the kill points it cannot reach. See
docs/targets.md, Your own target.

Stability: the names exported here keep their meaning and signatures through every 0.x release.
A change that would break one keeps the old spelling working, with a DeprecationWarning, for at
least one release first. Anything not exported here may change.
"""
from typing import Any

from targetkit.policies import tool_policy
from targetkit.registry import GROUP, UnknownTarget
from targetkit.schema import SchemaReader, Stored, TurnRow
from targetkit.sql import SqlReader
from targetkit.target import (
    ANY,
    EFFECT_MISMATCH,
    FULL_PROMISES,
    INTENT_NOT_DURABLE,
    RAN_UNDISPATCHED,
    REQUEST_NOT_DURABLE,
    RERUN,
    RERUN_AFTER_CHECKPOINT_KILL,
    RESULT_PREVIEW,
    OptionError,
    Promises,
    Target,
    TargetOption,
    at_least_once_framework,
    parse_policies,
    plain_loop,
)

__all__ = [
    "ANY", "AT_MOST_ONCE", "EFFECT_MISMATCH", "FULL_PROMISES", "GROUP", "IDEMPOTENT", "INTENT_NOT_DURABLE",
    "RAN_UNDISPATCHED", "REQUEST_NOT_DURABLE", "RERUN", "RERUN_AFTER_CHECKPOINT_KILL", "RESULT_PREVIEW", "UNKNOWN_OUTCOME",
    "OptionError", "Promises", "SchemaReader", "SqlReader", "Stored", "Target", "TargetOption", "TurnContext",
    "TurnRow", "UnknownTarget", "at_least_once_framework", "parse_policies", "plain_loop", "tool_policy",
]

# The loop kit imports the runtime's tool layer (pydantic): loaded on first use, so that the
# supervisor, which reads target records on every start, never pays for it.
_LOOP = frozenset({"AT_MOST_ONCE", "IDEMPOTENT", "UNKNOWN_OUTCOME", "TurnContext"})


def __getattr__(name: str) -> Any:
    if name in _LOOP:
        from targetkit import loop

        return getattr(loop, name)
    raise AttributeError(f"module 'targetkit' has no attribute {name!r}")
