"""testkit.pgcluster: a private PostgreSQL server on a Unix socket, gone when stopped.

Never skipped: without psycopg or the PostgreSQL binaries these tests fail saying what to install.
"""
from __future__ import annotations

import os
import stat

import pgfixtures
import pytest

from testkit.pgcluster import PgBinariesMissing, PgCluster


def _gone(pid: int) -> bool:
    """Whether no process of the group `pid` led is left."""
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_cluster_is_private_socket_only_and_leaves_nothing() -> None:
    psycopg = pgfixtures.require_psycopg()
    cluster = pgfixtures.require_cluster()
    try:
        root, pid = cluster.root, cluster.pid
        assert root is not None and pid is not None and cluster.running()
        assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
        if os.geteuid() == 0:  # PostgreSQL refuses root: it runs as the postgres system user
            assert os.stat(root).st_uid == os.stat(cluster.datadir).st_uid != 0
        assert os.getpgid(pid) == pid  # its own process group, for stop() to signal exactly it
        with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
            settings = dict(conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN "
                "('listen_addresses', 'unix_socket_directories', 'fsync', 'server_encoding')").fetchall())
            assert settings == {"listen_addresses": "", "unix_socket_directories": str(root), "fsync": "on",
                                "server_encoding": "UTF8"}
            assert conn.execute("SELECT current_user").fetchone()[0] == cluster.user
        # A connection left open does not hold the stop (fast shutdown ends it).
        leaked = psycopg.connect(cluster.dsn(), autocommit=True)
        cluster.stop()
        assert not cluster.running() and _gone(pid) and not root.exists()
        with pytest.raises(psycopg.OperationalError):
            leaked.execute("SELECT 1")
        leaked.close()
        cluster.stop()  # a second stop does nothing
    finally:
        cluster.stop()


def test_a_cluster_that_cannot_start_says_why_and_leaves_nothing() -> None:
    pgfixtures.require_psycopg()
    cluster = PgCluster(settings={"shared_buffers": "not-a-size"})
    with pytest.raises(RuntimeError, match="postgres exited"):
        cluster.start()
    assert cluster.root is None and cluster.proc is None


def test_missing_binaries_name_what_to_install() -> None:
    with pytest.raises(PgBinariesMissing, match="apt-get install postgresql"):
        PgCluster(bindir="/nonexistent/postgresql/bin")


def test_an_immediate_restart_ends_every_session_and_keeps_every_commit() -> None:
    """`restart()` is a crash of the server, as `pg_ctl restart -m immediate`: the old postmaster and
    its backends are gone, a client's session with it, but nothing committed before."""
    psycopg = pgfixtures.require_psycopg()
    cluster = pgfixtures.require_cluster()
    try:
        old = cluster.pid
        assert old is not None
        session = psycopg.connect(cluster.dsn(), autocommit=True)
        session.execute("CREATE TABLE kept (n int)")
        session.execute("INSERT INTO kept VALUES (1)")
        cluster.restart()
        assert cluster.running() and cluster.pid != old and _gone(old)
        with pytest.raises(psycopg.OperationalError):
            session.execute("SELECT 1")
        assert session.broken
        session.close()
        with psycopg.connect(cluster.dsn()) as conn:
            assert conn.execute("SELECT n FROM kept").fetchall() == [(1,)]
        assert "received immediate shutdown request" in cluster.log_tail(20000)
        with pytest.raises(ValueError):
            cluster.restart("smart")
    finally:
        cluster.stop()
    assert cluster.root is None
