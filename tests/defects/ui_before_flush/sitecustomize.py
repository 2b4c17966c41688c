"""Deliberate defect: the interim assistant text reaches the UI before its row is committed.

Loaded only by worker processes (see `_is_worker`): when this directory is first on
PYTHONPATH, Python imports this module at start-up. The flush that would make an
assistant tool-call block durable first shows the block's text to the UI, then
commits. The runtime's own projection after the flush still happens, so the text is
shown twice: once too early, once on time. The checker must report
`durable-before-visible`.
"""
import sys

DEFECT = "ui-before-flush"


def _is_worker() -> bool:
    """True in `python -m worker ...` and in a worker template (`python -m worker.forkserver`,
    whose forks inherit the patch); False in the supervisor and everywhere else."""
    # At start-up sys.argv is ['-m', ...] without the module name; orig_argv keeps it.
    argv = list(getattr(sys, "orig_argv", sys.argv))
    return any(a == "-m" and (b == "worker" or b.startswith("worker.")) for a, b in zip(argv, argv[1:]))


def _arm() -> None:
    from hermes.runner import AIAgent

    original = AIAgent._flush_incremental

    def flush_after_showing(self, messages):
        tail = messages[-1] if messages else None
        if (tail is not None and tail.get("role") == "assistant" and tail.get("tool_calls")
                and tail.get("content") and not tail.get("_db_persisted")):
            self._project_interim(tail["content"], already_streamed=False)
        return original(self, messages)

    AIAgent._flush_incremental = flush_after_showing
    print(f"defect armed: {DEFECT}", file=sys.stderr, flush=True)


if _is_worker():
    _arm()
