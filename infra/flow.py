"""Sessions end to end through the real pipeline, and the audit of what came out.

Publishes sessions with ``SessionClient``, lets the dispatch processor and workers (child
processes) serve them, then reads ``worker-events``, ``metrics`` and ``dead-letters`` back
and checks every chunk: indices in order from 0, released under one generation, and each
session released on close. The demo and the end-to-end test both run this.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from processors.cluster import latest_claims
from schemas.records import (ChunkDone, Claimed, CommandRejected, DeadLetter, Drain,
                             Heartbeat, InputAccepted, Record, Released, Shutdown, WorkerUp)
from schemas.topics import (DEAD_LETTERS, METRICS, SCALING_COMMANDS, SESSION_EVENTS, SESSION_INPUTS,
                            WORKER_EVENTS)
from schemas.errors import InfraError
from streams.client import SessionClient
from streams.config import Settings
from streams.kafka import RecordConsumer, RecordProducer
from streams.topics import ensure_topics

from .local import LocalFleet

__all__ = ["FlowSummary", "EventLog", "run_flow"]


@dataclass
class FlowSummary:
    """What the audit of one run found."""

    workers: int
    sessions: int
    chunks: int
    chunk_indices: dict[str, list[int]]
    generations: dict[str, list[str]]
    checksums: dict[str, list[str]]  # per session, in the order of ``chunk_indices``
    released: dict[str, str]
    inputs_accepted: dict[str, list[int]]
    inputs_reapplied: int
    metrics_records: int
    dead_letters: int
    rejected: int
    chunk_latency_ms_p50: float
    chunk_latency_ms_max: float
    wall_s: float
    problems: list[str] = field(default_factory=list)
    letters: list[DeadLetter] = field(default_factory=list)
    missing: dict[str, list[int]] = field(default_factory=dict)
    # "drain <worker>" / "shutdown <worker>" in log order (runs that read scaling-commands)
    scaling: list[str] = field(default_factory=list)

    def unserved(self, min_chunks: int, inputs: list[int]) -> list[str]:
        """Sessions not served in full: chunk indices not 0..n-1 or fewer than ``min_chunks``,
        inputs applied other than ``inputs``, or not released on close."""
        return [sid for sid, indices in self.chunk_indices.items()
                if indices != list(range(len(indices))) or len(indices) < min_chunks
                or self.inputs_accepted.get(sid) != inputs or self.released.get(sid) != "closed"]

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["letters"] = [{"source_topic": d.source_topic, "offset": d.offset, "reason": d.reason,
                           "consumer": d.consumer} for d in self.letters]
        return out


class EventLog:
    """Reads worker events, metrics and dead letters from the start, without a group."""

    def __init__(self, settings: Settings, producer: RecordProducer,
                 topics: tuple[str, ...] = (WORKER_EVENTS, METRICS, DEAD_LETTERS)) -> None:
        self.settings = settings
        self.topics = topics
        self.consumer = RecordConsumer(settings, list(topics), producer, name="flow-audit")
        self.records: list[Record] = []

    async def start(self) -> None:
        await self.consumer.start(subscribe=False)
        await self.consumer.assign(dict.fromkeys(self.topics))

    async def __aenter__(self) -> "EventLog":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()  # also when the run is cancelled (Ctrl-C, SIGTERM): no consumer left unclosed

    async def pump(self, timeout_ms: int = 100) -> None:
        self.records.extend(d.record for d in await self.consumer.poll(timeout_ms=timeout_ms))

    async def until(self, done: Callable[[list[Record]], bool], timeout_s: float, what: str,
                    failed: Callable[[], str | None] = lambda: None) -> None:
        """Read on until ``done``; give up at the timeout, or as soon as ``failed`` says why
        waiting is pointless (a child process that exited, ``LocalFleet.failed``)."""
        deadline = time.monotonic() + timeout_s
        while not done(self.records):
            if (why := failed()) is not None:
                raise InfraError(f"{why} (while waiting for {what})")
            if time.monotonic() > deadline:
                letters = self.of(DeadLetter)
                seen = (f"; {len(letters)} dead letters, the last from {letters[-1].consumer}: "
                        f"{letters[-1].reason[:200]}" if letters else "")
                raise InfraError(f"timed out after {timeout_s:.0f}s waiting for {what}{seen}")
            await self.pump()

    def of(self, cls: type) -> list[Any]:
        return [r for r in self.records if isinstance(r, cls)]

    async def stop(self) -> None:
        await self.consumer.stop()


def audit(log: EventLog, session_ids: list[str], workers: int, wall_s: float,
          allow_gaps: bool = False) -> FlowSummary:
    """Check every session's chunks: indices 0..n-1 with no gap or repeat across all its
    generations, epochs never going back (no stale release), last release on close.

    ``allow_gaps`` (runs with a crash): a worker killed between recording a batch's release
    in Redis and publishing it loses that batch's outputs — outputs are at-most-once across a
    crash, never duplicated — so missing indices are counted in ``missing`` instead."""
    chunks = [c for c in log.of(ChunkDone) if c.session_id in session_ids]
    indices: dict[str, list[int]] = defaultdict(list)
    sums: dict[str, list[str]] = defaultdict(list)
    gens: dict[str, set[str]] = defaultdict(set)
    for c in sorted(chunks, key=lambda c: (c.generation.epoch, c.chunk_index)):
        indices[c.session_id].append(c.chunk_index)
        sums[c.session_id].append(c.checksum)
        gens[c.session_id].add(str(c.generation))
    released: dict[str, str] = {}
    for r in sorted(log.of(Released), key=lambda r: r.generation.epoch):
        if r.session_id in session_ids:
            released[r.session_id] = r.reason
    accepted: dict[str, list[int]] = defaultdict(list)
    by_gen: dict[tuple[str, str], list[int]] = defaultdict(list)
    for a in log.of(InputAccepted):
        accepted[a.session_id].append(a.seq)
        by_gen[(a.session_id, str(a.generation))].append(a.seq)
    problems = []
    missing: dict[str, list[int]] = {}
    for sid in session_ids:
        got = indices[sid]
        if got != sorted(set(got)):
            problems.append(f"{sid}: chunk indices repeated or out of order: {got[:40]}")
        missing[sid] = sorted(set(range(max(got) + 1 if got else 0)) - set(got))
        if missing[sid] and not allow_gaps:
            problems.append(f"{sid}: chunk indices missing across generations: {missing[sid][:20]}")
        if released.get(sid) != "closed":
            problems.append(f"{sid}: not released on close ({released.get(sid)})")
        seqs = sorted(set(accepted[sid]))
        if seqs != list(range(1, len(seqs) + 1)):
            problems.append(f"{sid}: inputs lost: applied {seqs}")
        for (s_id, gen), got in by_gen.items():  # within one owner: once each, in order
            if s_id == sid and got != sorted(set(got)):
                problems.append(f"{sid}: inputs out of order or twice under {gen}: {got}")
    lat = [c.latency_s * 1000 for c in chunks] or [0.0]
    return FlowSummary(
        workers=workers, sessions=len(session_ids), chunks=len(chunks),
        chunk_indices=dict(indices), generations={k: sorted(v) for k, v in gens.items()},
        checksums=dict(sums), released=released, inputs_accepted={k: sorted(set(v)) for k, v in accepted.items()},
        inputs_reapplied=sum(len(v) - len(set(v)) for v in accepted.values()),
        metrics_records=sum(1 for r in log.records if r.TAG.startswith("metric.")),
        dead_letters=len(log.of(DeadLetter)), rejected=len(log.of(CommandRejected)),
        chunk_latency_ms_p50=statistics.median(lat), chunk_latency_ms_max=max(lat),
        wall_s=wall_s, problems=problems, letters=log.of(DeadLetter), missing=missing,
        scaling=[f"{'drain' if isinstance(r, Drain) else 'shutdown'} {r.worker_id}"
                 for r in log.records if isinstance(r, (Drain, Shutdown))])


def _count(rs: list[Record], cls: type, **match: Any) -> int:
    return sum(1 for r in rs if isinstance(r, cls) and all(getattr(r, k) == v for k, v in match.items()))


def _owners(rs: list[Record], ids: list[str]) -> dict[str, Claimed]:
    """Each session's latest claim (highest epoch)."""
    return {sid: c for sid, c in latest_claims(rs).items() if sid in ids}


async def _move(settings: Settings, log: EventLog, claim: Claimed, workers: int, timeout_s: float) -> None:
    """An operator's handoff (``chunkserve handoff``) of ``claim``'s session to another of the
    ``workers`` workers; returns once it is claimed there."""
    from .handoff import hand_off

    target = next(f"worker-{i}" for i in range(workers) if f"worker-{i}" != claim.worker_id)
    moved = await hand_off(settings, claim.session_id, target, wait_s=timeout_s)
    if not moved["moved"]:
        raise InfraError(f"the operator's handoff of {claim.session_id} to {target} did not move it: {moved}")
    await log.until(lambda rs: any(
        isinstance(r, Claimed) and r.session_id == claim.session_id and r.worker_id == target
        and r.generation.epoch > claim.generation.epoch for r in rs), timeout_s,
        "the migrated session to be claimed by its target")


def _chunks_of(rs: list[Record], ids: list[str]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for r in rs:
        if isinstance(r, ChunkDone) and r.session_id in ids:
            counts[r.session_id] += 1
    return counts


async def run_flow(settings: Settings, log_dir: Path, sessions: int = 3, chunks: int = 8,
                   workers: int = 2, inputs: int = 2, capacity: int = 8,
                   chunk_interval_s: float = 0.05, timeout_s: float = 120.0, garbage: int = 0,
                   flips: bool = False, handoff: bool = False, crash: bool = False,
                   restart_dispatch: bool = False, rebalance: bool = False, scale_in: bool = False,
                   progress: Callable[[str], None] = lambda _m: None,
                   role_env: dict[str, dict[str, str]] | None = None,
                   client_settings: Settings | None = None) -> FlowSummary:
    """Start a dispatch replica and ``workers`` workers, serve ``sessions``, audit, stop.

    ``role_env`` gives each child role its own variables (``LocalFleet.role_env``: its SASL
    principal, say); ``client_settings`` are the session producer's (default ``settings``,
    which the audit and the operator's moves use)."""
    started = time.monotonic()
    await ensure_topics(settings)
    fleet = LocalFleet(settings, log_dir, role_env=dict(role_env or {}))
    try:
        fleet.start_processor("dispatch")
        if crash:  # the control processor detects the crash from missed heartbeats
            fleet.extra_env = {"CHUNKSERVE_POLICY": "base", "CHUNKSERVE_HEARTBEAT_TIMEOUT_S": "3",
                               "CHUNKSERVE_CONTROL_PERIOD_S": "1"}
            fleet.start_processor("control")
        # rebalance: every session lands on worker-0; the rest join later and control spreads them
        gpu_type = "h20" if rebalance else "cpu"  # the rebalance run uses the paper's profile
        for i in range(1 if rebalance else workers):
            fleet.start_worker(f"worker-{i}", capacity=capacity, chunk_interval_s=chunk_interval_s,
                               gpu_type=gpu_type)
        topics = (WORKER_EVENTS, METRICS, DEAD_LETTERS) + ((SCALING_COMMANDS,) if scale_in else ())
        async with RecordProducer(settings, client_id="flow") as producer, EventLog(settings, producer, topics) as log:
            try:
                progress(f"waiting for {workers} workers to load the model")
                await log.until(lambda rs: len({r.worker_id for r in rs if isinstance(r, WorkerUp)})
                                >= (1 if rebalance else workers), timeout_s, "workers to come up", fleet.failed)
                ids = [f"session-{i}" for i in range(sessions)]
                for n in range(garbage):  # malformed records must be dead-lettered, not fatal
                    topic = SESSION_EVENTS if n % 2 == 0 else SESSION_INPUTS
                    await producer.send_raw(topic, b"\x81\xa1t\xa4nope" + bytes([n % 256]),
                                            key=f"garbage-{n}".encode())
                async with SessionClient(client_settings or settings) as client:
                    for sid in ids:
                        await client.open(sid, prompt=f"a paper boat on a river, take {sid}")
                    for n in range(inputs):
                        for sid in ids:
                            await client.push(sid, f"turn {'left' if n % 2 else 'right'} #{n}")
                    progress(f"{sessions} sessions opened; streaming {chunks} chunks each")

                    def served(rs: list[Record]) -> bool:
                        counts: dict[str, int] = defaultdict(int)
                        acks: dict[str, int] = defaultdict(int)
                        for r in rs:
                            if isinstance(r, ChunkDone):
                                counts[r.session_id] += 1
                            elif isinstance(r, InputAccepted):
                                acks[r.session_id] += 1
                        return all(counts[s] >= chunks and acks[s] >= inputs for s in ids)

                    await log.until(served, timeout_s, "chunks and inputs of every session")
                    if flips:  # idle -> offloaded to Redis, slot freed; active -> restored
                        progress("sessions go idle (offload) and come back (restore)")
                        for sid in ids:
                            await client.idle(sid)
                        await log.until(lambda rs: all(_count(rs, Released, session_id=s,
                                                              reason="suspended") for s in ids),
                                        timeout_s, "sessions to be offloaded")
                        for sid in ids:
                            await client.active(sid)
                        await log.until(lambda rs: all(_count(rs, Claimed, session_id=s) >= 2
                                                       for s in ids), timeout_s, "sessions to be restored")
                    if handoff and workers > 1:  # an operator migrates session 0 at a chunk boundary
                        progress("migrating a session to another worker")
                        await _move(settings, log, _owners(log.records, ids)[ids[0]], workers, timeout_s)
                    if scale_in and workers > 1:  # the load is low: control drains a worker and empties it
                        owners = _owners(log.records, ids)
                        if len({c.worker_id for c in owners.values()}) < 2:  # give each worker a session
                            await _move(settings, log, owners[ids[-1]], workers, timeout_s)
                        progress("the control processor scales in: drain, move the sessions off, shut down")
                        # a floor of one: the default two (N + 1) would keep both workers
                        fleet.extra_env = {"CHUNKSERVE_POLICY": "turboserve", "CHUNKSERVE_BOOT_S": "2",
                                           "CHUNKSERVE_SCALE_DWELL_S": "1", "CHUNKSERVE_BURST_MEMORY_S": "0",
                                           "CHUNKSERVE_CONTROL_PERIOD_S": "1", "CHUNKSERVE_MIN_WORKERS": "1"}
                        fleet.start_processor("control")
                        await log.until(lambda rs: any(isinstance(r, Shutdown) for r in rs), timeout_s,
                                        "a drained worker to be emptied and shut down")
                    pushed = inputs
                    if rebalance:
                        progress("adding workers; the control processor rebalances")
                        for i in range(1, workers):
                            fleet.start_worker(f"worker-{i}", capacity=capacity,
                                               chunk_interval_s=chunk_interval_s, gpu_type=gpu_type)
                        fleet.extra_env = {"CHUNKSERVE_POLICY": "turboserve-no-autoscale",
                                           "CHUNKSERVE_PROFILE": "paper", "CHUNKSERVE_GPU_TYPE": "h20",
                                           "CHUNKSERVE_CONTROL_PERIOD_S": "1"}
                        fleet.start_processor("control")
                        await log.until(lambda rs: any(
                            isinstance(r, Claimed) and r.worker_id != "worker-0" and r.generation.epoch > 1
                            for r in rs), timeout_s, "a session migrated by the rebalancer")
                    if restart_dispatch:  # processors die mid-run; a new one rebuilds from the log
                        progress("killing and restarting the dispatch processor")
                        fleet.kill("dispatch-0")
                        fleet.start_processor("dispatch", replica="1")
                        for sid in ids:
                            await client.push(sid, "after the restart")
                        pushed += 1
                        await log.until(lambda rs: all(_count(rs, InputAccepted, session_id=s, seq=pushed)
                                                       for s in ids), timeout_s, "inputs after the restart")
                    if crash:  # inputs after the last snapshot, then the owner dies
                        for sid in ids:
                            await client.push(sid, "after the snapshot")
                        pushed += 1
                        await log.until(lambda rs: all(_count(rs, InputAccepted, session_id=s, seq=pushed)
                                                       for s in ids), timeout_s, "inputs before the crash")
                        claim = _owners(log.records, ids)[ids[0]]
                        progress(f"killing {claim.worker_id}")
                        fleet.kill(claim.worker_id)
                        await log.until(lambda rs: any(
                            isinstance(r, Claimed) and r.session_id == ids[0]
                            and r.generation.epoch > claim.generation.epoch for r in rs), timeout_s,
                            "the crashed worker's session to be recovered")
                        for sid in ids:
                            await client.push(sid, "after the recovery")
                        pushed += 1
                        await log.until(lambda rs: all(_count(rs, InputAccepted, session_id=s, seq=pushed)
                                                       for s in ids), timeout_s, "inputs after the recovery")
                    if flips or handoff or crash or rebalance or scale_in:
                        before = _chunks_of(log.records, ids)
                        await log.until(lambda rs: all(_chunks_of(rs, ids)[s] >= before[s] + chunks
                                                       for s in ids), timeout_s, "chunks after the moves")
                    for sid in ids:
                        await client.close(sid)
                progress("closing sessions")
                await log.until(lambda rs: all(_count(rs, Released, session_id=s, reason="closed")
                                               for s in ids), timeout_s, "sessions to be released")
                await log.until(lambda rs: sum(isinstance(r, DeadLetter) for r in rs) >= garbage,
                                timeout_s, "malformed records on dead-letters")
                await log.pump(timeout_ms=300)
            except InfraError:
                (log_dir / "events.txt").write_text(
                    "\n".join(repr(r) for r in log.records if not isinstance(r, (ChunkDone, Heartbeat))))
                raise
        return audit(log, ids, workers, time.monotonic() - started, allow_gaps=crash)
    finally:
        fleet.stop_all()


