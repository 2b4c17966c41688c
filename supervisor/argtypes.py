"""Argument types shared by the `hermes-supervisor` verbs: each rejects bad input with one clear line."""
from __future__ import annotations

import argparse
from typing import NoReturn


class UsageError(Exception):
    """Bad arguments or input: the verb prints one line on stderr and exits 2."""


class RaisingParser(argparse.ArgumentParser):
    """An argument parser whose errors raise UsageError instead of exiting, so every verb reports
    bad arguments the way it reports bad input."""

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
