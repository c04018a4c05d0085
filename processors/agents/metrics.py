"""The metrics agent: GPU-seconds and cost from ``worker-events``, as ``CostTick`` records.

A worker accrues from its ``WorkerUp`` to its ``WorkerDown``; one that went silent stops
accruing ``stale_s`` after it was last heard from. The fold is per worker, in the order of
the worker's partition; a duplicate up or down is ignored. Prices come from the latency
profile (``CHUNKSERVE_PROFILE``, default ``reference-cpu``). Run one replica.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, replace
from typing import Any, Mapping

from processors.latency import LatencyModel, load_profiles
from schemas import records as r

__all__ = ["WorkerSpan", "fold_cost", "cost_tick", "build_app"]


@dataclass(frozen=True, slots=True)
class WorkerSpan:
    """One worker's billing: seconds accrued in closed spans, and the open span if up."""

    gpu_type: str = "cpu"
    accrued_s: float = 0.0
    up_since: float | None = None
    last_seen: float = -math.inf
    last_down: float = -math.inf


# the worker events billing reads; the agent passes over the others undecoded
BILLED = (r.WorkerUp, r.Heartbeat, r.WorkerDown)
BILLED_TAGS = frozenset(cls.TAG for cls in BILLED)


def fold_cost(state: Mapping[str, WorkerSpan], rec: r.Record) -> dict[str, WorkerSpan]:
    """Fold one worker event; other records leave the state as it is."""
    if not isinstance(rec, BILLED):
        return dict(state)
    span = state.get(rec.worker_id) or WorkerSpan()
    if isinstance(rec, r.WorkerUp):
        if span.up_since is None and rec.ts > span.last_down:
            span = replace(span, gpu_type=rec.gpu_type, up_since=rec.ts, last_seen=rec.ts)
    elif isinstance(rec, r.Heartbeat):
        span = replace(span, last_seen=max(span.last_seen, rec.ts))
    elif span.up_since is not None:
        end = max(rec.ts, span.up_since)
        span = replace(span, accrued_s=span.accrued_s + end - span.up_since, up_since=None,
                       last_down=rec.ts)
    return {**state, rec.worker_id: span}


def cost_tick(state: Mapping[str, WorkerSpan], now: float, model: LatencyModel,
              stale_s: float = 30.0) -> r.CostTick:
    """GPU-seconds and cost accrued by every worker seen, up to ``now``."""
    gpus, seconds, cost = 0, 0.0, 0.0
    for span in state.values():
        s = span.accrued_s
        if span.up_since is not None:
            end = min(now, max(span.last_seen, span.up_since) + stale_s)
            s += max(0.0, end - span.up_since)
            gpus += end >= now
        price = model.profiles[span.gpu_type].cost_per_hour if span.gpu_type in model.profiles else 0.0
        seconds += s
        cost += s * price / 3600.0
    return r.CostTick(ts=max(0.0, now), gpus=gpus, gpu_seconds=seconds, cost=cost)


def build_app(settings: Any) -> Any:
    """The faust app: one agent folding ``worker-events``, a timer publishing ``CostTick``."""
    from schemas.topics import WORKER_EVENTS
    from streams.faust_app import FaustPublisher, decode_event, make_app
    from streams.topics import TopicCatalogue

    app = make_app("metrics", settings)
    publisher = FaustPublisher(app, TopicCatalogue.from_settings(settings))
    model = load_profiles(os.environ.get("CHUNKSERVE_PROFILE") or "reference-cpu")
    interval_s = float(os.environ.get("CHUNKSERVE_COST_INTERVAL_S", 5.0))
    state: dict[str, dict[str, WorkerSpan]] = {"spans": {}}

    @app.agent(publisher.topic(WORKER_EVENTS), name="metrics-worker-events")
    async def worker_events(stream: Any) -> None:
        async for event in stream.events():
            rec = await decode_event(event, WORKER_EVENTS, publisher, "metrics", BILLED_TAGS)
            if isinstance(rec, BILLED):
                state["spans"] = fold_cost(state["spans"], rec)

    @app.timer(interval_s)
    async def publish() -> None:
        if state["spans"]:
            await publisher.send(cost_tick(state["spans"], time.time(), model))

    return app
