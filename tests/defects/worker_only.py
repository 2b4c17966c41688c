"""Shared by the defect `sitecustomize` modules: arm a defect in worker processes only (or, for a
defect planted in the nemesis, in the supervisor running the campaign)."""
import sys


def is_worker() -> bool:
    """True in `python -m worker ...` and in a worker template (`python -m worker.forkserver`,
    whose forks inherit the patch); False in the supervisor and everywhere else."""
    # At start-up sys.argv is ['-m', ...] without the module name; orig_argv keeps it.
    argv = list(getattr(sys, "orig_argv", sys.argv))
    return any(a == "-m" and (b == "worker" or b.startswith("worker.")) for a, b in zip(argv, argv[1:]))


def is_campaign() -> bool:
    """True in the supervisor running a campaign (`python -m supervisor chaos ...`): for a defect
    planted in the nemesis itself rather than in the runtime it attacks."""
    argv = list(getattr(sys, "orig_argv", sys.argv))
    return any(a == "-m" and b == "supervisor" for a, b in zip(argv, argv[1:])) and "chaos" in argv
