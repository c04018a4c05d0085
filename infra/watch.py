"""``chunkserve watch``: a live view of the fleet from ``metrics`` and ``worker-events``.

Reads both topics without a consumer group (from the end, or from ``from_offset`` on every
partition). ``fold(state, record) -> state`` is the whole view logic and is pure: it never
mutates its input and reads no clock. The shell polls, folds and renders a rich table.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from schemas.records import (ChunkDone, CommandRejected, CostTick, Heartbeat,
                             PlacementReport, Record, Released, WorkerDown, WorkerUp,
                             WorkloadSignal)
from schemas.topics import METRICS, WORKER_EVENTS
from streams.config import Settings

__all__ = ["WorkerView", "WatchState", "fold", "sessions", "summary", "table", "watch"]


@dataclass(frozen=True, slots=True)
class WorkerView:
    """One worker as its last heartbeat (and chunk) described it."""

    capacity: int = 0
    sessions: int = 0
    chunk_latency_s: float = 0.0
    device_mem_bytes: int = 0
    device_util: float = 0.0
    power_w: float = 0.0
    last_ts: float = 0.0
    up: bool = True


@dataclass(frozen=True)
class WatchState:
    """Everything the view shows; a new one per folded record that changes it."""

    workers: dict[str, WorkerView] = field(default_factory=dict)
    chunks: int = 0
    worst_chunk_latency_s: float = 0.0
    migrations: int = 0
    rejected: int = 0
    gpus: int = 0
    cost_ts: float = 0.0  # when the metrics processor last counted them (0: never seen)
    gpu_seconds: float = 0.0
    cost: float = 0.0
    volatility_level: int = 0
    placement_sessions: int = 0
    records: int = 0


def _worker(state: WatchState, wid: str, **changes: Any) -> dict[str, WorkerView]:
    return {**state.workers, wid: replace(state.workers.get(wid, WorkerView()), **changes)}


def fold(state: WatchState, rec: Record) -> WatchState:
    """The view after ``rec``; ``state`` is left as it was."""
    s = replace(state, records=state.records + 1)
    if isinstance(rec, Heartbeat):
        return replace(s, workers=_worker(s, rec.worker_id, capacity=rec.capacity,
                                          sessions=rec.sessions, chunk_latency_s=rec.chunk_latency_s,
                                          device_mem_bytes=rec.device_mem_bytes,
                                          device_util=rec.device_util, power_w=rec.power_w,
                                          last_ts=rec.ts, up=True))
    if isinstance(rec, WorkerUp):
        return replace(s, workers=_worker(s, rec.worker_id, capacity=rec.capacity, last_ts=rec.ts, up=True))
    if isinstance(rec, WorkerDown):
        return replace(s, workers=_worker(s, rec.worker_id, up=False, sessions=0, last_ts=rec.ts))
    if isinstance(rec, Released) and rec.reason == "migrated":
        return replace(s, migrations=s.migrations + 1)
    if isinstance(rec, ChunkDone):
        return replace(s, chunks=s.chunks + 1,
                       worst_chunk_latency_s=max(s.worst_chunk_latency_s, rec.latency_s))
    if isinstance(rec, CommandRejected):
        return replace(s, rejected=s.rejected + 1)
    if isinstance(rec, CostTick) and not rec.pool:  # the all-pools total
        return replace(s, gpus=rec.gpus, cost_ts=rec.ts, gpu_seconds=rec.gpu_seconds, cost=rec.cost)
    if isinstance(rec, WorkloadSignal):
        return replace(s, volatility_level=rec.level)
    if isinstance(rec, PlacementReport):
        return replace(s, placement_sessions=rec.sessions)
    return s


def sessions(state: WatchState) -> int:
    """The sessions the fleet holds: the sum of the up workers' last heartbeats (so a view
    started from the end counts the sessions claimed before it, as the worker rows do)."""
    return sum(w.sessions for w in state.workers.values() if w.up)


def summary(state: WatchState) -> dict[str, Any]:
    """The state as plain data (what ``watch`` returns)."""
    return {
        "workers": {w: {"up": v.up, "sessions": v.sessions, "capacity": v.capacity,
                        "chunk_latency_ms": round(v.chunk_latency_s * 1e3, 3),
                        "device_mem_bytes": v.device_mem_bytes, "device_util": v.device_util}
                    for w, v in sorted(state.workers.items())},
        "sessions": sessions(state), "chunks": state.chunks,
        "worst_chunk_latency_ms": round(state.worst_chunk_latency_s * 1e3, 3),
        "migrations": state.migrations, "rejected": state.rejected, "gpus": state.gpus,
        "gpus_ts": state.cost_ts or None, "gpu_seconds": state.gpu_seconds, "cost": state.cost,
        "volatility_level": state.volatility_level, "records": state.records,
    }


def cost_age(state: WatchState, now: float) -> str:
    """How old the GPU count and cost are: they come from the metrics processor's CostTick,
    so after the fleet stops they are its last word (the view showed them as current)."""
    if not state.cost_ts:
        return " (no cost tick seen)"
    age = max(0.0, now - state.cost_ts)
    return f" ({age:.0f} s ago)" if age >= 10 else ""


def table(state: WatchState, now: float) -> Any:
    """A rich table of the workers plus a caption with the fleet figures."""
    from rich.table import Table

    t = Table(title="chunkserve watch", caption=(
        f"sessions {sessions(state)}  chunks {state.chunks}  worst chunk "
        f"{state.worst_chunk_latency_s * 1e3:.1f} ms  migrations {state.migrations}  rejected "
        f"{state.rejected}  gpus {state.gpus}  cost {state.cost:.2f} ({state.gpu_seconds:.0f} GPU-s)"
        f"{cost_age(state, now)}"
        f"  volatility {state.volatility_level}"))
    for col in ("worker", "state", "sessions", "chunk ms", "device mem MiB", "util", "seen s ago"):
        t.add_column(col, justify="left" if col in ("worker", "state") else "right")
    for wid, w in sorted(state.workers.items()):
        t.add_row(wid, "up" if w.up else "[red]down[/red]", f"{w.sessions}/{w.capacity}",
                  f"{w.chunk_latency_s * 1e3:.1f}", f"{w.device_mem_bytes / 2**20:.0f}",
                  f"{w.device_util:.0%}", f"{max(0.0, now - w.last_ts):.1f}")
    return t


async def watch(settings: Settings, duration_s: float | None, render: bool = True,
                from_offset: int | None = None, clock: Callable[[], float] = time.time,
                stop: asyncio.Event | None = None) -> dict[str, Any]:
    """Follow the fleet for ``duration_s`` seconds (None: until ``stop`` is set or it is
    cancelled); returns the summary.

    ``from_offset`` None starts at the end of every partition, else at that offset.
    """
    from rich.live import Live

    from streams.kafka import RecordConsumer

    state = WatchState()
    # read-only (it needs only READ on its two topics): the topics' own consumers dead-letter
    consumer = RecordConsumer(settings, [METRICS, WORKER_EVENTS], None, name="chunkserve-watch",
                              fetch_max_wait_ms=100)
    await consumer.start(subscribe=False)
    live = Live(table(state, clock()), refresh_per_second=4, transient=False) if render else None
    try:
        ends = await consumer.assign(dict.fromkeys((METRICS, WORKER_EVENTS)),
                                     "end" if from_offset is None else from_offset, deployed=True)
        deadline = None if duration_s is None else time.monotonic() + duration_s
        if live is not None:
            live.start()
        while not (stop is not None and stop.is_set()) and (deadline is None or time.monotonic() < deadline):
            for d in await consumer.poll(timeout_ms=200):
                state = fold(state, d.record)
            if live is not None:
                live.update(table(state, clock()))
        # read from an offset and stopped before the log's end as it was at the start: its
        # figures are of part of the history (an outside run's 4 s summary of 140k records
        # counted 22 sessions of 16 and workers long shut down as up)
        unread = 0
        for tp, end in ends.items():
            unread += max(0, end - await consumer.raw.position(tp))
    finally:
        if live is not None:
            live.stop()
        await consumer.stop()
    return {**summary(state), "unread": unread}
