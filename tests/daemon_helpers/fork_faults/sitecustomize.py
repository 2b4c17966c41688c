"""Test only: make os.fork fail inside the worker template (`python -m worker.forkserver`).

$HERMES_TEST_FORK_FAULTS lists the forks to refuse, e.g. "outer:1,inner:2": the template's
own fork for its 1st spawn request (the intermediate), and the fork inside the intermediate of
its 2nd request (the worker). Read here only; nothing in the project knows of it.
"""
import errno
import os
import sys


def _is_template() -> bool:
    argv = list(getattr(sys, "orig_argv", sys.argv))
    return any(a == "-m" and b == "worker.forkserver" for a, b in zip(argv, argv[1:]))


def _arm(spec: str) -> None:
    faults = set()
    for item in spec.split(","):
        kind, _, n = item.strip().partition(":")
        if kind in ("outer", "inner") and n.isdigit():
            faults.add((kind, int(n)))
    real_fork = os.fork
    template = os.getpid()
    spawn = [0]  # the spawn request being served (an intermediate inherits the number)

    def fork() -> int:
        if os.getpid() == template:
            spawn[0] += 1
            if ("outer", spawn[0]) in faults:
                raise OSError(errno.EAGAIN, "fork refused (test fault, outer)")
        elif ("inner", spawn[0]) in faults:
            raise OSError(errno.EAGAIN, "fork refused (test fault, inner)")
        return real_fork()

    os.fork = fork


if _is_template() and os.environ.get("HERMES_TEST_FORK_FAULTS"):
    _arm(os.environ["HERMES_TEST_FORK_FAULTS"])
