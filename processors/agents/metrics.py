"""The metrics agent: GPU-seconds and cost from ``worker-events``, as ``CostTick`` records,
and the fleet's Prometheus figures (``streams.prom.FleetMetrics``).

A worker accrues from its ``WorkerUp`` to its ``WorkerDown``; one that went silent stops
accruing ``stale_s`` after it was last heard from. The fold is per worker, in the order of
the worker's partition; a duplicate up or down is ignored. Prices come from the latency
profile (``CHUNKSERVE_PROFILE``, default ``reference-cpu``). One replica runs per topic prefix
(a second is refused: ``LEASE``); it also reads ``session-events`` (sessions active and idle)
and ``metrics`` (scale events) for Prometheus.
At start it reads ``worker-events`` and ``session-events`` from their start (:func:`catch_up`),
so a restart still bills the workers up and counts the sessions open before it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from processors.latency import LatencyModel, load_profiles
from processors.lifecycle import EVENT_KIND, REFUSED_UNKNOWN, SessionState, remember_closed, transition
from schemas import records as r
from schemas.errors import ConfigError
from streams.config_file import env_number

__all__ = ["WorkerSpan", "fold_cost", "cost_tick", "SessionTally", "observe_fleet",
           "build_app"]

log = logging.getLogger(__name__)

# one live metrics processor per topic prefix (a lease, streams.lease): a second one's ticks
# would interleave with the first's; `chunkserve processor` refuses it
LEASE = "metrics"

# worker events the fleet figures read beside billing
OBSERVED = (r.ChunkDone, r.Released, r.CommandRejected)


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
    match rec:
        case r.WorkerUp(ts=ts) if span.up_since is None and ts > span.last_down:
            span = replace(span, gpu_type=rec.gpu_type, up_since=ts, last_seen=ts)
        case r.Heartbeat(ts=ts) if span.up_since is None and ts > span.last_down:
            # heard from after its WorkerDown (declared dead and back; another process of its
            # id stopped): billed again from here, as its slots count again
            span = replace(span, up_since=ts, last_seen=ts)
        case r.Heartbeat(ts=ts):
            span = replace(span, last_seen=max(span.last_seen, ts))
        case r.WorkerDown(ts=ts) if span.up_since is not None:
            end = max(ts, span.up_since)
            span = replace(span, accrued_s=span.accrued_s + end - span.up_since, up_since=None, last_down=ts)
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


@dataclass
class SessionTally:
    """Open sessions by lifecycle state, folded from session events. Closed ones are
    remembered (the latest ``processors.lifecycle.CLOSED_KEPT``), so that a late or reused open of one is not
    counted as a new session: dispatch refuses it."""

    open: dict[str, SessionState] = field(default_factory=dict)
    closed: dict[str, None] = field(default_factory=dict)  # in closing order

    def fold(self, rec: r.Record) -> None:
        kind = EVENT_KIND.get(type(rec))
        if kind is None:  # not a session event
            return
        sid: str = rec.session_id  # type: ignore[attr-defined]
        current = SessionState.TERMINATED if sid in self.closed else self.open.get(sid)
        if current is None and kind in REFUSED_UNKNOWN:
            return  # dispatch refuses it: an idle of an id never opened counted an idle session
        nxt, _ = transition(current, kind)
        if nxt is not SessionState.TERMINATED:
            self.open[sid] = nxt
        elif current is not SessionState.TERMINATED:
            self.open.pop(sid, None)
            remember_closed(self.closed, sid)

    def counts(self) -> dict[str, int]:
        """Open sessions by the state operators see: active (executing) and idle (suspended)."""
        active = sum(1 for v in self.open.values() if v is SessionState.EXECUTION)
        return {"active": active, "idle": len(self.open) - active}


def observe_fleet(fleet: Any, rec: r.Record) -> None:
    """Count one record in the fleet figures (chunk latency, migrations, scale events,
    rejections, cost); records that carry none leave them as they are."""
    match rec:
        case r.ChunkDone(latency_s=latency):
            fleet.chunk_latency.observe(latency)
        case r.Released(reason="migrated"):
            fleet.migrations.inc()
        case r.CommandRejected(reason=reason):
            fleet.rejected.labels(reason).inc()
        case r.ScalingDecision(reason=reason):
            fleet.scale_events.labels(reason or "unknown").inc()
        case r.CostTick(pool=""):
            fleet.workers.set(rec.gpus)
            fleet.gpu_seconds.set(rec.gpu_seconds)
            fleet.cost.set(rec.cost)


def metrics_settings(env: Mapping[str, str]) -> tuple[LatencyModel, float]:
    """The profile that prices GPUs and the cost tick's interval, from the environment."""
    spec = env.get("CHUNKSERVE_PROFILE") or "reference-cpu"
    try:
        model = load_profiles(spec)
    except ConfigError as exc:  # named as the variable it came from
        reason = str(exc).split("profile: ", 1)[-1]
        raise ConfigError("profile", reason if spec in reason else f"{spec[:200]}: {reason}",
                          "env CHUNKSERVE_PROFILE") from None
    return model, env_number(env, "CHUNKSERVE_COST_INTERVAL_S", 5.0, positive=True)


async def catch_up(settings: Any, catalogue: Any, spans: dict[str, WorkerSpan], sessions: SessionTally) -> dict[str, WorkerSpan]:
    """Fold ``worker-events`` (billing) and ``session-events`` from their start to their ends
    as of now, without a group: a restarted metrics processor bills the workers already up
    and counts the sessions already open (its agents resume after their committed offsets,
    past those ``WorkerUp`` and opens). Folding a record again is harmless (see
    :func:`fold_cost`, :class:`SessionTally`)."""
    from schemas.topics import SESSION_EVENTS, WORKER_EVENTS, misfiled
    from streams.kafka import RecordConsumer

    reader = RecordConsumer(settings, [WORKER_EVENTS, SESSION_EVENTS], None, name="metrics-catch-up",
                            catalogue=catalogue)
    await reader.start(subscribe=False)
    try:
        async for d in reader.read_to(await reader.assign(dict.fromkeys((WORKER_EVENTS, SESSION_EVENTS)))):
            if d.refused is not None:  # not written by its worker: the live agents refuse it too
                continue
            if isinstance(d.record, BILLED):
                spans = fold_cost(spans, d.record)
            elif misfiled(d.record, d.key) is None:
                sessions.fold(d.record)
    finally:
        await reader.stop()
    return spans


async def _rebuild(settings: Any, catalogue: Any, state: dict[str, Any], sessions: SessionTally, fleet: Any,
                   caught_up: asyncio.Event) -> None:
    """:func:`catch_up` into the agents' state, then let them fold on."""
    try:
        state["spans"] = await catch_up(settings, catalogue, state["spans"], sessions)
        for name, n in sessions.counts().items():
            fleet.sessions.labels(name).set(n)
    except Exception as exc:  # the broker away: bill from what the agents read, as before
        log.warning("metrics: reading the log from its start failed (%s); counting from the agents' offsets", exc)
    finally:
        caught_up.set()


def build_app(settings: Any) -> Any:
    """The faust app: one agent folding ``worker-events``, a timer publishing ``CostTick``;
    at start, the log read from its start (:func:`catch_up`) before the agents fold."""
    from schemas.topics import METRICS, SESSION_EVENTS, WORKER_EVENTS, misfiled
    from streams.faust_app import FaustPublisher, decode_event, make_app
    from streams.prom import fleet_metrics
    from streams.topics import TopicCatalogue

    app = make_app("metrics", settings)
    catalogue = TopicCatalogue.from_settings(settings)
    publisher = FaustPublisher(app, catalogue)
    model, interval_s = metrics_settings(os.environ)
    state: dict[str, Any] = {"spans": {}}
    sessions = SessionTally()
    fleet = fleet_metrics()
    worker_tags = BILLED_TAGS | {cls.TAG for cls in OBSERVED}
    caught_up = asyncio.Event()

    @app.task
    async def rebuild() -> None:
        await _rebuild(settings, catalogue, state, sessions, fleet, caught_up)

    @app.agent(publisher.topic(WORKER_EVENTS), name="metrics-worker-events")
    async def worker_events(stream: Any) -> None:
        await caught_up.wait()
        async for event in stream.events():
            rec = await decode_event(event, WORKER_EVENTS, publisher, "metrics", worker_tags)
            if isinstance(rec, BILLED):
                state["spans"] = fold_cost(state["spans"], rec)
            elif rec is not None:
                observe_fleet(fleet, rec)

    @app.agent(publisher.topic(SESSION_EVENTS), name="metrics-session-events")
    async def session_events(stream: Any) -> None:
        await caught_up.wait()
        async for event in stream.events():
            rec = await decode_event(event, SESSION_EVENTS, publisher, "metrics")
            if rec is not None and misfiled(rec, event.message.key) is None:  # dispatch refuses a misfiled one
                sessions.fold(rec)
                for name, n in sessions.counts().items():
                    fleet.sessions.labels(name).set(n)

    @app.agent(publisher.topic(METRICS), name="metrics-decisions")
    async def decisions(stream: Any) -> None:
        async for event in stream.events():
            rec = await decode_event(event, METRICS, publisher, "metrics", frozenset({r.ScalingDecision.TAG}))
            if rec is not None:
                observe_fleet(fleet, rec)

    @app.timer(interval_s)
    async def publish() -> None:
        if state["spans"]:
            tick = cost_tick(state["spans"], time.time(), model)
            observe_fleet(fleet, tick)
            await publisher.send(tick)

    return app
