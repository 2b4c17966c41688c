"""A connection that hangs is cut (hermes.store.pg.deadline): a stopped backend fails the call as a
lost connection within the store's statement deadline, and the store's next call connects again."""
from __future__ import annotations

import os
import signal
import sqlite3

import pytest
from pgfixtures import pg_cluster, pg_url  # noqa: F401  (fixtures)

from hermes import persistence_failure


@pytest.mark.parametrize("call", ["write", "read"])
def test_a_hung_backend_fails_the_call_as_a_lost_connection(pg_url: str, call: str) -> None:  # noqa: F811
    from hermes.store.pg.sessiondb import PgSessionDB

    with PgSessionDB(pg_url, statement_deadline_s=1.0) as db:
        db.create_session("s1")
        backend = db._read("SELECT pg_backend_pid() AS pid")[0]["pid"]
        os.kill(backend, signal.SIGSTOP)  # the server's process for this connection stops answering
        try:
            with pytest.raises(sqlite3.OperationalError) as info:
                if call == "write":
                    db.write_pending("s1", [{"role": "user", "content": "hello", "_turn_id": "t1"}], start_turn="t1")
                else:
                    db.get_messages("s1")
        finally:
            os.kill(backend, signal.SIGCONT)
        assert "gave no answer in 1s" in str(info.value)
        assert persistence_failure.classify(info.value) == "connection"
        assert db._deadline.cut == 1
        # The next call opens a new connection; the cut write may or may not have committed (here the
        # backend never got to run it).
        assert db.get_messages("s1") == []
        db.write_pending("s1", [{"role": "user", "content": "hello", "_turn_id": "t1"}], start_turn="t1")
        assert [m["content"] for m in db.get_messages("s1")] == ["hello"]
        assert db._deadline.cut == 1  # calls that answer in time are never cut
