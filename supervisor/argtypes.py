"""Argument types shared by the `hermes-supervisor` verbs: each rejects bad input with one clear line."""
from __future__ import annotations

import argparse
from typing import Any, NoReturn


class UsageError(Exception):
    """Bad arguments or input: the verb prints one line on stderr and exits 2."""


class RaisingParser(argparse.ArgumentParser):
    """An argument parser whose errors raise UsageError instead of exiting, so every verb reports
    bad arguments the way it reports bad input. Never abbreviates an option (`--worker 2` is an
    error, not `--workers 2`): a flag added later must not change what an old command line means."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number of seconds, at least 0")
    return value


def quiet_broken_pipe(code: int = 141) -> int:
    """For a `main` that caught BrokenPipeError (`hermes-supervisor check | head`): point stdout at
    /dev/null so that the interpreter's last flush raises nothing, and return 128 + SIGPIPE, the
    status a shell reports for a writer its reader left (nothing is printed: the reader is gone)."""
    import os
    import sys

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return code
