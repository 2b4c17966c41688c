"""Ctrl-C never lands between a commit and the runtime's note that it committed.

A flush commits the turn's new messages, then marks their dicts durable (row ids). A
KeyboardInterrupt raised in between (SIGINT comes at any bytecode of the main thread) would
leave committed messages looking unsaved, and the interrupted turn's last flush (hermes.executor
answers the calls an interrupt cuts off) would write them a second time. So SIGINT is held
back across a write and its bookkeeping and delivered the moment both are done: the write
finishes (or fails) first, as a database client's would.

Python runs signal handlers, and raises KeyboardInterrupt, only in the main thread, so only
there is anything held back; a handler that is not Python's (SIG_IGN, SIG_DFL) is left alone.
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from types import FrameType
from typing import Iterator

try:
    # The C functions behind `signal.getsignal` and `signal.signal`. Those wrappers map each handler
    # to an enum member, which for a function means raising and catching a ValueError: 8 us of the
    # three calls a hold makes, a third of a flush at synchronous=NORMAL (2026-12-07, 2 cores).
    from _signal import getsignal as _getsignal
    from _signal import signal as _setsignal
except ImportError:  # an interpreter without CPython's module: the same calls, wrapped
    from signal import getsignal as _getsignal
    from signal import signal as _setsignal


@contextmanager
def held() -> Iterator[None]:
    """Hold SIGINT back for the body; run the handler it would have run once the body is done."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = _getsignal(signal.SIGINT)
    if not callable(handler):  # SIG_IGN or SIG_DFL (plain ints from _signal), or None: not Python's
        yield
        return
    caught: list[FrameType | None] = []
    _setsignal(signal.SIGINT, lambda _signum, frame: caught.append(frame))
    try:
        yield
    finally:
        _setsignal(signal.SIGINT, handler)
        if caught:
            handler(signal.SIGINT, caught[0])  # Python's own: KeyboardInterrupt, here and now
