"""Prometheus exposition for long-running commands (processors, workers, provisioner, watch, up).

``start_metrics_server(port, addr)`` serves ``/metrics`` on a background thread (port None
or 0: disabled) with every chunkserve family present from the start, each topic's series
at 0 included, so an idle process is told from a missing one. ``metrics()`` returns the
process's metric objects, made once per registry; ``fleet_metrics()`` the fleet-wide
figures only the ``metrics`` processor exports (workers, sessions, chunk latency,
migrations, scale events, cost, rejections), which ``docs/grafana-dashboard.json`` plots.
Names follow the Prometheus conventions: base units in the name, ``_total`` on counters.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, get_args

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from schemas.records import RejectReason
from schemas.topics import TOPICS

__all__ = ["Metrics", "FleetMetrics", "metrics", "fleet_metrics", "start_metrics_server",
           "observe_heartbeat", "SESSION_STATES", "SCALE_DIRECTIONS"]

SESSION_STATES = ("active", "idle")
SCALE_DIRECTIONS = ("scale-out", "scale-in")
CHUNK_LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class Metrics:
    """The chunkserve metric families."""

    consumed: Counter
    produced: Counter
    dead_lettered: Counter
    event_time_replaced: Counter
    rejected: Counter
    chunks_released: Counter
    sessions_held: Gauge
    worker_sessions: Gauge
    worker_chunk_latency: Gauge
    worker_device_mem: Gauge
    worker_device_util: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry) -> "Metrics":
        r = registry
        return cls(
            consumed=Counter("chunkserve_records_consumed", "Records consumed", ["topic"], registry=r),
            produced=Counter("chunkserve_records_produced", "Records produced", ["topic"], registry=r),
            dead_lettered=Counter("chunkserve_records_dead_lettered", "Records sent to dead-letters",
                                  ["topic"], registry=r),
            event_time_replaced=Counter("chunkserve_event_time_replaced", "Records whose ts was too "
                                        "far from the broker's timestamp (the broker's was used)",
                                        ["topic"], registry=r),
            rejected=Counter("chunkserve_commands_rejected", "Commands refused by workers",
                             ["reason"], registry=r),
            chunks_released=Counter("chunkserve_chunks_released", "Chunks released under a "
                                    "revalidated generation", ["worker"], registry=r),
            sessions_held=Gauge("chunkserve_sessions_held", "Sessions this worker holds", ["worker"],
                                registry=r),
            worker_sessions=Gauge("chunkserve_worker_sessions", "Sessions per worker (heartbeat)",
                                  ["worker"], registry=r),
            worker_chunk_latency=Gauge("chunkserve_worker_chunk_latency_seconds",
                                       "Last chunk latency per worker (heartbeat)", ["worker"], registry=r),
            worker_device_mem=Gauge("chunkserve_worker_device_memory_bytes",
                                    "Device memory in use per worker (heartbeat)", ["worker"], registry=r),
            worker_device_util=Gauge("chunkserve_worker_device_utilization_ratio",
                                     "Device utilization 0..1 per worker (heartbeat)", ["worker"], registry=r),
        ).initialize()

    def initialize(self) -> "Metrics":
        """Every topic's record counters and every refusal reason's at 0: exposed before the
        first record (an idle process is told from a missing one)."""
        for topic in TOPICS:
            for family in (self.consumed, self.produced, self.dead_lettered, self.event_time_replaced):
                family.labels(topic)
        for reason in get_args(RejectReason):
            self.rejected.labels(reason)
        return self


@dataclass(frozen=True)
class FleetMetrics:
    """The whole fleet as the ``metrics`` processor reads it from the log."""

    workers: Gauge
    sessions: Gauge
    chunk_latency: Histogram
    migrations: Counter
    scale_events: Counter
    gpu_seconds: Gauge
    cost: Gauge
    rejected: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> "FleetMetrics":
        r = registry
        made = cls(
            workers=Gauge("chunkserve_fleet_workers", "Workers up (registered and heard from)", registry=r),
            sessions=Gauge("chunkserve_fleet_sessions", "Open sessions by state (session-events)",
                           ["state"], registry=r),
            chunk_latency=Histogram("chunkserve_fleet_chunk_latency_seconds", "Per-chunk latency "
                                    "(ChunkDone)", buckets=CHUNK_LATENCY_BUCKETS_S, registry=r),
            migrations=Counter("chunkserve_fleet_migrations", "Sessions moved between workers "
                               "(Released, reason migrated)", registry=r),
            scale_events=Counter("chunkserve_fleet_scale_events", "Autoscaler decisions "
                                 "(ScalingDecision) by direction", ["direction"], registry=r),
            gpu_seconds=Gauge("chunkserve_fleet_gpu_seconds", "Worker-seconds accrued since the "
                              "log began (cumulative, CostTick)", registry=r),
            cost=Gauge("chunkserve_fleet_cost_dollars", "Cost accrued since the log began at the "
                       "profile's prices, USD (cumulative, CostTick)", registry=r),
            rejected=Counter("chunkserve_fleet_commands_rejected", "Commands refused by any worker "
                             "or provisioner (CommandRejected) by reason", ["reason"], registry=r),
        )
        for state in SESSION_STATES:
            made.sessions.labels(state)
        for direction in SCALE_DIRECTIONS:
            made.scale_events.labels(direction)
        for reason in get_args(RejectReason):
            made.rejected.labels(reason)
        return made


# registry -> {families class: its families}; weak, so a registry's id reused after it is
# collected never finds another registry's families
_MADE: "weakref.WeakKeyDictionary[CollectorRegistry, dict[type, Any]]" = weakref.WeakKeyDictionary()


def _once(cls: Any, registry: CollectorRegistry | None) -> Any:
    made = _MADE.setdefault(registry if registry is not None else REGISTRY, {})
    if cls not in made:
        made[cls] = cls.create(registry if registry is not None else REGISTRY)
    return made[cls]


def metrics(registry: CollectorRegistry | None = None) -> Metrics:
    """The metric objects on ``registry`` (default: the global one), created on first use."""
    return _once(Metrics, registry)  # type: ignore[no-any-return]


def fleet_metrics(registry: CollectorRegistry | None = None) -> FleetMetrics:
    """The fleet figures on ``registry`` (default: the global one), created on first use."""
    return _once(FleetMetrics, registry)  # type: ignore[no-any-return]


def observe_heartbeat(hb: Any, m: Metrics | None = None) -> None:
    """Copy a ``Heartbeat``'s figures into the per-worker gauges."""
    m = m or metrics()
    w = hb.worker_id
    m.worker_sessions.labels(w).set(hb.sessions)
    m.worker_chunk_latency.labels(w).set(hb.chunk_latency_s)
    m.worker_device_mem.labels(w).set(hb.device_mem_bytes)
    m.worker_device_util.labels(w).set(hb.device_util)


def start_metrics_server(port: int | None, registry: CollectorRegistry | None = None,
                         addr: str = "127.0.0.1") -> Any:
    """Serve ``/metrics`` on ``addr:port`` in a daemon thread, every chunkserve family
    already there; returns the server, or None if disabled."""
    if not port:
        return None
    reg = registry if registry is not None else REGISTRY
    metrics(reg)
    server, _thread = start_http_server(port, addr=addr, registry=reg)
    return server
