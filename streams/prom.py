"""Prometheus exposition for long-running commands (processors, workers, watch).

``start_metrics_server(port)`` serves ``/metrics`` on a background thread (port None or 0:
disabled). ``metrics()`` returns the process's metric objects, made once per registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, start_http_server

__all__ = ["Metrics", "metrics", "start_metrics_server", "observe_heartbeat"]


@dataclass(frozen=True)
class Metrics:
    """The chunkserve metric families."""

    consumed: Counter
    produced: Counter
    dead_lettered: Counter
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
            rejected=Counter("chunkserve_commands_rejected", "Commands refused by workers",
                             ["reason"], registry=r),
            chunks_released=Counter("chunkserve_chunks_released", "Chunks released under a "
                                    "revalidated generation", ["worker"], registry=r),
            sessions_held=Gauge("chunkserve_sessions_held", "Sessions this process holds", registry=r),
            worker_sessions=Gauge("chunkserve_worker_sessions", "Sessions per worker (heartbeat)",
                                  ["worker"], registry=r),
            worker_chunk_latency=Gauge("chunkserve_worker_chunk_latency_seconds",
                                       "Last chunk latency per worker (heartbeat)", ["worker"], registry=r),
            worker_device_mem=Gauge("chunkserve_worker_device_memory_bytes",
                                    "Device memory in use per worker (heartbeat)", ["worker"], registry=r),
            worker_device_util=Gauge("chunkserve_worker_device_utilization",
                                     "Device utilization 0..1 per worker (heartbeat)", ["worker"], registry=r),
        )


_BY_REGISTRY: dict[int, Metrics] = {}


def metrics(registry: CollectorRegistry | None = None) -> Metrics:
    """The metric objects on ``registry`` (default: the global one), created on first use."""
    reg = registry if registry is not None else REGISTRY
    if id(reg) not in _BY_REGISTRY:
        _BY_REGISTRY[id(reg)] = Metrics.create(reg)
    return _BY_REGISTRY[id(reg)]


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
    """Serve ``/metrics`` on ``port`` in a daemon thread; returns the server, or None if disabled."""
    if not port:
        return None
    server, _thread = start_http_server(port, addr=addr, registry=registry if registry is not None else REGISTRY)
    return server
