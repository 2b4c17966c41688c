"""Named boundary points where a process could die with a different durable state.

The runtime calls :func:`fire` at each boundary. Until a handler is installed a
probe is a single global lookup and a return, so production turns pay nothing.
A worker installs a handler that reports each hit to its supervisor and, when a
kill plan names the hit, dies on the spot.
"""
from __future__ import annotations

from typing import Any, Protocol


class ProbeHandler(Protocol):
    def __call__(self, name: str, context: dict[str, Any]) -> None: ...


# The public list of kill points, in the order a turn meets them. Keep it in step
# with the design document and `hermes-supervisor chaos --list-points`.
POINTS: tuple[str, ...] = (
    "turn.start",
    "model.request",
    "model.chunk",
    "model.response",
    "flush.begin",
    "flush.in_txn",
    "flush.committed",
    "callback.interim.before",
    "callback.interim.after",
    "tool.dispatch.before",
    "tool.dispatch.after",
    "callback.tool_complete.before",
    "callback.tool_complete.after",
    "finalize.before",
    "finalize.after",
    "compact.in_txn",
    "resume.begin",
    "resume.reconciled",
)

_handler: ProbeHandler | None = None


def install(handler: ProbeHandler | None) -> ProbeHandler | None:
    """Install `handler` (None removes it); returns the previous one."""
    global _handler
    previous, _handler = _handler, handler
    return previous


def installed() -> bool:
    """Whether a handler listens; callers on hot paths skip building a probe's context otherwise."""
    return _handler is not None


def fire(name: str, **context: Any) -> None:
    """Report that execution reached boundary `name`.

    The handler may never return (the process is killed inside it); everything the
    runtime made durable before this call must already be committed.
    """
    handler = _handler
    if handler is None:
        return
    handler(name, context)


def is_known(name: str) -> bool:
    return name in POINTS

