"""`fork_sibling()`: fork this process so that the child is a child of this process's parent.

The fork server (worker.forkserver) is a child of the supervisor, and a worker must be one
too: the supervisor waits for each worker itself, exactly once, and reads from the wait
status how it died. A plain fork makes the worker the template's child; the classic way
round it forks twice and lets the middle process exit, so the worker is re-parented. Linux
can do it in one step: clone(2) with CLONE_PARENT gives the new process the caller's parent.
That saves a fork and an exit of a process as large as the template for every worker, and
the wait for that exit before the template can answer.

Python has no clone(), so this calls the system call itself, framed exactly as `os.fork`
frames its fork(): `PyOS_BeforeFork()` before, `PyOS_AfterFork_Child()` /
`PyOS_AfterFork_Parent()` after (the interpreter's own locks, threads and at-fork hooks).
What the C library's fork() adds beyond the system call serves threads that might hold its
locks at that instant; the template never runs a second thread when it forks. The call
goes through `ctypes.PyDLL`, which keeps the GIL held across it, so the child starts with
the interpreter in the state `PyOS_AfterFork_Child` expects.

`available()` is False where the system call's number or argument order is not known here
(Linux on x86-64 and arm64 only) or ctypes cannot reach it; callers then fork twice.
"""
from __future__ import annotations

import ctypes
import os
import platform
import signal
import sys
from typing import Any

CLONE_PARENT = 0x00008000
# clone(2)'s number; on both, with a null stack the child runs on a copy of the caller's, as with fork.
_SYS_CLONE = {"x86_64": 56, "aarch64": 220}.get(platform.machine()) if sys.platform == "linux" else None

_clone: Any = None


def _load() -> Any:
    global _clone
    if _clone is None:
        call = ctypes.PyDLL(None, use_errno=True).syscall  # PyDLL: the GIL stays held across the call
        call.restype = ctypes.c_long
        call.argtypes = [ctypes.c_long, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                         ctypes.c_void_p]
        for name in ("PyOS_BeforeFork", "PyOS_AfterFork_Parent", "PyOS_AfterFork_Child"):
            getattr(ctypes.pythonapi, name).restype = None
        _clone = call
    return _clone


def available() -> bool:
    if _SYS_CLONE is None:
        return False
    try:
        _load()
    except (OSError, AttributeError):
        return False
    return True


def fork_sibling() -> int:
    """Like `os.fork()`, but the child's parent is this process's parent. Returns 0 in the child
    and the child's pid in the caller; OSError when the system refuses."""
    clone = _load()
    api = ctypes.pythonapi
    api.PyOS_BeforeFork()
    pid = clone(_SYS_CLONE, CLONE_PARENT | signal.SIGCHLD, None, None, None, None)
    if pid == 0:
        api.PyOS_AfterFork_Child()
        return 0
    error = ctypes.get_errno()
    api.PyOS_AfterFork_Parent()
    if pid < 0:
        raise OSError(error, os.strerror(error))
    return pid
