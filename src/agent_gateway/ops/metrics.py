"""The gateway's Prometheus metrics (``prometheus_client``), served by the ops listener at ``/metrics``.

Counters and histograms are module-level, as prometheus_client intends; the
areas that own an event count it here. Every label takes a bounded set of
values (a route template, never a path; a state; a direction): never a User
id, a Token or a Statement. What is read at scrape time (Signals per state,
the Signal Worker's leadership) is a :class:`Sampled` collector of one
gateway (so are the operator's cancels, made by the CLI from any host); the database pool gauges are set by each process at every flush of
its counts (:func:`pool_usage`).

One counter lives elsewhere: ``agent_gateway_loop_restarts_total`` is declared by
``store.supervisor``, which counts the loops it restarts, since the store floor may not
import this module; it is exposed from the same registry as every other.

With ``http.workers > 1`` the HTTP processes share one set of numbers through
prometheus_client's multi-process mode (:func:`use_directory`, called before
the processes fork).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest, values
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

PREFIX = "agent_gateway"
# A *_created sample per series doubles the exposition and no alert or graph here reads it.
disable_created_metrics()
# Requests are milliseconds; Runs are an agent thinking, up to many minutes.
REQUEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
RUN_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
LATENESS_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 60.0, 300.0, 3600.0)

http_requests = Counter(
    f"{PREFIX}_http_requests", "HTTP requests answered.", ("server", "route", "method", "status")
)
http_request_duration = Histogram(
    f"{PREFIX}_http_request_duration_seconds",
    "Time to answer an HTTP request.",
    ("server", "route", "method"),
    buckets=REQUEST_BUCKETS,
)
runs = Counter(f"{PREFIX}_runs", "Runs that ended, by how.", ("state",))
run_duration = Histogram(f"{PREFIX}_run_duration_seconds", "How long Runs executed.", buckets=RUN_BUCKETS)
schedule_fire_lateness = Histogram(
    f"{PREFIX}_schedule_fire_lateness_seconds",
    "How long after its nextFireAt a Schedule fired.",
    buckets=LATENESS_BUCKETS,
)
decisions = Counter(f"{PREFIX}_decisions", "Decisions published.")
messages = Counter(f"{PREFIX}_messages", "Messages recorded.", ("direction",))
message_write_conflicts = Counter(
    f"{PREFIX}_message_write_conflicts", "Message writes that lost the per-User seq race (503, nothing stored)."
)
egress_refused = Counter(
    f"{PREFIX}_sandbox_egress_refused", "Connections the sandbox's egress proxy refused (runtime.allow_hosts)."
)
# Webhooks: an attempt is one request; a delivery's latency runs from its event to its success,
# retries included, so its buckets reach the day a delivery may be retried for.
WEBHOOK_LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0, 60.0, 300.0, 3600.0, 21600.0, 86400.0)
webhook_deliveries = Counter(
    f"{PREFIX}_webhook_deliveries",
    "Webhook delivery attempts, by outcome: delivered, failed (retried later), dead (retries over), "
    "superseded (its claim had lapsed).",
    ("outcome",),
)
webhook_delivery_latency = Histogram(
    f"{PREFIX}_webhook_delivery_latency_seconds",
    "From an event to its webhook delivery's success, retries included.",
    buckets=WEBHOOK_LATENCY_BUCKETS,
)
webhook_attempt_duration = Histogram(
    f"{PREFIX}_webhook_attempt_duration_seconds", "How long one webhook delivery attempt took.", buckets=REQUEST_BUCKETS
)
# Chat channels (channels/): Messages in and out, pairing requests, the channel outbox.
channel_messages = Counter(
    f"{PREFIX}_channel_messages",
    "Messages taken from or sent to a chat channel, by channel, direction and outcome (in: stored, "
    "pairing, ignored; out: delivered, failed, dead, superseded).",
    ("channel", "direction", "outcome"),
)
channel_pairing_requests = Counter(
    f"{PREFIX}_channel_pairing_requests",
    "Messages from identities linked to no User under the pairing policy, by channel and outcome "
    "(issued: a code sent; pending: its code still pending; refused: too many pending).",
    ("channel", "outcome"),
)
channel_outbox_depth = Gauge(
    f"{PREFIX}_channel_outbox_depth",
    "Channel deliveries not yet delivered nor dead, as the channel's sender last saw them.",
    ("channel",),
    multiprocess_mode="livemax",
)
channel_delivery_latency = Histogram(
    f"{PREFIX}_channel_delivery_latency_seconds",
    "From an outbound Message (or a notice) to its delivery on a chat channel, retries included.",
    ("channel",),
    buckets=WEBHOOK_LATENCY_BUCKETS,
)
# Summed over the live processes: with several HTTP processes each has its own pool.
db_pool_in_use = Gauge(
    f"{PREFIX}_db_pool_connections_in_use",
    "Database connections checked out of the pools of every serving process.",
    multiprocess_mode="livesum",
)
db_pool_waiting = Gauge(
    f"{PREFIX}_db_pool_waiting",
    "Tasks of every serving process waiting for a database connection.",
    multiprocess_mode="livesum",
)
_UNLABELLED = (
    decisions,
    egress_refused,
    message_write_conflicts,
    run_duration,
    schedule_fire_lateness,
    webhook_delivery_latency,
    webhook_attempt_duration,
    db_pool_in_use,
    db_pool_waiting,
)


def use_directory(path: str) -> None:
    """Keep values in ``path`` (prometheus_client's multi-process mode), from now on, in this
    process and those it forks; call before any value is counted."""
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    values.ValueClass = values.get_value_class()
    for metric in _UNLABELLED:  # their one value was made at import, in memory
        metric._metric_init()


def multiprocess() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


def pool_usage(in_use: int, waiting: int) -> None:
    """This process's database pool now: connections checked out, tasks waiting for one."""
    db_pool_in_use.set(in_use)
    db_pool_waiting.set(waiting)


def leave() -> None:
    """This process stops serving: its pool no longer counts in the others' sums."""
    if multiprocess():
        mark_process_dead(os.getpid())


class Sampled:
    """A collector of one gateway's gauges, read at scrape time; ``signals`` is refreshed by
    :meth:`refresh` (the database is asynchronous, collection is not) and cached."""

    def __init__(self, leader: Callable[[], bool | None]) -> None:
        self._leader = leader
        self.signals: dict[str, int] = {}
        self.signals_at = float("-inf")
        self.cancelled: dict[str, int] = {}

    def set_signals(self, counts: dict[str, int], cancelled: dict[str, int]) -> None:
        """Signals per state, and the Runs and Signals cancelled by the operator (``run``, ``signal``)."""
        self.signals, self.cancelled, self.signals_at = counts, cancelled, time.monotonic()

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            f"{PREFIX}_signals", "Signals per state (from the database, cached).", labels=["state"]
        )
        for state, count in self.signals.items():
            family.add_metric([state], count)
        yield family
        # Read from the records, not counted as cancels happen: an operator cancels from any
        # host with the CLI, which no gateway process sees; every gateway shows the same count.
        cancelled = GaugeMetricFamily(
            f"{PREFIX}_cancelled",
            "Runs, and Signals cancelled while pending, that the operator cancelled (from the database, cached).",
            labels=["record"],
        )
        for record, count in self.cancelled.items():
            cancelled.add_metric([record], count)
        yield cancelled
        leader = self._leader()
        if leader is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}_worker_leader", "1 on the process holding the Signal Worker.", value=int(leader)
            )


def exposition(sampled: Sampled) -> bytes:
    """Every metric in the text format: this process's (or all HTTP processes') and the gateway's samples."""
    if multiprocess():
        shared = CollectorRegistry()
        MultiProcessCollector(shared)
        counted = generate_latest(shared)
    else:
        from prometheus_client import REGISTRY

        counted = generate_latest(REGISTRY)
    local = CollectorRegistry(auto_describe=False)
    local.register(sampled)
    return counted + generate_latest(local)
# Witnesses (transparency.collector), per log (decisions, ledger) and witness (its key name), as the
# leading process last saw them.
witness_cosigned_size = Gauge(
    f"{PREFIX}_witness_cosigned_size",
    "The largest tree size of a log (the Decision log, the Run ledger) a witness cosigned.",
    ("log", "witness"),
    multiprocess_mode="livemax",
)
witness_failures = Counter(
    f"{PREFIX}_witness_failures",
    "add-checkpoint requests to a witness that failed or were refused (a 409 resync is not one).",
    ("log", "witness"),
)
