"""Fixtures shared by every test: both storage backends, a gateway, HTTP clients, a served gateway.

Every storage-touching test runs on SQLite and on PostgreSQL. PostgreSQL is
``AGENT_GATEWAY_TEST_POSTGRES`` (default ``postgresql://postgres@127.0.0.1:5432/test``);
each test gets a database in the state of a template migrated once per run (a copy of
it, or an earlier test's copy reset to that state: ``Databases``).
Without a server, PostgreSQL cases are skipped with a reason, unless
``AGENT_GATEWAY_TEST_REQUIRE_POSTGRES=1`` (set by CI), which makes them fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import queue
import shutil
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest
import sqlalchemy as sa
from alembic import command
from sqlalchemy.ext.asyncio import AsyncEngine
from xdist.scheduler import LoadScopeScheduling

from agent_gateway import config
from agent_gateway.gateway import Gateway
from agent_gateway.signatures import keys
from agent_gateway.store import engine, migrate
from agent_gateway.store.engine import Store

from tests import served

POSTGRES_URL = os.environ.get("AGENT_GATEWAY_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
REQUIRE_POSTGRES = os.environ.get("AGENT_GATEWAY_TEST_REQUIRE_POSTGRES") == "1"
RUN_ID = uuid.uuid4().hex[:10]


# The modules whose tests share a server started once per module or session (a homeserver, a relay,
# witnesses, a served gateway, a built program): each runs in one pytest-xdist worker, so that
# its fixture starts once rather than once in every worker that takes one of its tests.
ONE_WORKER_MODULES = frozenset({
    "tests/agent/test_client.py",
    "tests/auth/test_cli.py",
    "tests/channels/test_matrix.py",
    "tests/channels/test_nostr.py",
    "tests/cli/test_two_gateways.py",
    "tests/docs/test_site.py",
    "tests/http/test_connections.py",
    "tests/mcp/test_tools.py",
    "tests/signatures/test_cli.py",
    "tests/streams/test_streams.py",
    "tests/transparency/test_collector.py",
    "tests/transparency/test_go.py",
})


class OneWorkerPerSharedServer(LoadScopeScheduling):
    """``--dist loadgroup``: each test alone, except those of :data:`ONE_WORKER_MODULES`, by module.

    pytest-xdist's own ``xdist_group`` marker cannot do this under pytest 9: xdist 3.8 renames a
    grouped test's node id through an attribute pytest 9 no longer reads, so the groups were
    silently ignored and every worker started its own homeserver. The scheduler sees only node
    ids, hence a list of modules.
    """

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        return module if module in ONE_WORKER_MODULES else nodeid


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> LoadScopeScheduling | None:
    if config.getvalue("dist") == "loadgroup":
        return OneWorkerPerSharedServer(config, log)  # type: ignore[arg-type]
    return None


# What tests make under the real /etc (tests/sandbox/test_host_files.py). Removed only when the whole
# run ends: another worker's sandbox may be starting at any moment with them listed to cover over,
# and bubblewrap fails to start it when one vanished since (it cannot make the mount point).
ETC_MADE_BY_TESTS = "agent-gateway-test-"


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):
        return  # a pytest-xdist worker: the controller's session ends after every worker's
    for path in Path("/etc").glob(f"{ETC_MADE_BY_TESTS}*"):
        with contextlib.suppress(OSError):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """An ``e2e`` test starts real gateways: it is a ``processes`` test too (``scripts/test --fast``)."""
    for item in items:
        if item.get_closest_marker("e2e") is not None:
            item.add_marker(pytest.mark.processes)


def postgres_url_of(database: str) -> str:
    """The URL of the database ``database`` on the tests' PostgreSQL server."""
    base, _, _ = POSTGRES_URL.rpartition("/")
    return f"{base}/{database}"


async def terminate_lock_sessions(database_url: str) -> None:
    """Kill the sessions holding advisory locks in this test's database only, as a lost host would."""
    admin_connection = await asyncpg.connect(engine.libpq_dsn(database_url))
    try:
        await admin_connection.execute(
            "SELECT pg_terminate_backend(l.pid) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
            "WHERE l.locktype = 'advisory' AND l.granted AND d.datname = current_database()"
        )
    finally:
        await admin_connection.close()


@contextlib.asynccontextmanager
async def engine_at(url: str, revision: str = "head") -> AsyncIterator[AsyncEngine]:
    """An engine on the empty database ``url`` (its SQLite file created), migrated up to
    ``revision``; disposed after."""
    if url.startswith("sqlite"):
        migrate.create_sqlite_file(url)
    created = engine.create_engine(url)
    try:
        await migrate.upgrade(created, revision)
        yield created
    finally:
        await created.dispose()


def downgrade(connection: sa.Connection, revision: str) -> None:
    """Migrate the database of ``connection`` down to ``revision`` (``conn.run_sync(downgrade, ...)``)."""
    config = migrate.alembic_config()
    config.attributes["connection"] = connection
    command.downgrade(config, revision)


async def admin(sql: str) -> None:
    conn = await asyncpg.connect(POSTGRES_URL, timeout=60)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


# Everything of a database's own state but its rows, as one digest (Databases._schema_of).
SCHEMA_DIGEST = """
WITH own AS (
    SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
)
SELECT md5(string_agg(part, E'\n' ORDER BY part)) FROM (
    SELECT format('rel %s %s %s %s %s %s %s', c.relnamespace::regnamespace, c.relname, c.relkind, c.relpersistence,
                  c.reloptions, CASE WHEN c.relkind = 'r' THEN c.relpages END, CASE WHEN c.relkind = 'r' THEN c.reltuples END)
        FROM pg_class c WHERE c.oid IN (SELECT oid FROM own)
    UNION ALL SELECT format('col %s %s %s %s %s', a.attrelid::regclass, a.attname, a.atttypid::regtype, a.attnotnull, a.attisdropped)
        FROM pg_attribute a WHERE a.attrelid IN (SELECT oid FROM own) AND a.attnum > 0
    UNION ALL SELECT format('default %s %s', d.adrelid::regclass, pg_get_expr(d.adbin, d.adrelid))
        FROM pg_attrdef d WHERE d.adrelid IN (SELECT oid FROM own)
    UNION ALL SELECT format('constraint %s %s %s', c.conrelid::regclass, c.conname, pg_get_constraintdef(c.oid))
        FROM pg_constraint c WHERE c.connamespace::regnamespace::text NOT IN ('pg_catalog', 'information_schema')
    UNION ALL SELECT format('index %s', pg_get_indexdef(i.indexrelid)) FROM pg_index i WHERE i.indrelid IN (SELECT oid FROM own)
    UNION ALL SELECT format('sequence %s %s %s %s %s', s.seqrelid::regclass, s.seqstart, s.seqincrement, s.seqmin, s.seqmax)
        FROM pg_sequence s
    UNION ALL SELECT format('routine %s %s', p.oid::regprocedure, md5(p.prosrc))
        FROM pg_proc p WHERE p.pronamespace::regnamespace::text NOT IN ('pg_catalog', 'information_schema')
    UNION ALL SELECT format('trigger %s %s', t.tgrelid::regclass, t.tgname) FROM pg_trigger t WHERE NOT t.tgisinternal
    UNION ALL SELECT format('type %s', t.oid::regtype) FROM pg_type t
        WHERE t.typnamespace::regnamespace::text NOT IN ('pg_catalog', 'information_schema', 'pg_toast') AND t.typrelid = 0
    UNION ALL SELECT format('extension %s %s', e.extname, e.extversion) FROM pg_extension e
    UNION ALL SELECT format('statistics %s', count(*)) FROM pg_statistic s WHERE s.starelid IN (SELECT oid FROM own)
    UNION ALL SELECT format('migration %s', v.version_num) FROM alembic_version v
    UNION ALL SELECT format('database %s %s', d.datallowconn, d.datconnlimit) FROM pg_database d WHERE d.datname = current_database()
    UNION ALL SELECT format('settings %s', s.setconfig) FROM pg_db_role_setting s
        JOIN pg_database d ON d.oid = s.setdatabase WHERE d.datname = current_database()
) parts(part)
"""


class Databases:
    """The run's PostgreSQL databases: a template migrated once, and a copy of it (or an empty
    database) for each test that asks.

    Copies are made ahead (``CREATE DATABASE ... TEMPLATE`` in a thread of their own, ``AHEAD`` at
    a time), so a test takes one that is ready instead of waiting for PostgreSQL to write it.
    A copy a test is done with is reset to the template's state and taken by a later test, in a
    thread of its own (:meth:`_reset`): its sessions ended, its tables emptied, its sequences and
    statistics reset, as long as its schema is still the template's (a test that migrated it,
    altered a table, analysed one or closed the database gets it dropped). Each copy wrote some
    300 files (most of them the new database's own catalogs) that the next checkpoint had to
    ``fsync``, and each drop waited for that checkpoint: a checkpoint in the middle of a run took
    50 to 120 s, and each worker's last drops held the end of the run for about 20 s.
    Dropping one is left to another thread: PostgreSQL 15 checkpoints at every ``DROP DATABASE``,
    which takes seconds on a busy machine, and no test needs to wait for that. Drops are made
    ``DROP_BATCH`` at a time, ``DROPS_AT_ONCE`` of them together: a checkpoint writes every dirty
    page of every database, and one per test kept PostgreSQL's checkpointer busy for most of a run
    (876 checkpoints, 861 s of them in an 18-minute run, 640 s of it in fsync); the checkpoints
    that follow the first of a batch find almost nothing to write, and drops waiting together
    share one. :meth:`close` waits for the last drops.
    """

    AHEAD = 2
    # Databases dropped in one go: only the first checkpoint has pages to write.
    DROP_BATCH = 32
    # Connections a worker drops with at once; a drop refused a connection (the other workers
    # dropping at the same moment, beside the tests' own) tries again, a few times.
    DROPS_AT_ONCE = 16
    DROP_ATTEMPTS = 20

    # Most a reset waits for the sessions of the test before to end.
    SESSIONS_END_S = 60

    def __init__(self, template: str) -> None:
        self.template = template
        self._schema = asyncio.run(self._schema_of(template))
        self._recycled: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._used: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._resetter = threading.Thread(target=self._reset_each, name="reset test databases", daemon=True)
        self._resetter.start()
        self._doomed: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._failed: list[tuple[str, BaseException]] = []
        self._dropper = threading.Thread(target=self._drop_each, name="drop test databases", daemon=True)
        self._dropper.start()
        self._ready: queue.SimpleQueue[str | BaseException] = queue.SimpleQueue()
        self._room = threading.Semaphore(self.AHEAD)
        self._closing = threading.Event()
        self._copier = threading.Thread(target=self._copy_ahead, name="copy test databases", daemon=True)
        self._copier.start()

    def copy(self) -> str:
        """A database in the migrated template's state (a copy, or one reset); its name."""
        with contextlib.suppress(queue.Empty):
            return self._recycled.get_nowait()
        made = self._ready.get()
        self._room.release()
        if isinstance(made, BaseException):
            # Made ahead while the server was away (a test restarts it): once more, now.
            return self._create(f"TEMPLATE {self.template}")
        return made

    def empty(self) -> str:
        """A new database no migration has touched; its name."""
        return self._create("")

    @contextlib.contextmanager
    def url(self, *, migrated: bool) -> Iterator[str]:
        """The URL of a database in the template's state (reset after use) or of an empty one
        (dropped after use)."""
        name = self.copy() if migrated else self.empty()
        try:
            yield postgres_url_of(name)
        finally:
            if migrated:
                self._used.put(name)
            else:
                self.drop(name)

    def drop(self, name: str) -> None:
        """Drop ``name`` (under whoever is still connected to it) soon, not now."""
        self._doomed.put(name)

    def close(self) -> None:
        """Drop the copies no test took, wait for every drop asked so far; fail the run if one
        could not be done."""
        self._closing.set()
        self._room.release()
        self._copier.join()
        self._used.put(None)
        self._resetter.join()
        while not self._ready.empty():
            made = self._ready.get()
            if isinstance(made, str):
                self.drop(made)
        while not self._recycled.empty():
            self.drop(self._recycled.get())
        self._doomed.put(None)
        self._dropper.join()
        if self._failed:
            name, exc = self._failed[0]
            raise RuntimeError(f"could not drop {len(self._failed)} test database(s), {name} first: {exc}")

    def _create(self, clause: str) -> str:
        name = f"agw_{RUN_ID}_{uuid.uuid4().hex[:10]}"
        asyncio.run(admin(f"CREATE DATABASE {name} {clause}"))
        return name

    def _copy_ahead(self) -> None:
        while True:
            self._room.acquire()
            if self._closing.is_set():
                return
            try:
                self._ready.put(self._create(f"TEMPLATE {self.template}"))
            except (OSError, asyncpg.PostgresError, asyncio.TimeoutError) as exc:
                self._ready.put(exc)

    def _reset_each(self) -> None:
        while (name := self._used.get()) is not None:
            if asyncio.run(self.reset(name)) and not self._closing.is_set():
                self._recycled.put(name)
            else:
                self.drop(name)

    async def reset(self, name: str) -> bool:
        """Put ``name`` back in the template's state; False where it cannot be (drop it then)."""
        try:
            return await self._reset(name)
        except (OSError, asyncpg.PostgresError, TimeoutError):  # closed to connections, say
            return False

    async def _reset(self, name: str) -> bool:
        conn = await asyncpg.connect(postgres_url_of(name), timeout=60)
        try:
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            async with asyncio.timeout(self.SESSIONS_END_S):
                while await conn.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
                ):
                    await asyncio.sleep(0.02)
            # A table never written to has no pages; one written to and emptied again still has.
            written = await conn.fetch(
                "SELECT format('%I', c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = 'public' AND c.relkind = 'r' AND c.relname <> 'alembic_version' "
                "AND pg_relation_size(c.oid) > 0"
            )
            if written:
                await conn.execute(f"TRUNCATE {', '.join(row[0] for row in written)} CASCADE")
            await conn.execute("SELECT setval(seqrelid, seqstart, false) FROM pg_sequence")
            await conn.execute("SELECT pg_stat_reset()")
            # After the TRUNCATE, which gives each table the template's page and row counts.
            return await self._schema_of(name, conn) == self._schema
        finally:
            await conn.close()

    @staticmethod
    async def _schema_of(name: str, conn: asyncpg.Connection | None = None) -> str:
        """A digest of what a test could change in database ``name`` besides its rows: its
        relations and their options, columns, defaults, constraints, indexes, sequences, routines,
        triggers, types, the planner's sizes and statistics, its migration and whether it takes
        connections."""
        own = conn is None
        conn = conn or await asyncpg.connect(postgres_url_of(name), timeout=60)
        try:
            return await conn.fetchval(SCHEMA_DIGEST)
        finally:
            if own:
                await conn.close()

    def _drop_each(self) -> None:
        doomed: list[str] = []
        while (name := self._doomed.get()) is not None:
            doomed.append(name)
            if len(doomed) == self.DROP_BATCH:
                self._drop_all(doomed)
                doomed = []
        self._drop_all(doomed)

    def _drop_all(self, names: list[str]) -> None:
        asyncio.run(self._drop_together(names))

    async def _drop_together(self, names: list[str]) -> None:
        # At once: each DROP DATABASE waits for a checkpoint, and the requests that arrive while
        # one runs are served by the next, so a batch costs a checkpoint or two instead of one
        # each. 32 drops took 19 s one after the other, 2.2 s eight at a time and 0.4 s all at
        # once (on a quiet server); one after the other, the run's last batch held each worker's
        # end for 30 to 40 s on a busy machine.
        room = asyncio.Semaphore(self.DROPS_AT_ONCE)

        async def drop(name: str) -> None:
            async with room:
                for attempt in itertools.count(1):
                    try:
                        await admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
                        return
                    except asyncpg.TooManyConnectionsError:  # the other workers' drops at the same time
                        if attempt == self.DROP_ATTEMPTS:
                            raise
                        await asyncio.sleep(0.1 * attempt)

        outcomes = await asyncio.gather(*(drop(name) for name in names), return_exceptions=True)
        self._failed.extend((name, outcome) for name, outcome in zip(names, outcomes, strict=True) if outcome is not None)


@pytest.fixture(scope="session")
def postgres_databases() -> Iterator[Databases]:
    """The run's PostgreSQL databases (:class:`Databases`); skipped (or failed, in CI) without a server."""
    name = f"agw_template_{RUN_ID}"
    try:
        asyncio.run(admin(f"CREATE DATABASE {name}"))
    except (OSError, asyncpg.PostgresError, asyncio.TimeoutError) as exc:
        reason = f"PostgreSQL at {POSTGRES_URL} is unreachable: {exc}"
        if REQUIRE_POSTGRES:
            pytest.fail(reason)
        pytest.skip(reason)
    asyncio.run(migrate.upgrade_url(postgres_url_of(name)))
    databases = Databases(name)
    yield databases
    databases.close()
    asyncio.run(admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "gateway.db"
    asyncio.run(migrate.upgrade_url(f"sqlite:///{path}"))
    return path


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, migrated database of each backend."""
    if request.param == "sqlite":
        path = tmp_path / "gateway.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        yield f"sqlite:///{path}"
        return
    with request.getfixturevalue("postgres_databases").url(migrated=True) as url:
        yield url


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def module_database_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A fresh, migrated database of each backend that a module's tests share: the database of a
    served gateway started once per module (``served.ServedGateway.start`` in a module-scoped
    fixture), for tests that neither change its configuration nor need its tables empty."""
    if request.param == "sqlite":
        path = tmp_path_factory.mktemp("module-database") / "gateway.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        yield f"sqlite:///{path}"
        return
    with request.getfixturevalue("postgres_databases").url(migrated=True) as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database of each backend that no migration has touched."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh.db'}"
        return
    with request.getfixturevalue("postgres_databases").url(migrated=False) as url:
        yield url


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    store = Store(database_url)
    yield store
    await store.close()


@pytest.fixture(scope="session")
def signing_key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "signing-key.pem"
    keys.write_private(path, keys.generate_pem("ed25519"))
    return path


@pytest.fixture
def settings(database_url: str, signing_key_file: Path, tmp_path: Path) -> config.Settings:
    """Settings for an in-process gateway: a cheap scrypt cost keeps tests fast.

    The tests' agent programs record what they saw in ``tmp_path/agent-files``
    (``tests/agent_program.py``): confined, they may write there too.
    """
    agent_files = tmp_path / "agent-files"
    agent_files.mkdir(exist_ok=True)
    return config.Settings(
        token_ttl_ms=3_600_000,
        database_url=database_url,
        signing_key_file=signing_key_file,
        scrypt=config.ScryptCost(log_n=4, block_size=8, parallelism=1),
        runtime_workdir=tmp_path / "workspace",
        runtime_sandbox_rw=(agent_files,),
    )


@pytest.fixture
async def gateway(settings: config.Settings) -> AsyncIterator[Gateway]:
    gateway = Gateway(settings)
    await gateway.start()
    yield gateway
    await gateway.stop()


@pytest.fixture
async def agent(gateway: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the Agent server, in process."""
    transport = httpx.ASGITransport(app=gateway.agent_asgi)
    async with httpx.AsyncClient(transport=transport, base_url="http://agent") as client:
        yield client


@pytest.fixture
async def public(gateway: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the Public server, in process."""
    transport = httpx.ASGITransport(app=gateway.public_asgi)
    async with httpx.AsyncClient(transport=transport, base_url="http://public") as client:
        yield client


@pytest.fixture
def served_gateway(tmp_path: Path, database_url: str) -> Iterator[served.ServedGateway]:
    """A real ``agent-gateway serve`` subprocess (made by ``agent-gateway init``) on free ports."""
    with served.ServedGateway.start(tmp_path / "deployment", database_url) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def shared_gateway(tmp_path_factory: pytest.TempPathFactory, module_database_url: str) -> Iterator[served.ServedGateway]:
    """A served gateway like ``served_gateway``, started once per module and backend and shared by
    the module's tests: for tests that change nothing of its configuration and need no table empty
    (each works on Users, Schedules and Messages of its own)."""
    with served.ServedGateway.start(tmp_path_factory.mktemp("deployment"), module_database_url) as gateway:
        yield gateway
