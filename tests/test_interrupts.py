"""hermes.interrupts.held: a Ctrl-C inside the block is delivered when the block is done, not in it.

Signals are real (the test process sends itself SIGINT); Python runs their handlers in the main
thread only, which is where pytest runs each test.
"""
from __future__ import annotations

import os
import signal
import threading
from types import FrameType
from typing import Iterator

import pytest

from hermes import interrupts


@pytest.fixture(autouse=True)
def pythons_own_handler() -> Iterator[None]:
    """Each test starts from Python's own SIGINT handler, whatever this test run inherited (a shell's
    background job starts with SIGINT ignored, and Python then leaves it ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_ctrl_c_inside_is_raised_once_the_block_is_done() -> None:
    done = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts.held():
            os.kill(os.getpid(), signal.SIGINT)
            done.append("the rest of the block ran")  # a handler would have raised before this
    assert done == ["the rest of the block ran"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_without_a_ctrl_c_nothing_happens_and_the_handler_is_back() -> None:
    with interrupts.held():
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_handler_of_the_applications_own_runs_after_the_block_once() -> None:
    calls: list[int] = []

    def own(signum: int, _frame: FrameType | None) -> None:
        calls.append(signum)

    previous = signal.signal(signal.SIGINT, own)
    try:
        with interrupts.held():
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
            assert calls == []
        assert calls == [signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is own
    finally:
        signal.signal(signal.SIGINT, previous)


def test_an_ignored_sigint_stays_ignored() -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with interrupts.held():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)


def test_outside_the_main_thread_nothing_is_touched() -> None:
    seen: list[object] = []

    def other() -> None:
        with interrupts.held():
            seen.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert seen == [signal.default_int_handler]
