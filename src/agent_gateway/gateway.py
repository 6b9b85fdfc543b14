"""Assembles one gateway process: settings, store, both servers and the loops."""

from __future__ import annotations

import asyncio
import logging

from fastapi import FastAPI
from starlette.types import ASGIApp

from agent_gateway.auth import routes as auth_routes
from agent_gateway.auth.schemes import Scheme
from agent_gateway.auth.tokens import PasswordScheme
from agent_gateway.channels.runner import Runner
from agent_gateway.config import Settings
from agent_gateway.decisions import routes as decisions_routes
from agent_gateway.decisions import service as decisions_service
from agent_gateway.http.app import Router, create_app, fast_routes
from agent_gateway.http.fastpath import FastPath
from agent_gateway.ledger import instructions
from agent_gateway.ledger import routes as ledger_routes
from agent_gateway.ledger import service as ledger_service
from agent_gateway.mcp import endpoint as mcp_endpoint
from agent_gateway.messages import routes as messages_routes
from agent_gateway.messages import service as messages_service
from agent_gateway.ops import metrics
from agent_gateway.ops import routes as ops_routes
from agent_gateway.ops.observe import FLUSH_INTERVAL_S, Observed
from agent_gateway.runtimes import runtime as runtimes
from agent_gateway.scheduler import routes as scheduler_routes
from agent_gateway.scheduler.timer import Timer
from agent_gateway.signals import handlers as signal_handlers
from agent_gateway.signals import retention
from agent_gateway.signals import routes as signals_routes
from agent_gateway.signals.worker import Worker
from agent_gateway.signatures import routes as signatures_routes
from agent_gateway.signatures.identity import SigningIdentity
from agent_gateway.store import leadership, migrate
from agent_gateway.store.engine import Store
from agent_gateway.streams import routes as streams_routes
from agent_gateway.streams.hub import Hub
from agent_gateway.transparency import routes as transparency_routes
from agent_gateway.transparency import service as transparency_service
from agent_gateway.users import routes as users_routes
from agent_gateway.web import routes as web_routes
from agent_gateway.transparency.collector import Collector
from agent_gateway.webhooks.deliverer import Deliverer, Policy

logger = logging.getLogger(__name__)

AGENT_DESCRIPTION = (
    "The Agent server: no authentication of any kind. Every route is reachable by the agent "
    "and by any prompt injected into it; keep it on a private address."
)
PUBLIC_DESCRIPTION = "The Public server, called by Users' clients; protected routes take a bearer Token."


ROLES = ("api", "worker", "scheduler")


def webhook_urls(settings: Settings) -> dict[str, tuple[str, ...]]:
    """Each event's subscribed endpoints (their URLs), in the order of the ``[[webhooks]]`` tables."""
    urls: dict[str, tuple[str, ...]] = {}
    for endpoint in settings.webhooks:
        for event in sorted(endpoint.events):
            urls[event] = (*urls.get(event, ()), endpoint.url)
    return urls


def channel_runners(store: Store, settings: Settings) -> list[Runner]:
    """A runner for each chat channel the settings serve (its network module imported only then)."""
    runners = []
    if "matrix" in settings.channels:
        from agent_gateway.channels import matrix

        runners.append(Runner(store, matrix.Matrix(store, settings)))
    if "nostr" in settings.channels:
        from agent_gateway.channels import nostr

        runners.append(Runner(store, nostr.Nostr(store, settings)))
    return runners


class Gateway:
    """What one gateway process runs; ``serving.py`` serves it, tests ``start``/``stop`` it.

    ``roles`` picks what this process does: ``api`` serves both HTTP servers,
    ``worker`` runs the Signal Worker, ``scheduler`` runs the Scheduler.
    """

    def __init__(self, settings: Settings, roles: frozenset[str] = frozenset(ROLES)) -> None:
        unknown = roles - set(ROLES)
        if unknown or not roles:
            raise ValueError(f"roles must be some of {', '.join(ROLES)}")
        self.settings = settings
        self.roles = roles
        # One Handler per Signal kind: the [handlers] tables, then gateway.handlers.register(...).
        self.handlers = signal_handlers.from_settings(settings.handlers)
        setup = None
        if "worker" in roles and settings.signals_setup:
            setup = signal_handlers.import_setup(settings.signals_setup)
        # Loaded once; the gateway refuses to start without a usable signing key.
        self.identity = SigningIdentity.from_settings(settings)
        self.store = Store(settings.database_url, busy_timeout_s=settings.database_busy_timeout_ms / 1000)
        # Every writer of an event records its deliveries for these endpoints (webhooks.outbox).
        self.store.webhook_urls = webhook_urls(settings)
        # Every writer of an outbound Message records its channel deliveries (channels.outbox).
        self.store.channels = settings.channels
        self.publisher = decisions_service.Publisher(self.store, self.identity)
        self.messages = messages_service.Writer(self.store)
        signer = transparency_service.signer(settings, self.identity)
        self.checkpoints = transparency_service.Checkpoints(self.store, signer)
        # Read at start, so that a witness the signing key cannot have stops the gateway in one line.
        self.witnesses = transparency_service.witnesses(settings, self.identity)
        # Every publish and every ledger append wake their witness collector, in whichever process leads it.
        logs = (transparency_service.DECISIONS, ledger_service.LOG)
        self.store.watched = frozenset(log.channel for log in logs) if self.witnesses else frozenset()
        quorum = transparency_service.quorum(settings)
        ledger_signer = transparency_service.ledger_signer(settings, self.identity)
        self.witnessed = transparency_service.Witnessed(self.store, signer, self.witnesses, quorum)
        self.ledger_checkpoints = transparency_service.Checkpoints(self.store, ledger_signer, ledger_service.LOG)
        self.ledger_witnessed = transparency_service.Witnessed(
            self.store, ledger_signer, self.witnesses, quorum, ledger_service.LOG
        )
        self.streams = Hub(self.store, settings)
        # Asked in order by every protected Public route; see auth/schemes.py.
        # An operator adds schemes in Python: gateway.auth_schemes.append(MyScheme()).
        self.password_scheme = PasswordScheme(self.store)
        self.auth_schemes: list[Scheme] = [self._scheme(name) for name in settings.auth_schemes]
        # What executes each Run; replaceable before start() (see runtimes/runtime.py). Only a
        # worker process runs the agent: only it checks (and reports) its confinement.
        self.runtime: runtimes.Runtime = (
            runtimes.from_settings(settings) if "worker" in roles else runtimes.NoRuntime()
        )
        if "worker" in roles:
            # The files the Run ledger publishes, read now: one that cannot be read safely (a link
            # in the Workspace) stops serve with the other settings, before anything is migrated.
            instructions.check(settings)
        self.worker: Worker | None = None
        self.ledger = ledger_service.Ledger(self.store)
        # One witness collector per log across the deployment, each in a worker process that leads it.
        self.collectors: dict[str, Collector] = (
            {
                "witness collector": Collector(self.store, self.checkpoints, self.witnesses),
                "ledger witness collector": Collector(
                    self.store, self.ledger_checkpoints, self.witnesses, ledger_service.LOG
                ),
            }
            if "worker" in roles and self.witnesses
            else {}
        )
        self._collector_tasks: list[asyncio.Task[None]] = []
        self._worker_task: asyncio.Task[None] | None = None
        # What counts the requests of both servers (ops.observe), flushed into the metrics.
        self.observers: list[Observed] = []
        self._flush_task: asyncio.Task[None] | None = None
        agent_routers: list[Router] = [
            users_routes.agent,
            messages_routes.agent,
            streams_routes.agent,
            signatures_routes.agent,
            decisions_routes.agent,
            transparency_routes.agent,
            ledger_routes.agent,
            signals_routes.agent,
        ]
        if settings.scheduler_agent_routes:
            agent_routers.append(scheduler_routes.agent)
        # Every scheduler process runs a timer; their claims on due rows are exclusive.
        self.schedule_timer = (
            Timer(self.store, max_sleep_ms=settings.scheduler_max_sleep_ms) if "scheduler" in roles else None
        )
        # Every worker process delivers webhooks, leading or not: deliveries are claimed row by row.
        self.deliverer = (
            Deliverer(self.store, settings.webhooks, Policy.from_settings(settings))
            if "worker" in roles and settings.webhooks
            else None
        )
        # Each chat channel is read (and its outbox sent) by one worker process at a time, the one
        # leading it; the others stand by (channels.runner).
        self.channels = channel_runners(self.store, settings) if "worker" in roles else []
        # retention.*_max_age: the Scheduler role prunes ended Signals and every outbox's closed
        # deliveries (webhooks', chat channels') once an hour.
        deliveries_age = settings.retention_deliveries_max_age
        outbox_ages = dict.fromkeys(retention.OUTBOXES, deliveries_age) if deliveries_age is not None else {}
        self.pruner = (
            retention.Pruner(self.store, settings.retention_signals_max_age, outbox_ages)
            if "scheduler" in roles and (settings.retention_signals_max_age is not None or outbox_ages)
            else None
        )
        self.agent_app = self._app("agent-gateway: Agent server", AGENT_DESCRIPTION, agent_routers)
        # What each server runs: the fast path (http.fastpath) in front of the FastAPI app, with
        # the fast twins its routers declare, observed for metrics and the access log
        # (ops.observe) when they are on.
        agent_routes = FastPath(self.agent_app, settings.max_body_bytes, fast_routes(agent_routers))
        # /mcp (left out of OpenAPI): its tools call the routes above, in-process (mcp.endpoint).
        self.mcp = mcp_endpoint.Endpoint(agent_routes, settings)
        self.agent_app.router.add_route(mcp_endpoint.PATH, self.mcp, include_in_schema=False)
        self.agent_asgi = self._observed("agent", agent_routes)
        public_routers: list[Router] = [
            auth_routes.public,
            messages_routes.public,
            streams_routes.public,
            signatures_routes.public,
            decisions_routes.public,
            transparency_routes.public,
            ledger_routes.public,
        ]
        self.public_app = self._app("agent-gateway: Public server", PUBLIC_DESCRIPTION, public_routers)
        if settings.public_chat_page:
            self.public_app.include_router(web_routes.public_router())
        self.public_asgi = self._observed(
            "public", FastPath(self.public_app, settings.max_body_bytes, fast_routes(public_routers))
        )
        # The ops listener (ops.listen): health, readiness, metrics, read at scrape time from here.
        self.sampled = metrics.Sampled(self._leads)
        self.ops_app = ops_routes.create(self) if settings.ops_listen is not None else None
        if setup is not None:
            setup(self)  # the operator's Python ([signals] setup): registers Handlers, may replace the runtime

    def _scheme(self, name: str) -> Scheme:
        """The authentication scheme ``name`` of ``[auth] schemes`` (config.AUTH_SCHEMES)."""
        if name == "password":
            return self.password_scheme
        # Imported here: coincurve is an optional extra (nostr), there when the settings name the scheme.
        from agent_gateway.auth.nip98 import NostrScheme

        return NostrScheme(self.store, public_base_url=self.settings.public_base_url)

    def _observed(self, server: str, fast: FastPath) -> ASGIApp:
        """A server's app (behind its fast path) counted for /metrics (with an ops listener) and
        access-logged (``log.access``); neither costs anything when off."""
        count = self.settings.ops_listen is not None
        if not count and not self.settings.access_log:
            return fast
        observed = Observed(fast, server, fast_routes=fast.routes, count=count, access_log=self.settings.access_log)
        if count:
            self.observers.append(observed)
        return observed

    def flush_metrics(self) -> None:
        """Move the requests counted so far into the metrics (ops.observe keeps them apart until
        then), and the database pool's usage now."""
        for observer in self.observers:
            observer.flush()
        metrics.pool_usage(*self.store.pool_usage())

    async def _flush_metrics_forever(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_INTERVAL_S)
            self.flush_metrics()

    def _leads(self) -> bool | None:
        """Whether this process holds the Signal Worker; None when it has no worker role."""
        return None if "worker" not in self.roles else bool(self.worker and self.worker.active)

    def channels_status(self) -> dict[str, str]:
        """Each chat channel this process stands for: ``ok``, standing by, or why it cannot reach its server."""
        return {runner.network.name: runner.status() for runner in self.channels}

    def loops_alive(self) -> dict[str, bool]:
        """Whether each loop of this process's roles runs: ``worker`` (leading or standing by),
        ``scheduler`` and ``webhooks`` (the deliverer)."""
        alive = {}
        if "worker" in self.roles:
            alive["worker"] = self._worker_task is not None and not self._worker_task.done()
        if self.schedule_timer is not None:
            alive["scheduler"] = self.schedule_timer.running
        if self.deliverer is not None:
            alive["webhooks"] = self.deliverer.running
        return alive

    def _app(self, title: str, description: str, routers: list[Router]) -> FastAPI:
        app = create_app(title, description, routers, self.settings.max_body_bytes)
        app.state.gateway = self
        app.state.store = self.store
        app.state.settings = self.settings
        app.state.identity = self.identity
        app.state.publisher = self.publisher
        app.state.messages = self.messages
        app.state.checkpoints = self.checkpoints
        app.state.ledger_checkpoints = self.ledger_checkpoints
        app.state.witnessed = self.witnessed
        app.state.ledger_witnessed = self.ledger_witnessed
        app.state.streams = self.streams
        app.state.auth_schemes = self.auth_schemes
        return app

    async def start(self, *, migrate_first: bool = True) -> None:
        if migrate_first:
            await migrate.upgrade(self.store.engine)
        # Every role listens: the loops for their wake-ups, the api for its Message streams.
        self.store.listen()
        if "api" in self.roles:
            self.streams.start()
        if self.observers:
            self._flush_task = asyncio.create_task(self._flush_metrics_forever(), name="metrics flush")
        if self.schedule_timer is not None:
            self.schedule_timer.start()
        if self.pruner is not None:
            self.pruner.start()
        if self.deliverer is not None:
            self.deliverer.start()
        for runner in self.channels:
            runner.start()
        if "worker" in self.roles:
            # One Signal Worker across the deployment: it works while this process leads.
            # The instructions this process gives the agent, on the ledger before its first Run.
            await self.ledger.record_instructions(instructions.collect(self.settings, self.handlers, self.runtime))
            self.worker = Worker(self.store, self.handlers, self.runtime, self.ledger)
            self._worker_task = asyncio.create_task(
                leadership.lead(self.store, "signal worker", self.worker.run, on_lost=self.worker.abandon),
                name="signal worker",
            )
        self._collector_tasks = [
            asyncio.create_task(leadership.lead(self.store, name, collector.run), name=name)
            for name, collector in self.collectors.items()
        ]

    async def stop_worker(self) -> None:
        """Stop this process's Signal Worker: the Run in progress ends first; a standby (or a new
        leader still waiting to start) stops at once."""
        if self.worker is not None and self._worker_task is not None:
            self.worker.stop()
            if not self.worker.active:
                self._worker_task.cancel()
            await asyncio.gather(self._worker_task, return_exceptions=True)

    async def stop(self) -> None:
        for collector, task in zip(self.collectors.values(), self._collector_tasks):
            collector.stop()
            if not collector.active:
                task.cancel()  # a standby waiting for leadership
        await asyncio.gather(*self._collector_tasks, return_exceptions=True)
        await self.streams.close()
        await self.mcp.stop()
        if self._flush_task is not None:
            self._flush_task.cancel()
            await asyncio.gather(self._flush_task, return_exceptions=True)
        self.flush_metrics()
        metrics.leave()
        if self.schedule_timer is not None:
            await self.schedule_timer.stop()
        if self.pruner is not None:
            await self.pruner.stop()
        if self.deliverer is not None:
            await self.deliverer.stop()
        for runner in self.channels:
            await runner.stop()
        await self.stop_worker()
        await self.store.close()
