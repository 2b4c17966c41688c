"""Test only: make forks fail inside the worker template (`python -m worker.forkserver`).

$HERMES_TEST_FORK_FAULTS lists the forks to refuse, e.g. "outer:1,inner:2": the template's
own fork for its 1st spawn request (the worker itself with worker.siblings, else the
intermediate of a double fork), and the fork inside the intermediate of its 2nd request (the
worker; only a double fork has one). $HERMES_TEST_DOUBLE_FORK=1 makes the template fork twice
even where it could fork once. Read here only; nothing in the project knows of either.
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

    from worker import siblings

    if os.environ.get("HERMES_TEST_DOUBLE_FORK"):
        siblings.available = lambda: False
        return
    real_sibling = siblings.fork_sibling

    def fork_sibling() -> int:
        spawn[0] += 1
        if ("outer", spawn[0]) in faults:
            raise OSError(errno.EAGAIN, "fork refused (test fault, outer)")
        return real_sibling()

    siblings.fork_sibling = fork_sibling


if _is_template() and os.environ.get("HERMES_TEST_FORK_FAULTS"):
    _arm(os.environ["HERMES_TEST_FORK_FAULTS"])
