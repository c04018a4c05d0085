"""Control-plane benchmark: CreateLive and PushText latency through the real dispatch path.

Real broker, real Redis, ``dispatch_replicas`` dispatch processors (``python -m infra
processor dispatch``) and ``workers`` light workers (``python -m workers.light``: the real
runtime driving ``NullModel``, one chunk per session per hour), all as child processes.

- CreateLive: ``SessionOpened`` handed to the producer -> the owner's claim, at the time
  stamped on its ``Claimed`` (the claim is then visible in the store).
- PushText: ``InputPushed`` handed to the producer -> the owner's acceptance, at the time
  stamped on its ``InputAccepted``.

Both ends read the same machine's wall clock, so the benchmark's own reader (which fetches
with a 50 ms wait, so that its polling takes little from the broker it measures) adds
nothing.
``breakdown_ms`` splits each path at dispatch, by the time dispatch stamped on the ``Assign``
/ ``RoutedInput`` it published (read from ``worker-commands``): ``to_dispatch`` is the first
hop plus dispatch's own work, ``to_owner`` the second hop plus the worker's.

Opens go out at a steady ``rate`` per second (not all at once), then the pushes at the same
rate; every session stays open, so ``sessions`` is the concurrency reached. ``events_per_s``
is (opens + pushes) / (first publish -> last Claimed or InputAccepted seen).
``cpu_pct`` is the share of one core each role (broker, Redis, dispatch, workers, the
benchmark itself) used over the measured span. ``max_consumer_lag`` is the largest, over samples every 0.25 s, of the dispatch consumer
group's total lag: the sum over every partition of ``session-events``, ``session-inputs``
and ``worker-events`` of (log end offset - the group's committed offset). faust commits
every 0.5 s or 100 records, so a healthy run still shows a few hundred.
"""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

from schemas.records import (Assign, Claimed, InputAccepted, InputPushed, RoutedInput, SessionOpened,
                             WorkerUp)
from schemas.topics import SESSION_EVENTS, SESSION_INPUTS, WORKER_COMMANDS, WORKER_EVENTS
from streams.config import Settings
from streams.kafka import RecordConsumer, RecordProducer
from streams.topics import TopicCatalogue, ensure_topics

from ..local import LocalFleet, child_env

__all__ = ["run", "percentiles"]

_LAG_TOPICS = (SESSION_EVENTS, SESSION_INPUTS, WORKER_EVENTS)


def percentiles(values_ms: list[float]) -> dict[str, float]:
    """``{"p50", "p99"}`` by nearest rank, in ms (zeros when empty)."""
    if not values_ms:
        return {"p50": 0.0, "p99": 0.0}
    ordered = sorted(values_ms)

    def rank(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))], 3)

    return {"p50": rank(0.50), "p99": rank(0.99)}


def run(settings: Settings, sessions: int, workers: int = 4, inputs_per_session: int = 1,
        log_dir: Path | None = None, rate: float = 500.0, dispatch_replicas: int = 1,
        timeout_s: float = 120.0, redis_cluster: bool = False,
        replica_acks: int | None = None, warmup_s: float = 10.0) -> dict[str, Any]:
    """Run the benchmark; without endpoints in ``settings`` it starts embedded ones
    (``redis_cluster``: an embedded Redis Cluster, fenced writes acknowledged by
    ``replica_acks`` replicas, default one)."""
    from dataclasses import replace

    from ..embedded import infrastructure
    from ..redis_cluster import EmbeddedRedisCluster

    logs = log_dir or Path(tempfile.mkdtemp(prefix="chunkserve-bench-"))
    logs.mkdir(parents=True, exist_ok=True)  # --log-dir was only checked as the command line was read
    run_id = uuid.uuid4().hex[:6]
    with ExitStack() as stack:
        broker: dict[str, Any] = {"kind": "configured", "version": None,
                                  "brokers": len(settings.kafka.bootstrap.split(","))}
        if not settings.kafka.bootstrap or not settings.redis.url:
            infra = stack.enter_context(infrastructure(logs))
            if not settings.kafka.bootstrap:
                broker = infra.describe()
                settings = infra.settings(settings)
            settings = settings.with_endpoints(settings.kafka.bootstrap, settings.redis.url or infra.redis_url)
        redis: dict[str, Any] = {"kind": "single", "replica_acks": settings.redis.acks}
        if redis_cluster:
            cluster = stack.enter_context(EmbeddedRedisCluster(logs / "redis-cluster"))
            settings = replace(settings, redis=replace(settings.redis, url=cluster.url, cluster="on",
                                                       replica_acks=replica_acks))
            redis = {"kind": "cluster", "masters": cluster.masters, "replicas_each": cluster.replicas,
                     "replica_acks": settings.redis.acks}
        settings = settings.isolated(f"cp-{run_id}")
        result = asyncio.run(_bench(settings, logs, sessions, workers, inputs_per_session, rate,
                                    dispatch_replicas, timeout_s, warmup_s))
        return {"broker": broker, "redis": redis, **result}


class _Tracker:
    """Reads worker events and notes when each awaited Claimed / InputAccepted shows up."""

    def __init__(self, settings: Settings, producer: RecordProducer) -> None:
        self.consumer = RecordConsumer(settings, [WORKER_EVENTS, WORKER_COMMANDS], producer,
                                       name="bench-tracker", fetch_max_wait_ms=50)
        self.partitions = settings.partitions.get(WORKER_EVENTS, 1)
        self.command_partitions = settings.partitions.get(WORKER_COMMANDS, 1)
        self.dispatched: dict[Any, float] = {}  # dispatch's timestamp on each Assign / RoutedInput
        self.up: set[str] = set()
        # the owner's own timestamp of each Claimed / InputAccepted
        self.claimed: dict[str, float] = {}
        self.accepted: dict[tuple[str, int], float] = {}
        self.last_seen = 0.0

    async def start(self) -> None:
        await self.consumer.start(subscribe=False)
        await self.consumer.assign({WORKER_EVENTS: None, WORKER_COMMANDS: None}, "end")

    async def pump(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            for d in await self.consumer.poll(timeout_ms=50):
                now, rec = time.perf_counter(), d.record
                if isinstance(rec, Claimed):
                    self.claimed.setdefault(rec.session_id, rec.ts)
                    self.last_seen = now
                elif isinstance(rec, InputAccepted):
                    self.accepted.setdefault((rec.session_id, rec.seq), rec.ts)
                    self.last_seen = now
                elif isinstance(rec, WorkerUp):
                    self.up.add(rec.worker_id)
                elif isinstance(rec, Assign):
                    self.dispatched.setdefault(rec.session_id, rec.ts)
                elif isinstance(rec, RoutedInput):
                    self.dispatched.setdefault((rec.session_id, rec.seq), rec.ts)


async def _lag_sampler(settings: Settings, group: str, stop: asyncio.Event, out: list[int]) -> None:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    cat = TopicCatalogue.from_settings(settings)
    tps = [TopicPartition(cat.name(t), p) for t in _LAG_TOPICS for p in range(cat.partitions.get(t, 1))]
    # a consumer carrying the group id that never subscribes: it reads the group's committed
    # offsets (OffsetFetch) without joining; aiokafka's admin OffsetFetch does not decode
    # Tansu's answer
    ends = AIOKafkaConsumer(**settings.kafka.client_kwargs(), group_id=group,
                            enable_auto_commit=False)
    await ends.start()
    try:
        while not stop.is_set():
            try:
                end = await ends.end_offsets(tps)
                lag = 0
                for tp in tps:
                    committed = await ends.committed(tp)
                    lag += max(0, end[tp] - (committed or 0))
                out.append(lag)
            except Exception:  # the group may not have committed yet while dispatch joins
                pass
            try:
                await asyncio.wait_for(stop.wait(), 0.25)
            except asyncio.TimeoutError:
                pass
    finally:
        await ends.stop()


def _cpu_by_role() -> dict[str, float]:
    """CPU seconds used so far by this benchmark and the processes it started, by role."""
    import psutil

    me = psutil.Process()
    out = {"bench": sum(me.cpu_times()[:2])}
    for child in me.children(recursive=True):
        try:
            line = " ".join(child.cmdline())
            used = sum(child.cpu_times()[:2])
        except psutil.Error:  # exited meanwhile
            continue
        role = ("broker" if "tansu" in line or "kafka.Kafka" in line else
                "redis" if "redis-server" in line else
                "dispatch" if "processor dispatch" in line else "workers" if "workers.light" in line else
                "other")
        out[role] = out.get(role, 0.0) + used
    return out


async def _until(pred: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        await asyncio.sleep(0.02)


async def _paced(items: list[Any], rate: float, send: Any) -> None:
    """Call ``send(item)`` for each item on a steady schedule of ``rate`` per second."""
    t0 = time.perf_counter()
    for i, item in enumerate(items):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await send(item)


async def _bench(settings: Settings, logs: Path, sessions: int, workers: int, inputs: int,
                 rate: float, replicas: int, timeout_s: float, warmup_s: float = 0.0) -> dict[str, Any]:
    await ensure_topics(settings)
    # opened (one input each) at the rate before the measured sessions, and kept open: the
    # broker's JIT and every process's code paths are warm when measuring starts
    warm = [f"warm-{i}" for i in range(max(2, workers, int(warmup_s * rate)))]
    capacity = math.ceil((sessions + len(warm)) / workers * 1.25) + 8
    # light workers hold no model state: let them register the capacity the run needs
    settings = replace(settings, max_sessions_per_worker=max(settings.max_sessions_per_worker, capacity))
    fleet = LocalFleet(settings, logs)
    stop, lag_stop = asyncio.Event(), asyncio.Event()
    lags: list[int] = []
    try:
        async with RecordProducer(settings, client_id="bench") as producer:
            tracker = _Tracker(settings, producer)
            await tracker.start()
            pump = asyncio.create_task(tracker.pump(stop))
            for i in range(replicas):
                fleet.start_processor("dispatch", str(i))
            for i in range(workers):
                _spawn_light(fleet, settings, f"light-{i}", capacity)
            await _until(lambda: len(tracker.up) >= workers, 60, "workers to come up")
            sent: dict[Any, float] = {}  # wall-clock time each open / push was handed over

            async def open_(sid: str) -> None:
                sent[sid] = time.time()
                await producer.send(SessionOpened(session_id=sid, ts=time.time()), wait=False)

            async def push(item: tuple[str, int]) -> None:
                sent[item] = time.time()
                await producer.send(InputPushed(session_id=item[0], seq=item[1], kind="text",
                                                payload=f"say {item[1]}", ts=time.time()), wait=False)

            # the dispatch group joins, then the warm-up; none of it is measured
            await _paced(warm, rate, open_)
            await _until(lambda: all(s in tracker.claimed for s in warm), 90 + len(warm) / rate, "dispatch to start")
            await _paced([(s, 1) for s in warm], rate, push)
            await _until(lambda: all((s, 1) in tracker.accepted for s in warm), 90 + len(warm) / rate,
                         "the warm-up's inputs")
            lag_task = asyncio.create_task(
                _lag_sampler(settings, f"{settings.topic_prefix}dispatch", lag_stop, lags))
            ids = [f"s{i}" for i in range(sessions)]
            pushes = [(sid, seq) for seq in range(1, inputs + 1) for sid in ids]
            t_first, cpu_first = time.perf_counter(), _cpu_by_role()
            await _paced(ids, rate, open_)
            budget = timeout_s + sessions / rate
            timed_out = []
            try:
                await _until(lambda: all(s in tracker.claimed for s in ids), budget, "claims")
            except TimeoutError as exc:
                timed_out.append(str(exc))
            await _paced(pushes, rate, push)
            try:
                await _until(lambda: all(p in tracker.accepted for p in pushes),
                             timeout_s + len(pushes) / rate, "accepted inputs")
            except TimeoutError as exc:
                timed_out.append(str(exc))
            cpu_last, wall = _cpu_by_role(), time.perf_counter() - t_first
            lag_stop.set()
            await lag_task
            stop.set()
            await pump
            await tracker.consumer.stop()
    finally:
        stop.set()
        lag_stop.set()
        fleet.stop_all()
    owned = {**tracker.claimed, **tracker.accepted}
    create = [(tracker.claimed[s] - sent[s]) * 1e3 for s in ids if s in tracker.claimed]
    accept = [(tracker.accepted[p] - sent[p]) * 1e3 for p in pushes if p in tracker.accepted]
    span = max(tracker.last_seen - t_first, 1e-9)

    def split(keys: list[Any]) -> dict[str, dict[str, float]]:
        both = [k for k in keys if k in owned and k in tracker.dispatched]
        return {"to_dispatch": percentiles([(tracker.dispatched[k] - sent[k]) * 1e3 for k in both]),
                "to_owner": percentiles([(owned[k] - tracker.dispatched[k]) * 1e3 for k in both])}

    return {
        "sessions": sessions,
        "warmup": {"sessions": len(warm), "seconds": round(len(warm) / rate, 1),
                   "create_live_ms": percentiles([(tracker.claimed[s] - sent[s]) * 1e3 for s in warm
                                                  if s in tracker.claimed]),
                   "push_text_ms": percentiles([(tracker.accepted[(s, 1)] - sent[(s, 1)]) * 1e3 for s in warm
                                                if (s, 1) in tracker.accepted])},
        "create_live_ms": percentiles(create),
        "push_text_ms": percentiles(accept),
        "breakdown_ms": {"create_live": split(ids), "push_text": split(pushes)},
        "events_per_s": round((len(create) + len(accept)) / span, 1),
        "max_consumer_lag": max(lags, default=0),
        "rate_per_s": rate,
        "workers": workers,
        "dispatch_replicas": replicas,
        "claimed": len(create),
        "inputs_accepted": len(accept),
        "inputs_pushed": len(pushes),
        "complete": len(create) == sessions and len(accept) == len(pushes),
        "errors": timed_out,
        # share of one core each role used from the first open to the last acceptance
        "cpu_pct": {role: round(100 * (cpu_last[role] - cpu_first.get(role, 0.0)) / wall, 1)
                    for role in sorted(cpu_last)},
    }


def _spawn_light(fleet: LocalFleet, settings: Settings, worker_id: str, capacity: int) -> None:
    fleet.log_dir.mkdir(parents=True, exist_ok=True)
    with open(fleet.log_dir / f"{worker_id}.log", "ab") as log:
        fleet.procs[worker_id] = subprocess.Popen(
            [sys.executable, "-m", "workers.light", "--worker-id", worker_id, "--capacity",
             str(capacity)], env=child_env(settings), stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL)
