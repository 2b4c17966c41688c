"""Campaigns on PostgreSQL (``chaos --store postgres``): a case's database on a private server, and the
images of it the supervisor reads.

A campaign on PostgreSQL starts one private cluster (`start_cluster`, testkit.pgcluster: a Unix
socket in a 0700 directory, stopped by its recorded pid when the campaign closes). Each case gets
a database of its own on it (`CaseDatabase`: made by ``CREATE DATABASE``, a few ahead of the cases
that take them (`Databases`), dropped once the case is over), and its workers get ``--store URL``.

The checker judges a SQLite state database; the server's state is judged the same way: every read
the runner makes of the case's state (its snapshots, a turn's state, the final check, the observer
that looks each projection up while the worker waits) reads an *image* made at that moment
(``hermes.store.pg.image.copy_to_sqlite``: one REPEATABLE READ snapshot of the database, written
as the SQLite file ``SessionDB`` would have written). Images go in the case's directory, beside
its agent home, so the checker finds a spilled result where it finds it on SQLite; the final one
is the case's ``state.db``, kept with the case when it fails, as the evidence the server's
database no longer is once the campaign's cluster is gone.
"""
from __future__ import annotations

import itertools
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from testkit.pgcluster import PgCluster

if TYPE_CHECKING:
    from supervisor.chaos.config import CampaignConfig

SQLITE, POSTGRES = "sqlite", "postgres"
STORES = (SQLITE, POSTGRES)
# An image read while the server restarts (`--faults pg-restart`) is taken again once it is back.
IMAGE_PATIENCE_S = 30.0
ADMIN_APPLICATION = "hermes-chaos-admin"


class StoreUnavailable(Exception):
    """A campaign on PostgreSQL cannot run here or with these options; says why in one line."""


def check_runnable(config: CampaignConfig) -> None:
    """Raise StoreUnavailable unless `config` can run on its store: on PostgreSQL, our runtime
    (the only target with a PostgreSQL engine), psycopg, and the server's binaries."""
    if config.store == SQLITE:
        return
    if config.store != POSTGRES:
        raise StoreUnavailable(f"--store {config.store!r}: choose from {', '.join(STORES)}")
    if config.target != "hermes":
        raise StoreUnavailable(f"--store postgres runs our runtime (--target hermes); {config.target} keeps its "
                               "state in a SQLite file of its own")
    try:
        import hermes.store.pg.image  # noqa: F401  (psycopg, or the error naming the extra)
        from testkit.pgcluster import find_bindir

        find_bindir()
    except ImportError as exc:
        raise StoreUnavailable(str(exc)) from None
    except RuntimeError as exc:  # PgBinariesMissing
        raise StoreUnavailable(f"--store postgres: {exc}") from None


def start_cluster() -> PgCluster:
    """A private server for a campaign (or one case). ``fsync`` stays on, the server's default, so the
    workers' durability settings mean on it what they say."""
    return PgCluster().start()


def admin(cluster: PgCluster) -> Any:
    """A new autocommit connection to `cluster`'s own ``postgres`` database (close it)."""
    import psycopg

    return psycopg.connect(cluster.dsn(), autocommit=True, application_name=ADMIN_APPLICATION)


def create_database(cluster: PgCluster) -> str:
    """A new, empty UTF-8 database on `cluster`; its name (unique: the case's history records it)."""
    from psycopg import sql

    name = f"case_{uuid.uuid4().hex[:16]}"
    with admin(cluster) as conn:
        statement = sql.SQL("CREATE DATABASE {} ENCODING 'UTF8'").format(sql.Identifier(name))
        if conn.info.server_version >= 150000:
            # Copied as files, between two checkpoints (the strategy of every release before 15), not
            # written page by page to the WAL: faster to make, and a restart of the server
            # (pg-restart) does not replay and checkpoint the whole template database again.
            statement += sql.SQL(" STRATEGY FILE_COPY")
        conn.execute(statement)
    return name


def drop_database(cluster: PgCluster, name: str) -> str | None:
    """Drop database `name`, ending any connection to it (a worker a case left hanging included).
    Returns why it could not be dropped, or None: a database left behind only takes room on a
    server the campaign removes when it closes, so it never fails a case."""
    import psycopg
    from psycopg import sql

    if not cluster.running():
        return None  # a server already stopped: its data went with it
    try:
        with admin(cluster) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    except psycopg.Error as exc:
        return " ".join(str(exc).split())
    return None


# What a case's database still holds of its own once its tables are dropped: any relation,
# function, type or schema outside the server's own (a new database has none).
_OWN_OBJECTS = """
SELECT (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname !~ '^pg_' AND n.nspname <> 'information_schema')
     + (SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname !~ '^pg_' AND n.nspname <> 'information_schema')
     + (SELECT count(*) FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
        WHERE n.nspname !~ '^pg_' AND n.nspname <> 'information_schema')
     + (SELECT count(*) FROM pg_namespace WHERE nspname !~ '^pg_' AND nspname NOT IN ('information_schema', 'public'))
"""


def recycle_database(cluster: PgCluster, name: str) -> str | None:
    """Database `name`, which a case is done with, emptied and renamed for the next case: every
    connection to it ended, every table of the public schema dropped, its settings reset. Returns
    its new name, or None when it still holds anything a new database would not (then drop it):
    a new one costs the server two checkpoints, this none."""
    import psycopg
    from psycopg import sql

    if not cluster.running():
        return None
    fresh = f"case_{uuid.uuid4().hex[:16]}"
    try:
        with admin(cluster) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE datname = %s AND pid <> pg_backend_pid()", (name,))
        with psycopg.connect(cluster.dsn(name), autocommit=True, application_name=ADMIN_APPLICATION) as conn:
            tables = [row[0] for row in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()]
            if tables:
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(
                    sql.SQL(", ").join(sql.Identifier("public", t) for t in tables)))
            left = conn.execute(_OWN_OBJECTS).fetchone()[0]
        if left:
            return None
        with admin(cluster) as conn:
            conn.execute(sql.SQL("ALTER DATABASE {} RESET ALL").format(sql.Identifier(name)))
            conn.execute(sql.SQL("ALTER DATABASE {} RENAME TO {}").format(sql.Identifier(name), sql.Identifier(fresh)))
    except psycopg.Error:
        return None  # a connection that came back, a server going down: the database is dropped instead
    return fresh


class Databases:
    """The databases of the cases on the campaign's server: made `ahead` of the cases that take
    them; once given back, emptied and renamed for another case (`recycle_database`), else dropped.

    Making one waits for two checkpoints of the server and dropping one for a third: 350 ms a case
    on 2 cores (2026-12-07), more than a single-tool case's own time, on this one thread. Emptying
    one costs no checkpoint. A database a case takes is an empty one like any other: nothing of a
    case is in it before the case takes it, and a case's final image is made before it gives its
    database back.
    """

    def __init__(self, cluster: PgCluster, ahead: int) -> None:
        self.cluster = cluster
        self.ahead = max(1, ahead)
        self._ready: list[str] = []
        self._retired: list[str] = []
        self._failed: BaseException | None = None
        self._closed = False
        self._changed = threading.Condition()
        self._worker = threading.Thread(target=self._work, name="pg databases", daemon=True)
        self._worker.start()

    def _work(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._closed or self._retired or len(self._ready) < self.ahead)
                if self._closed:
                    return
                retired = self._retired.pop(0) if self._retired else None
            if retired is not None:
                again = recycle_database(self.cluster, retired)
                if again is None:
                    drop_database(self.cluster, retired)  # one not dropped goes with the server
                    continue
                with self._changed:
                    self._ready.append(again)
                    self._changed.notify_all()
                continue
            try:
                name = create_database(self.cluster)
            except BaseException as exc:  # noqa: BLE001  (said by `take`, to the case that needed one)
                with self._changed:
                    self._failed = exc
                    self._changed.notify_all()
                return
            with self._changed:
                self._ready.append(name)
                self._changed.notify_all()

    def give_back(self, name: str) -> None:
        """A case is done with database `name`: it is dropped, soon."""
        with self._changed:
            self._retired.append(name)
            self._changed.notify_all()

    def take(self) -> str:
        """The name of an empty database, for one case alone."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._ready or self._failed or self._closed, timeout=120.0):
                raise RuntimeError("no database was made on the campaign's PostgreSQL server within 120 s")
            if not self._ready:
                raise RuntimeError(f"no database could be made on the campaign's PostgreSQL server: {self._failed}")
            name = self._ready.pop(0)
            self._changed.notify_all()
            return name

    def close(self) -> None:
        """Make no more (what was made goes with the server)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self._worker.join()


class CaseDatabase:
    """One case's database `name` on `cluster`, and images of it in the case's directory `case_dir`."""

    def __init__(self, cluster: PgCluster, case_dir: Path, name: str) -> None:
        from hermes.store.pg.image import Imager

        self.cluster = cluster
        self.case_dir = case_dir
        self.name = name
        self.url = cluster.dsn(name)
        self._images = itertools.count(1)
        self._lock = threading.Lock()
        self._imager = Imager(self.url)  # its connections kept from image to image (`close_images`)

    def admin(self) -> Any:
        """A new autocommit connection to the cluster's own ``postgres`` database (close it)."""
        return admin(self.cluster)

    def drop(self) -> str | None:
        """`drop_database` of this one."""
        self.close_images()
        return drop_database(self.cluster, self.name)

    def close_images(self) -> None:
        """Close the connections the images of this database keep (before it is dropped or given back)."""
        self._imager.close()

    # ------------------------------------------------------------------ images
    def image_to(self, path: Path, *, durable: bool = False) -> Path:
        """An image of the database now, at `path` (see the module docstring). A server that is
        restarting is waited for, up to IMAGE_PATIENCE_S; what it holds once back is the state."""
        from hermes.store.pg.image import StoreUnreadable

        deadline = time.monotonic() + IMAGE_PATIENCE_S
        while True:
            try:
                return self._imager.copy_to_sqlite(path, durable=durable)
            except StoreUnreadable as exc:
                if exc.cause != "connection" or time.monotonic() > deadline:
                    raise
                threading.Event().wait(0.02)  # the server is restarting: ask again shortly

    @contextmanager
    def image(self) -> Iterator[Path]:
        """A fresh image of the database, removed when the block ends."""
        with self._lock:
            number = next(self._images)
        path = self.case_dir / f".image-{number}.db"
        try:
            yield self.image_to(path)
        finally:
            path.unlink(missing_ok=True)

    # ------------------------------------------------------------------ its backends
    def backends(self) -> list[int]:
        """The server processes serving this database's clients (the case's workers), not the
        supervisor's own image readers."""
        from hermes.store.pg.image import APPLICATION_NAME

        with self.admin() as conn:
            rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid() "
                                "AND backend_type = 'client backend' AND application_name <> %s ORDER BY pid",
                                (self.name, APPLICATION_NAME)).fetchall()
        return [int(pid) for (pid,) in rows]
