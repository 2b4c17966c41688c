"""targetkit: describe a system under test so `hermes-supervisor chaos --target NAME` can crash-test it.

A target is one `Target` record, found through the entry-point group `hermes_supervisor.targets`
(`targetkit.registry`): its worker-side adapter module, its schema reader (`targetkit.schema`),
what it promises (`Promises`), its options, and the kill points it cannot reach. See
docs/targets.md, Your own target.

Stability: the names exported here keep their meaning and signatures through every 0.x release.
A change that would break one keeps the old spelling working, with a DeprecationWarning, for at
least one release first. Anything not exported here may change.
"""
from targetkit.registry import GROUP, UnknownTarget
from targetkit.schema import SchemaReader, Stored, TurnRow
from targetkit.target import (
    ANY,
    EFFECT_MISMATCH,
    FULL_PROMISES,
    INTENT_NOT_DURABLE,
    RAN_UNDISPATCHED,
    REQUEST_NOT_DURABLE,
    RERUN,
    RERUN_AFTER_CHECKPOINT_KILL,
    OptionError,
    Promises,
    Target,
    TargetOption,
)

__all__ = [
    "ANY", "EFFECT_MISMATCH", "FULL_PROMISES", "GROUP", "INTENT_NOT_DURABLE", "RAN_UNDISPATCHED",
    "REQUEST_NOT_DURABLE", "RERUN", "RERUN_AFTER_CHECKPOINT_KILL", "OptionError", "Promises", "SchemaReader",
    "Stored", "Target", "TargetOption", "TurnRow", "UnknownTarget",
]
