"""The reader threads: every database read of the HTTP API runs in one of a small pool
(`DB_READERS`), each thread through its own read-only connection, never on the event loop."""
from __future__ import annotations

import asyncio
import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from supervisor.daemon.reads import ReadStore

DB_READERS = 2               # reader threads (each with its read-only connection)


class ReaderThreads:
    """The pool and its connections, for one store (`reads`: what differs between SQLite and PostgreSQL)."""

    def __init__(self, reads: ReadStore) -> None:
        self.reads = reads
        self.pool: ThreadPoolExecutor | None = None
        self._local = threading.local()
        self._conns: list[Any] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        self.pool = ThreadPoolExecutor(DB_READERS, thread_name_prefix="http-db")

    def close(self) -> None:
        """Wait for the reads in flight, then close every connection."""
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            conn.close()

    def conn(self) -> Any:
        """(A reader thread.) Its read-only connection, opened at its first read (and again after one was lost)."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self.reads.connect()
            self._local.conn = conn
            with self._lock:
                self._conns.append(conn)
        return conn

    def _drop_conn(self) -> None:
        """(A reader thread.) Forget its connection, which a failure broke: the next read connects again."""
        conn, self._local.conn = getattr(self._local, "conn", None), None
        if conn is not None:
            with self._lock:
                self._conns = [c for c in self._conns if c is not conn]
            with contextlib.suppress(Exception):
                conn.close()

    def _in_thread(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """(A reader thread.) `fn(conn, *args)`; a driver error of PostgreSQL's as the StorageError to answer."""
        conn = None
        try:
            conn = self.conn()
            return fn(conn, *args)
        except self.reads.errors as exc:  # () on SQLite: its errors are answered as they are
            error = self.reads.failure(exc, conn)
            if getattr(error, "lost", False):
                self._drop_conn()
            raise error from exc

    async def read(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(conn, *args)` in a reader thread, through that thread's read-only connection."""
        assert self.pool is not None
        return await asyncio.get_running_loop().run_in_executor(self.pool, self._in_thread, fn, args)
