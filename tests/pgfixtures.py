"""Fixtures for tests that need PostgreSQL: one private cluster per test session (per xdist worker),
a fresh database per test. Import them into a test module (no conftest needed):

    from pgfixtures import pg_cluster, pg_url  # noqa: F401  (pytest finds fixtures by name)

``pg_cluster`` is a ``testkit.pgcluster.PgCluster``: Debian's PostgreSQL binaries, a 0700
temporary directory, a Unix socket only, stopped (and its directory removed) when the session
ends. ``pg_url`` is the libpq URL of a database made for the test (``CREATE DATABASE``) and
dropped after it (``DROP DATABASE ... WITH (FORCE)``, which also ends connections a test left open).

Nothing is skipped: without psycopg or without the PostgreSQL binaries these fixtures fail the
test with what to install. Importing this module needs neither (``.venv-upstream`` collects the
test modules that import it without running them).
"""
from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from types import ModuleType

import pytest

from testkit.pgcluster import PgBinariesMissing, PgCluster

PSYCOPG_HINT = ("psycopg 3 is not installed in this environment ({prefix}): scripts/setup installs the `postgres` "
                "extra into .venv (by hand: pip install -e '.[postgres]')")


def require_psycopg() -> ModuleType:
    """psycopg, or the test fails saying how to install it."""
    try:
        import psycopg
    except ImportError as exc:
        missing = f"{PSYCOPG_HINT.format(prefix=sys.prefix)} ({exc})"
    else:
        return psycopg
    pytest.fail(missing, pytrace=False)  # outside the except: the message alone, no chained traceback


def require_cluster() -> PgCluster:
    """A started cluster, or the test fails saying what to install."""
    require_psycopg()
    try:
        return PgCluster().start()
    except PgBinariesMissing as exc:
        missing = str(exc)
    pytest.fail(missing, pytrace=False)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    cluster = require_cluster()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def pg_url(pg_cluster: PgCluster) -> Iterator[str]:
    """A new, empty database on the session's cluster, for this test alone; dropped after it."""
    psycopg = require_psycopg()
    from psycopg import sql

    name = f"t_{uuid.uuid4().hex[:20]}"
    with psycopg.connect(pg_cluster.dsn(), autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {} ENCODING 'UTF8'").format(sql.Identifier(name)))
    try:
        yield pg_cluster.dsn(name)
    finally:
        with psycopg.connect(pg_cluster.dsn(), autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
