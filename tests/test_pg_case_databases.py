"""A PostgreSQL campaign's case databases: a database a case gave back is emptied and renamed for the
next case instead of dropped and made again (two checkpoints of the server to make one, a third to
drop it), and only when it is as empty as a new one; otherwise it is dropped."""
from __future__ import annotations

from typing import Any

from pgfixtures import pg_cluster  # noqa: F401  (pytest finds fixtures by name)

from hermes.store.engines import open_store
from supervisor.chaos.pgstore import Databases, create_database, recycle_database
from testkit.pgcluster import PgCluster


def _databases(cluster: PgCluster) -> set[str]:
    import psycopg

    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        return {name for (name,) in conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'case%'")}


def _tables(url: str) -> list[str]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return [name for (name,) in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]


def test_a_given_back_database_comes_back_empty_under_a_new_name(pg_cluster: PgCluster) -> None:  # noqa: F811
    import psycopg

    name = create_database(pg_cluster)
    store = open_store(pg_cluster.dsn(name))  # the runtime's schema, and a session in it
    try:
        store.create_session("s-1", source="test")
    finally:
        store.close()
    lingering = psycopg.connect(pg_cluster.dsn(name), autocommit=True)  # a worker the case left connected
    try:
        with psycopg.connect(pg_cluster.dsn(), autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{name}" SET work_mem = \'8MB\'')
        again = recycle_database(pg_cluster, name)
    finally:
        lingering.close()
    assert again is not None and again != name
    assert name not in _databases(pg_cluster) and again in _databases(pg_cluster)
    assert _tables(pg_cluster.dsn(again)) == []
    with psycopg.connect(pg_cluster.dsn(), autocommit=True) as conn:
        settings = conn.execute("SELECT count(*) FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase "
                                "WHERE d.datname = %s", (again,)).fetchone()[0]
    assert settings == 0
    store = open_store(pg_cluster.dsn(again))  # the next case makes its schema afresh
    try:
        assert store.get_messages_as_conversation("s-1") == []
    finally:
        store.close()


def test_a_database_holding_more_than_tables_is_not_recycled(pg_cluster: PgCluster) -> None:  # noqa: F811
    import psycopg

    name = create_database(pg_cluster)
    with psycopg.connect(pg_cluster.dsn(name), autocommit=True) as conn:
        conn.execute("CREATE FUNCTION left_behind() RETURNS int LANGUAGE sql AS 'SELECT 1'")
    assert recycle_database(pg_cluster, name) is None  # Databases drops it instead


def test_the_campaigns_databases_are_reused_without_making_new_ones(pg_cluster: PgCluster,  # noqa: F811
                                                                     monkeypatch: Any) -> None:
    import supervisor.chaos.pgstore as pgstore

    made: list[str] = []

    def counted(cluster: PgCluster) -> str:
        made.append(create_database(cluster))
        return made[-1]

    monkeypatch.setattr(pgstore, "create_database", counted)
    databases = Databases(pg_cluster, ahead=1)
    try:
        for _ in range(5):  # five cases, one after the other
            name = databases.take()
            assert _tables(pg_cluster.dsn(name)) == []
            open_store(pg_cluster.dsn(name)).close()
            databases.give_back(name)
    finally:
        databases.close()
    assert len(made) <= 2  # the one made ahead, and one more while the first was being emptied at most
