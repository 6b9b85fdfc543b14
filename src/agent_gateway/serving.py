"""``agent-gateway serve``: one gateway process, or a small family of them.

The main process binds both listening sockets, takes the SQLite lock, applies
migrations, then forks ``http.workers - 1`` HTTP-only children that accept on
the same sockets (the kernel spreads connections). The main process runs every
role it was given; children run ``api`` only and die with it. SIGINT or
SIGTERM stops everything cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import gc
import logging
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import uvicorn
from starlette.types import ASGIApp

from agent_gateway import config, errors
from agent_gateway.config import Address, Settings
from agent_gateway.gateway import Gateway
from agent_gateway.http import connections
from agent_gateway.ops import logs, metrics
from agent_gateway.sandbox import proxy
from agent_gateway.store import migrate
from agent_gateway.store.engine import Store

logger = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
# The ops listener answers an operator's probes and one Prometheus: a few connections.
OPS_MAX_CONNECTIONS = 64


def run(settings: Settings, roles: frozenset[str], *, force: bool = False) -> None:
    """Serve ``roles`` until SIGINT or SIGTERM (blocking), creating or upgrading the schema
    first (``force``: even in a database that has other tables and no gateway schema)."""
    migrate.create_sqlite_file(settings.database_url)
    store = Store(settings.database_url)
    with sqlite_lock(store):
        found = asyncio.run(_schema(store))
        found.require_migratable(force)
        # An address that is taken is the one line a second gateway on this host gets.
        sockets = _bind(settings) if "api" in roles else {}
        ops_socket = listen(settings.ops_listen, "ops_listen") if settings.ops_listen is not None else None
        # Built once this process may serve this database on these addresses: a setting it
        # cannot use (the signing key, a Handler template, a sandbox that cannot start) stops
        # serve before anything is migrated or forked.
        gateway = Gateway(settings, roles)
        if not found.is_current:
            _migrate_in_child(settings.database_url)
        caps = _connection_budget(settings) if sockets else None
        forks = settings.http_workers - 1 if caps else 0
        with _shared_metrics(forks > 0 and ops_socket is not None):
            children = [_fork_http_worker(settings, sockets, caps) for _ in range(forks)]
            try:
                _run_loop(_serve(gateway, sockets, caps, ops_socket=ops_socket))
            finally:
                for pid in children:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGTERM)
                for pid in children:
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, 0)


@contextlib.contextmanager
def _shared_metrics(shared: bool) -> Iterator[None]:
    """With several HTTP processes, their metrics add up in a folder they all write
    (prometheus_client's multi-process mode), removed when serve ends."""
    if not shared:
        yield
        return
    with tempfile.TemporaryDirectory(prefix="agent-gateway-metrics-") as directory:
        metrics.use_directory(directory)
        yield


async def _schema(store: Store) -> migrate.Schema:
    try:
        return await migrate.schema(store.engine)
    finally:
        await store.close()


def _migrate_in_child(url: str) -> None:
    """Migrate in a short-lived child, so that this long-running process never holds Alembic."""
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            asyncio.run(migrate.upgrade_url(url))
            status = 0
        except Exception as exc:
            print(f"agent-gateway: migrating the database failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        finally:
            logs.flush()
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise errors.GatewayError("the database could not be migrated; nothing was started")


def _connection_budget(settings: Settings) -> connections.Budget:
    """Raise the descriptor limit and cap each server within it (forked HTTP processes inherit both)."""
    descriptors = connections.raise_descriptor_limit()
    # The confined agent's connections through the sandbox's relay and egress proxy are
    # the gateway's descriptors too, outside both servers.
    reserved = connections.RESERVED_DESCRIPTORS + proxy.DESCRIPTORS
    budget = connections.budget(descriptors, settings.public_max_connections, settings.agent_max_connections, reserved)
    logger.info(budget.describe(settings.public_max_connections, settings.agent_max_connections))
    return budget


def _bind(settings: Settings) -> dict[str, socket.socket]:
    return {
        "public": listen(settings.public_listen, "public_listen"),
        "agent": listen(settings.agent_listen, "agent_listen"),
    }


def listen(address: Address, field: str) -> socket.socket:
    """A socket bound to ``address``; one that cannot be bound names the setting ``field`` that moves it."""
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    try:
        sock = socket.create_server((address.host, address.port), family=family, backlog=2048)
    except OSError as exc:
        raise errors.GatewayError(
            # create_server's strerror repeats the address: the errno's text alone.
            f"cannot listen on {address}: {os.strerror(exc.errno) if exc.errno else exc}; "
            f"set {config.named(field)} to a free address"
        ) from None
    sock.set_inheritable(True)
    # Accepted connections inherit this. asyncio sets it only on sockets whose proto is
    # IPPROTO_TCP, which create_server's are not: without it, Nagle and delayed ACKs add
    # ~40 ms to every response written in two parts (headers, then body).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _fork_http_worker(settings: Settings, sockets: dict[str, socket.socket], caps: connections.Budget) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 0
    try:
        # Die with the main process, however it ends.
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        _run_loop(_serve(Gateway(settings, frozenset({"api"})), sockets, caps, main=False))
    except BaseException:
        logger.exception("HTTP worker %d failed", os.getpid())
        code = 1
    finally:
        logs.flush()
        os._exit(code)


def _run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run a serving process's event loop: uvloop's where it is installed (about twice the
    requests per second of asyncio's own loop for uvicorn), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)


async def _serve(
    gateway: Gateway,
    sockets: dict[str, socket.socket],
    caps: connections.Budget | None,
    *,
    main: bool = True,
    ops_socket: socket.socket | None = None,
) -> None:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    await gateway.start(migrate_first=False)  # run() migrated before forking
    # Everything built so far lives as long as the process. Out of the collector's sight,
    # it no longer makes each full collection a pause of ~80 ms (a p99 of every route).
    gc.collect()
    gc.freeze()
    settings = gateway.settings
    listeners: list[tuple[str, _Server, socket.socket]] = []
    if caps is not None:
        listeners.append(("public server", _Server(gateway.public_asgi, settings, caps.public), sockets["public"]))
        # The Agent server has no authentication: it answers only to its own names (DNS rebinding).
        hosts = connections.Hosts.of(settings.agent_listen.host, settings.agent_allowed_hosts, "agent.allowed_hosts")
        listeners.append(("agent server", _Server(gateway.agent_asgi, settings, caps.agent, hosts), sockets["agent"]))
    if ops_socket is not None and gateway.ops_app is not None and settings.ops_listen is not None:
        # Nor has the ops listener: its metrics are not for a web page that rebinds its name either.
        hosts = connections.Hosts.of(settings.ops_listen.host, settings.ops_allowed_hosts, "ops.allowed_hosts")
        listeners.append(("ops listener", _Server(gateway.ops_app, settings, OPS_MAX_CONNECTIONS, hosts), ops_socket))
    try:
        if caps is None:
            logger.info("serving no HTTP (roles: %s)", ", ".join(sorted(gateway.roles)))
        if listeners:
            await _serve_http(gateway, listeners, stopping, announce=main)
        else:
            await stopping.wait()
    finally:
        logger.info("shutting down")
        await gateway.stop()


async def _serve_http(
    gateway: Gateway,
    listeners: list[tuple[str, _Server, socket.socket]],
    stopping: asyncio.Event,
    *,
    announce: bool,
) -> None:
    settings = gateway.settings
    servers = [server for _, server, _ in listeners]
    tasks = [asyncio.create_task(server.serve(sockets=[sock]), name=name) for name, server, sock in listeners]
    try:
        while not all(server.started for server in servers):
            if any(task.done() for task in tasks):
                raise errors.GatewayError("an HTTP server stopped during start-up")
            await asyncio.sleep(0.01)
        if announce:
            _announce(settings, {name for name, _, _ in listeners})
        stop_wait = asyncio.create_task(stopping.wait())
        await asyncio.wait([stop_wait, *tasks], return_when=asyncio.FIRST_COMPLETED)
        stop_wait.cancel()
    finally:
        for server in servers:
            server.should_exit = True
        # uvicorn waits for every open response: Message streams end now, not never.
        await gateway.streams.close()
        await asyncio.gather(*tasks, return_exceptions=True)


def _announce(settings: Settings, serving: set[str]) -> None:
    if "public server" in serving:
        logger.info("Public server listening on http://%s", settings.public_listen)
        logger.info("Agent server listening on http://%s", settings.agent_listen)
        if settings.http_workers > 1:
            logger.info("%d HTTP processes share both addresses", settings.http_workers)
        if not settings.agent_listen.is_loopback:
            logger.warning(
                "Agent server binds %s, which is not loopback: it has no authentication, "
                "so anyone who can reach that address acts as the agent",
                settings.agent_listen,
            )
    if "ops listener" in serving and settings.ops_listen is not None:
        logger.info("ops listener (/healthz, /readyz, /metrics) on http://%s", settings.ops_listen)
        if not settings.ops_listen.is_loopback:
            logger.warning(
                "ops listener binds %s, which is not loopback: it has no authentication, so anyone "
                "who can reach that address reads the gateway's metrics and health",
                settings.ops_listen,
            )


class _Server(uvicorn.Server):
    """A uvicorn server on a socket bound beforehand, leaving signals to ``_serve``, with the
    connection limits of ``http.connections`` (the protocol, and a sweep once a second)."""

    def __init__(
        self, app: ASGIApp, settings: Settings, max_connections: int, hosts: connections.Hosts | None = None
    ) -> None:
        limits = connections.Limits(
            max_connections=max_connections,
            header_timeout_s=settings.header_timeout_ms / 1000,
            max_header_bytes=settings.max_header_bytes,
            body_timeout_s=settings.body_timeout_ms / 1000,
            hosts=hosts,
        )
        super().__init__(
            uvicorn.Config(
                connections.guard(app),
                http=connections.Protocol.factory(limits),
                ws="none",  # no route is a WebSocket; an Upgrade is served as plain HTTP
                timeout_keep_alive=settings.idle_timeout_ms / 1000,  # type: ignore[arg-type]
                lifespan="off",
                access_log=False,
                log_config=None,
                server_header=False,
                proxy_headers=False,  # nothing here reads the client's address
            )
        )

    def capture_signals(self):  # type: ignore[no-untyped-def, override]
        return contextlib.nullcontext()

    async def on_tick(self, counter: int) -> bool:
        if counter % 10 == 0:  # ticks are 0.1 s apart
            connections.sweep(self.server_state.connections, asyncio.get_running_loop().time())
        return await super().on_tick(counter)


@contextlib.contextmanager
def sqlite_lock(store: Store) -> Iterator[None]:
    """Refuse a second ``serve`` on one SQLite file: a SQLite deployment is one process family."""
    database = store.engine.url.database
    if store.dialect != "sqlite" or not database or database == ":memory:":
        yield
        return
    path = Path(database).with_name(Path(database).name + ".serve-lock")
    with open(path, "a+b") as file:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise errors.GatewayError(
                f"another agent-gateway serve is already running on {database}; a SQLite "
                "deployment is one process (run several processes on PostgreSQL)"
            ) from None
        yield
