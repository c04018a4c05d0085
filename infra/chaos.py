"""The chaos run: the live system under faults, then an audit of what the topics recorded.

Real broker, real Redis, several workers and dispatch replicas as child processes, the
control processor detecting deaths from missed heartbeats. Faults: a worker SIGSTOPped past
detection and resumed (a stale runtime that is still alive), a worker SIGKILLed, a dispatch
replica SIGKILLed, and worker commands duplicated and delayed (re-published late, so they
also arrive out of order); with ``broker_faults``, a broker leader killed and restarted and
every broker killed and restarted (``infra.broker_faults``); with ``redis_faults`` on a Redis
Cluster, the namespace's master SIGKILLed that many times, each time its replica promoted and
the killed node back as a replica before the next (``infra.redis_cluster``). The audit reads
every chunk and input acknowledgement back, checks every acknowledged input was applied or
refused, and replays control, dispatch and detector to compare with what the run observed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from aiokafka.errors import KafkaError

from schemas.errors import ConfigError, InfraError
from processors.cluster import latest_claims
from schemas.records import (ChunkDone, Claimed, DeadLetter, Frozen, Handoff, InputAccepted, InputPushed,
                             Record, Released, SessionClosed, SessionOpened, WorkerDown, WorkerUp)
from schemas.topics import WORKER_COMMANDS
from streams.config import Settings
from streams.generations import GenerationStore, Keys
from streams.kafka import RecordConsumer, RecordProducer
from streams.topics import ensure_topics

from .broker_faults import BrokerFault, run_broker_faults, unserved_s
from .flow import EventLog
from .local import LocalFleet
from .replay import cluster_summary, cluster_view, detector_signal, replay, session_story

__all__ = ["AUDIT_KEYS", "ChaosConfig", "audit_chunks", "audit_inputs", "refused_inputs", "run_chaos"]


def refused_inputs(letters: list[Any]) -> set[tuple[str, int]]:
    """(session, seq) of inputs a consumer refused with a reason (on ``dead-letters``)."""
    from schemas.codec import decode
    from schemas.errors import SchemaError
    from schemas.records import InputPushed

    out = set()
    for d in letters:
        if d.source_topic.endswith("session-inputs"):
            try:
                rec = decode("session-inputs", d.raw)
            except SchemaError:
                continue
            if isinstance(rec, InputPushed):
                out.add((rec.session_id, rec.seq))
    return out


ROOM_SETTLE_S = 12.0  # after the closes that make room: recovery's bound (5 s), the settle window (5 s), slack


@dataclass(frozen=True)
class ChaosConfig:
    sessions: int = 12
    duration_s: float = 40.0
    workers: int = 4
    dispatchers: int = 2
    capacity: int = 8
    chunk_interval_s: float = 0.1
    input_every_s: float = 1.0
    heartbeat_timeout_s: float = 3.0
    duplicate_fraction: float = 0.1
    seed: int = 0
    process_faults: bool = True  # pause a worker, kill a worker, kill a dispatch replica
    broker_faults: tuple[str, ...] = ()  # of broker_faults.KINDS: leader_kill (3+ brokers), full_restart
    outage_s: float = 0.0  # how long every broker stays down in the full restart
    redis_faults: int = 0  # SIGKILL the namespace's Redis master this many times (a cluster)
    migrate_every_s: float = 0.0  # > 0: an operator Handoff of a random session this often

    def __post_init__(self) -> None:
        slots = self.workers * self.capacity
        if self.sessions > slots:  # the run would audit a fleet too small, not the faults
            need = -(-self.sessions // self.capacity)
            raise ConfigError("--sessions", f"{self.sessions} sessions do not fit {self.workers} workers "
                              f"of {self.capacity} slots ({slots}); start --workers {need} or more", "chaos")


def audit_chunks(chunks: list[ChunkDone]) -> dict[str, Any]:
    """Dual-owner releases (one session and chunk index released by two generations) and stale
    releases (an older generation releasing an index past one a newer generation released)."""
    owners: dict[tuple[str, int], set[int]] = defaultdict(set)
    first_of: dict[tuple[str, int], int] = {}
    last_of: dict[tuple[str, int], int] = {}
    for c in chunks:
        owners[(c.session_id, c.chunk_index)].add(c.generation.epoch)
        key = (c.session_id, c.generation.epoch)
        first_of[key] = min(first_of.get(key, c.chunk_index), c.chunk_index)
        last_of[key] = max(last_of.get(key, c.chunk_index), c.chunk_index)
    dual = sum(1 for epochs in owners.values() if len(epochs) > 1)
    stale = 0
    by_session: dict[str, list[int]] = defaultdict(list)
    for sid, epoch in last_of:
        by_session[sid].append(epoch)
    for sid, epochs in by_session.items():
        epochs.sort()
        for i, old in enumerate(epochs):
            for new in epochs[i + 1:]:
                if last_of[(sid, old)] >= first_of[(sid, new)]:
                    stale += 1
    return {"dual_owner": dual, "stale_releases": stale}


def lost_inputs(pushed: dict[str, int], accepted: list[InputAccepted],
                refused: set[tuple[str, int]] = frozenset()) -> list[tuple[str, int]]:  # type: ignore[assignment]
    """(session, seq) of the inputs pushed (seq 1..n per session), never applied and not
    refused with a reason."""
    seen: dict[str, set[int]] = defaultdict(set)
    for sid, seq in refused:
        seen[sid].add(seq)
    for a in accepted:
        seen[a.session_id].add(a.seq)
    return sorted((sid, q) for sid, n in pushed.items() for q in range(1, n + 1) if q not in seen[sid])


def audit_inputs(pushed: dict[str, int], accepted: list[InputAccepted],
                 refused: set[tuple[str, int]] = frozenset()) -> dict[str, int]:  # type: ignore[assignment]
    """Inputs lost (pushed, never applied and not refused with a reason), duplicated (applied
    twice by one generation) and out of order (one generation applied them not in seq order)."""
    per_gen: dict[tuple[str, int], list[int]] = defaultdict(list)
    for a in accepted:
        per_gen[(a.session_id, a.generation.epoch)].append(a.seq)
    lost = len(lost_inputs(pushed, accepted, refused))
    dup = sum(len(v) - len(set(v)) for v in per_gen.values())
    disorder = sum(1 for v in per_gen.values() if v != sorted(v))
    return {"inputs_lost": lost, "inputs_duplicated": dup, "inputs_out_of_order": disorder}


def unserved_until(chunks: list[ChunkDone], start: float, end: float, ids: Iterable[str] = (),
                   settle_s: float = 5.0) -> tuple[float, list[str]]:
    """The longest time any session went without a released chunk between ``start`` and
    ``end``, until it was served again or ``end`` came, and the sessions not served in the
    last ``settle_s`` before ``end`` (never recovered)."""
    wanted = set(ids)
    times: dict[str, list[float]] = {sid: [] for sid in wanted}
    for c in chunks:
        if not wanted or c.session_id in wanted:
            times.setdefault(c.session_id, []).append(c.ts)
    worst, never = 0.0, []
    for sid, ts in sorted(times.items()):
        ts = sorted(t for t in ts if start <= t <= end)
        edges = [start, *ts, end]
        worst = max(worst, max(b - a for a, b in zip(edges, edges[1:])))
        if end - max(ts, default=start) > settle_s:
            never.append(sid)
    return worst, never


async def _duplicator(settings: Settings, producer: RecordProducer, fraction: float,
                      rng: random.Random, stop: asyncio.Event, counts: dict[str, int]) -> None:
    """Re-publish a fraction of worker commands 0.2-2 s later: duplicates, delayed and reordered."""
    consumer = RecordConsumer(settings, [WORKER_COMMANDS], producer, name="chaos-duplicator")
    await consumer.start(subscribe=False)
    await consumer.assign({WORKER_COMMANDS: None}, "end")
    pending: list[asyncio.Task[Any]] = []

    async def later(rec: Record, delay: float) -> None:
        await asyncio.sleep(delay)
        await producer.send(rec)
        counts["commands_duplicated"] += 1

    try:
        while not stop.is_set():
            for d in await consumer.poll(timeout_ms=100):
                if rng.random() < fraction:
                    pending.append(asyncio.create_task(later(d.record, rng.uniform(0.2, 2.0))))
    finally:
        for t in pending:
            t.cancel()
        await consumer.stop()


async def _migrate(producer: RecordProducer, log: EventLog, ids: list[str], workers: list[str],
                   every_s: float, rng: random.Random, stop: asyncio.Event, counts: dict[str, int]) -> None:
    """Every ``every_s``, hand a random session over from its latest claimed owner to another
    worker (any: one paused, killed or full makes dispatch keep it where it is)."""
    while not stop.is_set():
        await asyncio.sleep(every_s)
        claims = {sid: c for sid, c in latest_claims(log.records).items() if sid in ids}
        if not claims:
            continue
        claim = claims[rng.choice(sorted(claims))]
        target = rng.choice([w for w in workers if w != claim.worker_id])
        await _send_until_acked(producer, Handoff(worker_id=claim.worker_id, session_id=claim.session_id,
                                                  generation=claim.generation, target_worker=target,
                                                  ts=time.time(), reason="chaos"))
        counts["handoffs_sent"] += 1


async def _sample_overshoots(store: GenerationStore, stop: asyncio.Event, counts: dict[str, int]) -> None:
    while not stop.is_set():
        for load in (await store.load_view()).values():
            if load.used > load.capacity:
                counts["overshoots"] += 1
        await asyncio.sleep(0.2)


async def _push_inputs(producer: RecordProducer, ids: list[str], every_s: float, stop: asyncio.Event,
                       pushed: dict[str, int], acked: set[tuple[str, int]],
                       closed: set[str] = frozenset()) -> None:  # type: ignore[assignment]
    """One input per open session every ``every_s``. An input counts as acknowledged when the
    send returned; a failed send is retried with the same seq (a gap would stall the session)."""
    next_at = time.monotonic()
    while not stop.is_set():
        for sid in [i for i in ids if i not in closed]:
            rec = InputPushed(session_id=sid, seq=pushed[sid] + 1, kind="text",
                              payload=f"steer {pushed[sid] + 1}", ts=time.time())
            await _send_until_acked(producer, rec)
            pushed[sid] = rec.seq
            acked.add((sid, rec.seq))
        next_at += every_s
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))


async def _send_until_acked(producer: RecordProducer, rec: Record) -> None:
    while True:
        try:
            await producer.send(rec)
            return
        except KafkaError:
            await asyncio.sleep(0.5)


def _process_plan(config: ChaosConfig) -> list[tuple[float, str]]:
    """Pause a worker, kill another, kill a dispatch replica; when the sessions outnumber the
    slots left after the kill, close the excess late in the run (the closes make room)."""
    if not config.process_faults:
        return []
    plan = [(0.15, "pause"), (0.45, "kill_worker"), (0.6, "kill_dispatch")]
    if config.sessions > (config.workers - 1) * config.capacity:
        plan.append((0.85, "make_room"))  # after the dispatch failover (session timeout 6 s)
    return plan


def redis_kill_times(config: ChaosConfig) -> list[float]:
    """When to kill the namespace's Redis master, as fractions of the run: spread over 10-85%
    of it, the one nearest the worker kill moved to half a second after it, so the slot is
    down while the control processor declares that worker dead and its sessions' recovery
    commits are made; 30% for a single kill without process faults."""
    n = config.redis_faults
    at = [0.1 + 0.75 * k / (n - 1) for k in range(n)] if n > 1 else [0.3] * n
    if config.process_faults and n:
        recovery = 0.45 + 0.5 / config.duration_s
        at[min(range(n), key=lambda k: abs(at[k] - recovery))] = recovery
    return sorted(at)


async def _redis_faults(cluster: Any, key: str, fractions: list[float], duration_s: float, t0: float,
                        events: list[dict[str, Any]], progress: Callable[[str], None],
                        settle_s: float = 2.0) -> None:
    """Kill the master of ``key``'s slot at each fraction of the run from monotonic ``t0``, each
    once the node killed before is back as a replica and ``settle_s`` has passed (longer than
    the store's one-second view of the replicas); each failover is appended to ``events``."""
    from .redis_cluster import fail_over_master

    ready = t0
    for i, frac in enumerate(fractions):
        await asyncio.sleep(max(0.0, t0 + frac * duration_s - time.monotonic(), ready - time.monotonic()))
        progress(f"SIGKILL the namespace's Redis master ({i + 1}/{len(fractions)})")
        start = time.time()
        event = await asyncio.to_thread(fail_over_master, cluster, key)
        events.append({**event, "start": start, "end": time.time()})
        ready = time.monotonic() + settle_s


def unserved_across(times: dict[str, list[float]], at: float, end: float) -> float:
    """The longest any session went without a chunk across ``at``: from its last chunk before
    ``at`` to its first after (``end`` if none came)."""
    worst = 0.0
    for ts in times.values():
        before = max((t for t in ts if t <= at), default=at)
        worst = max(worst, min((t for t in ts if t > at), default=end) - before)
    return round(worst, 3)


def _redis_summary(settings: Settings, cluster: Any, events: list[dict[str, Any]],
                   times: dict[str, list[float]], downs: list[WorkerDown], t0: float, end: float) -> dict[str, Any]:
    """The cluster, its failovers, and per failover: the longest time a session went unserved
    across the kill, and the workers declared dead while the slot failed over (their sessions'
    recovery commits were made through the failover)."""
    out = [{"at_s": round(e["start"] - t0, 1), "killed": e["killed"], "promoted": e["promoted"],
            "promoted_s": e["promoted_s"], "rejoined_s": e["rejoined_s"],
            "unserved_s": unserved_across(times, e["start"], end),
            "declared_down": sorted(d.worker_id for d in downs if e["start"] <= d.ts <= e["end"])}
           for e in events]
    return {"masters": cluster.masters, "replicas": cluster.masters * cluster.replicas,
            "failovers": len(events), "replica_ack": settings.redis.acks > 0, "replica_acks": settings.redis.acks,
            "longest_unserved_s": max((e["unserved_s"] for e in out), default=0.0), "events": out}


async def run_chaos(settings: Settings, config: ChaosConfig, log_dir: Path,
                    progress: Callable[[str], None] = lambda _m: None,
                    broker: Any = None, redis_cluster: Any = None) -> dict[str, Any]:
    """Run the faults against a live fleet and return the audit (see module docstring).

    ``broker`` is the ``EmbeddedKafka`` the run may kill (``config.broker_faults``);
    ``redis_cluster`` the ``EmbeddedRedisCluster`` whose namespace master it kills
    ``config.redis_faults`` times (the audit then has ``redis``)."""
    if config.broker_faults and not hasattr(broker, "kill_all"):
        raise InfraError("broker faults need the embedded Apache Kafka (not a configured cluster or Tansu)")
    if config.redis_faults and (redis_cluster is None or settings.redis.cluster != "on"):
        raise InfraError("a Redis failover needs the embedded Redis Cluster (chaos --redis-cluster)")
    rng = random.Random(config.seed)
    started = time.monotonic()
    await ensure_topics(settings)
    fleet = LocalFleet(settings, log_dir, extra_env={
        "CHUNKSERVE_POLICY": "base", "CHUNKSERVE_CONTROL_PERIOD_S": "1",
        "CHUNKSERVE_HEARTBEAT_TIMEOUT_S": str(config.heartbeat_timeout_s)})
    counts: dict[str, int] = defaultdict(int)
    faults: dict[str, Any] = {}
    broker_faults: list[BrokerFault] = []
    redis_events: list[dict[str, Any]] = []
    pushed: dict[str, int] = defaultdict(int)
    acked: set[tuple[str, int]] = set()
    session_events: list[Record] = []
    stop, stop_inputs = asyncio.Event(), asyncio.Event()
    store = GenerationStore.from_settings(settings)
    try:
        for i in range(config.dispatchers):
            fleet.start_processor("dispatch", replica=str(i))
        fleet.start_processor("control")
        workers = [f"worker-{i}" for i in range(config.workers)]
        for w in workers:
            fleet.start_worker(w, capacity=config.capacity, chunk_interval_s=config.chunk_interval_s)
        async with RecordProducer(settings, client_id="chaos") as producer, EventLog(settings, producer) as log:
            progress(f"waiting for {config.workers} workers")
            await log.until(lambda rs: len({r.worker_id for r in rs if isinstance(r, WorkerUp)})
                            >= config.workers, 120, "workers to come up", fleet.failed)
            ids = [f"chaos-{i}" for i in range(config.sessions)]
            for sid in ids:
                session_events.append(SessionOpened(session_id=sid, ts=time.time(), prompt=f"chaos {sid}"))
                await _send_until_acked(producer, session_events[-1])
            await log.until(lambda rs: {r.session_id for r in rs if isinstance(r, Claimed)} >= set(ids),
                            60, "every session to be claimed", fleet.failed)
            helpers = [asyncio.create_task(_duplicator(settings, producer, config.duplicate_fraction,
                                                        rng, stop, counts)),
                       asyncio.create_task(_sample_overshoots(store, stop, counts))]
            if config.migrate_every_s > 0:
                helpers.append(asyncio.create_task(_migrate(producer, log, ids, workers, config.migrate_every_s,
                                                            random.Random(config.seed + 1), stop_inputs, counts)))
            closed_early: set[str] = set()
            inputs = asyncio.create_task(_push_inputs(producer, ids, config.input_every_s, stop_inputs,
                                                      pushed, acked, closed_early))
            t0 = time.time()
            run_start = time.monotonic()
            breaking = (asyncio.create_task(run_broker_faults(
                settings, broker, config.duration_s, run_start, broker_faults, config.broker_faults,
                outage_s=config.outage_s, progress=progress))
                if config.broker_faults else None)
            failing = (asyncio.create_task(_redis_faults(
                redis_cluster, Keys(settings.namespace).workers, redis_kill_times(config), config.duration_s,
                run_start, redis_events, progress)) if config.redis_faults else None)
            plan = _process_plan(config)
            run_end = run_start + config.duration_s
            paused: tuple[str, float] | None = None
            while time.monotonic() < run_end or any(t is not None and not t.done() for t in (breaking, failing)):
                frac = (time.monotonic() - run_start) / config.duration_s
                while plan and frac >= plan[0][0]:
                    _, kind = plan.pop(0)
                    owners = _owners(log.records)
                    if kind == "pause":
                        victim = _busiest(owners, workers)
                        fleet.procs[victim].send_signal(signal.SIGSTOP)
                        paused = (victim, time.monotonic() + config.heartbeat_timeout_s + 3)
                        faults["paused_worker"] = victim
                        progress(f"SIGSTOP {victim}")
                    elif kind == "kill_worker":
                        victim = _busiest(owners, [w for w in workers if w != faults.get("paused_worker")])
                        fleet.kill(victim)
                        faults["killed_worker"] = victim
                        progress(f"SIGKILL {victim}")
                    elif kind == "make_room":
                        excess = config.sessions - (config.workers - 1) * config.capacity
                        closed_early |= set(ids[-excess:])
                        faults["room_made_at_s"] = round(time.time() - t0, 1)
                        for sid in ids[-excess:]:
                            session_events.append(SessionClosed(session_id=sid, ts=time.time()))
                            await _send_until_acked(producer, session_events[-1])
                        progress(f"closed {excess} sessions to make room")
                        # the waiting sessions are judged over the last settle window before the
                        # closes at the end: leave room for recovery (bound 5 s) and that window
                        run_end = max(run_end, time.monotonic() + ROOM_SETTLE_S)
                    else:
                        fleet.kill("dispatch-0")
                        faults["killed_dispatch"] = "dispatch-0"
                        progress("SIGKILL dispatch-0")
                if paused and time.monotonic() >= paused[1]:
                    fleet.procs[paused[0]].send_signal(signal.SIGCONT)
                    progress(f"SIGCONT {paused[0]}")
                    paused = None
                await log.pump(timeout_ms=50)
            for task in (breaking, failing):
                if task is not None:
                    await task  # raises what went wrong with the cluster
            stop_inputs.set()
            await inputs
            t1 = time.time()
            progress("draining: waiting for every input to be applied")
            with contextlib.suppress(InfraError):  # what is missing is counted below
                await log.until(lambda rs: _unresolved(acked, rs) == 0, 60, "inputs to be applied")
            stop.set()
            await asyncio.gather(*helpers, return_exceptions=True)
            t_close = time.time()
            for sid in [i for i in ids if i not in closed_early]:
                session_events.append(SessionClosed(session_id=sid, ts=time.time()))
                await _send_until_acked(producer, session_events[-1])
            closed_but_active = await _until_closed(store, log, ids, 60.0)
            views = await _compare_replay(settings, session_events, log.records, ids)
        chunks = [c for c in log.of(ChunkDone) if c.session_id in ids]
        unaccounted = _unresolved_inputs({(sid, q) for sid, n in pushed.items() for q in range(1, n + 1)},
                                         log.records)
        still_open = [sid for sid in ids if sid not in closed_early]
        longest, never = unserved_until([c for c in chunks if c.session_id in still_open], t0, t_close, still_open)
        room_at = t0 + faults["room_made_at_s"] if "room_made_at_s" in faults else None
        times: dict[str, list[float]] = defaultdict(list)
        for c in chunks:
            times[c.session_id].append(c.ts)
        result: dict[str, Any] = {
            "broker": broker.describe() if broker is not None else {
                "kind": "configured", "version": None, "brokers": len(settings.kafka.bootstrap.split(","))},
            "sessions": config.sessions,
            "chunks": len(chunks),
            "faults": {**faults, "commands_duplicated": counts["commands_duplicated"],
                       "declared_down": {r.worker_id: round(r.ts - t0, 1) for r in log.of(WorkerDown)
                                         if r.reason == "missed heartbeats"}},
            "broker_faults": _broker_fault_summary(broker_faults, times, t0),
            **({"redis": _redis_summary(settings, redis_cluster, redis_events,
                                        {sid: times[sid] for sid in still_open}, log.of(WorkerDown), t0, t_close)}
               if redis_cluster is not None else {}),
            **audit_chunks(chunks),
            "overshoots": counts["overshoots"],
            **audit_inputs(pushed, log.of(InputAccepted), refused_inputs(log.of(DeadLetter))),
            "inputs_pushed": sum(pushed.values()),
            "acked_inputs_lost": _unresolved(acked, log.records),
            "inputs_unaccounted": len(unaccounted),
            "inputs_unaccounted_sample": [f"{sid}#{seq}" for sid, seq in sorted(unaccounted)[:20]],
            "never_recovered": len(never),
            "never_recovered_sessions": never[:20],
            "never_recovered_story": {sid: session_story(log.records, sid, t0) for sid in never[:3]},
            "closed_but_active": len(closed_but_active),
            "replay_mismatches": len(views),
            "replay_mismatch_sample": views[:10],
            "fenced_releases": sum(1 for r in log.of(Released) if r.reason == "fenced"),
            "migrations": _migrations(counts["handoffs_sent"], log.records),
            "recovered_sessions": len({c.session_id for c in log.of(Claimed) if c.generation.epoch > 1}),
            "max_recovery_s": round(longest, 3),
            "push_phase_s": round(t1 - t0, 1),
            "served_after_room_s": (None if room_at is None
                                    else round(served_after(chunks, still_open, room_at), 3)),
            "wall_s": round(time.monotonic() - started, 1),
        }
        return result
    finally:
        stop.set()
        stop_inputs.set()
        fleet.stop_all()
        await store.aclose()


AUDIT_KEYS = ("dual_owner", "stale_releases", "overshoots", "inputs_lost", "inputs_duplicated",
              "inputs_out_of_order", "acked_inputs_lost", "inputs_unaccounted", "never_recovered",
              "closed_but_active", "replay_mismatches")


def unclean(result: dict[str, Any]) -> str:
    """A run's failed audits with their samples and stories, and its faults, as one JSON line
    (whole: a test's assertion shows it, where pytest cuts a long repr short)."""
    told = {k: v for k, v in result.items()
            if (k in AUDIT_KEYS and v) or k.endswith(("_sample", "_sessions", "_story")) or k == "faults"}
    return json.dumps(told, default=str)


def _unresolved(acked: set[tuple[str, int]], records: list[Record]) -> int:
    """Acknowledged inputs that no owner accepted and no consumer refused with a reason."""
    return len(_unresolved_inputs(acked, records))


def _unresolved_inputs(acked: set[tuple[str, int]], records: list[Record]) -> set[tuple[str, int]]:
    done = {(r.session_id, r.seq) for r in records if isinstance(r, InputAccepted)}
    done |= refused_inputs([r for r in records if isinstance(r, DeadLetter)])
    return acked - done


def served_after(chunks: list[ChunkDone], ids: list[str], at: float, quiet_s: float = 1.0) -> float:
    """For the sessions unserved for ``quiet_s`` before ``at`` (waiting for a slot), the
    longest time from ``at`` to their next chunk (until the last chunk seen if never)."""
    end = max((c.ts for c in chunks), default=at)
    worst = 0.0
    for sid in ids:
        ts = sorted(c.ts for c in chunks if c.session_id == sid)
        if any(at - quiet_s <= t <= at for t in ts):
            continue
        worst = max(worst, next((t for t in ts if t > at), end) - at)
    return worst


async def _until_closed(store: GenerationStore, log: EventLog, ids: list[str], timeout_s: float) -> list[str]:
    """Wait until the store shows every session closed (by its owner, or by recovery when its
    owner was lost); the ones still not closed at the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        await log.pump(timeout_ms=200)
        left = [sid for sid in ids if (v := await store.session(sid)) is not None and v.state != "closed"]
        if not left or time.monotonic() > deadline:
            break
    # an owner's Released follows its store write: read on until the log has one for every
    # session its owner closed (not the ones recovery closed: their owner was lost)
    owned = {sid: v.generation for sid in ids if (v := await store.session(sid)) is not None
             and v.claimed and v.stranded_epoch != v.generation.epoch}
    stop_at = time.monotonic() + 10.0
    while time.monotonic() < stop_at:
        released = {(r.session_id, r.generation) for r in log.of(Released) if r.reason == "closed"}
        if all((sid, gen) in released for sid, gen in owned.items()):
            break
        await log.pump(timeout_ms=200)
    return left


def _broker_fault_summary(faults: list[BrokerFault], times: dict[str, list[float]],
                          t0: float) -> dict[str, Any]:
    out: dict[str, Any] = {"leader_kills": sum(f.kind == "leader_kill" for f in faults),
                           "full_restarts": sum(f.kind == "full_restart" for f in faults)}
    if faults:
        out["events"] = [{"kind": f.kind, "nodes": f.nodes, "at_s": round(f.start - t0, 1),
                          "back_s": round((f.end or f.start) - t0, 1), "restart_s": f.restart_s,
                          "unserved_s": unserved_s(times, f.start, f.end or f.start),
                          "served_after": sum(max(ts, default=0.0) > (f.end or f.start) for ts in times.values()),
                          **f.extra}
                         for f in faults]
    return out


async def _compare_replay(settings: Settings, session_events: list[Record], observed: list[Record],
                          ids: list[str]) -> list[str]:
    """Replay control, dispatch and detector from the topics and list where they differ from
    what this run observed: the sessions' states and owners and the workers as the worker
    events it read live (with the session events it had acknowledged), and the detector's
    signal over those acknowledged events."""
    seen = cluster_summary(cluster_view(session_events + [r for r in observed if r.TAG.startswith("worker.")]))
    mismatches = []
    for processor in ("control", "dispatch"):
        got = await replay(settings, processor)
        mismatches += [f"{processor}: session {sid}: replayed {got['sessions'].get(sid)}, "
                       f"observed {seen['sessions'].get(sid)}"
                       for sid in ids if got["sessions"].get(sid) != seen["sessions"].get(sid)]
        mismatches += [f"{processor}: worker {w}: replayed {got['workers'].get(w)}, observed {v}"
                       for w, v in seen["workers"].items() if got["workers"].get(w) != v]
    got = await replay(settings, "detector")
    if got["signal"] != detector_signal(session_events):
        mismatches.append("detector: signal differs")
    return mismatches


def _migrations(sent: int, records: list[Record]) -> dict[str, int]:
    """Handoffs sent, sessions frozen for one (per generation), moved (the source released
    it as migrated) and kept (frozen, then resumed where it was or recovered elsewhere)."""
    frozen = {(r.session_id, r.generation) for r in records if isinstance(r, Frozen)}
    moved = {(r.session_id, r.generation) for r in records if isinstance(r, Released) and r.reason == "migrated"}
    return {"handoffs_sent": sent, "frozen": len(frozen), "moved": len(moved), "kept": len(frozen - moved)}


def _owners(records: list[Record]) -> dict[str, str]:
    return {sid: c.worker_id for sid, c in latest_claims(records).items()}


def _busiest(owners: dict[str, str], candidates: list[str]) -> str:
    load = {w: 0 for w in candidates}
    for w in owners.values():
        if w in load:
            load[w] += 1
    return max(sorted(load), key=lambda w: load[w])
