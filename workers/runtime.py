"""The worker runtime: claims generations, runs coalesced chunks, releases only when current.

One process per device. Commands arrive on the ``worker-commands`` partition the worker id
hashes to (records for other workers are skipped). Every state-advancing step is fenced:
a session is claimed before its first chunk or input, the whole coalesced batch is
revalidated in one round trip before any output is released, and inputs are applied once,
in sequence order. A worker that learns its generation is stale drops the session at once.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

import msgpack

from schemas.errors import ChunkserveError, LimitError, OwnershipError, SnapshotCorruptError
from schemas.records import (Assign, ChunkDone, Claimed, CommandRejected, Generation, Handoff,
                             Heartbeat, InputAccepted, Record, Released, Resume, Revoke,
                             RoutedInput, Suspend, Terminate, WorkerDown, WorkerUp)
from schemas.topics import WORKER_COMMANDS
from streams.config import Settings
from streams.generations import GenerationStore
from streams.input_log import read_session_inputs
from streams.kafka import RecordConsumer, RecordProducer
from streams.prom import metrics, observe_heartbeat
from streams.topics import TopicCatalogue, partition_for_key

__all__ = ["WorkerConfig", "Worker", "session_seed", "serve"]

log = logging.getLogger(__name__)
MAX_PENDING_INPUTS = 1024
SNAPSHOT_FORMAT = "chunkserve.snapshot.v1"


def session_seed(session_id: str) -> int:
    """The session's noise seed: a stable function of its id, so any owner reproduces it."""
    return zlib.crc32(session_id.encode())


@dataclass(frozen=True)
class WorkerConfig:
    """One worker's identity and pacing."""

    worker_id: str
    capacity: int = 8
    pool: str = "default"
    gpu_type: str = "cpu"
    chunk_interval_s: float = 0.1
    heartbeat_s: float = 1.0
    device: str = "cpu"
    snapshot_every: int = 16
    host_cache_sessions: int = 64
    input_gap_wait_s: float = 5.0  # an input waits this long for a missing earlier seq


@dataclass
class _Session:
    generation: Generation
    state: Any
    executing: bool = True
    next_due: float = 0.0
    pending: dict[int, RoutedInput] = field(default_factory=dict)
    input_pos: tuple[int, int] = (-1, -1)  # session-inputs (partition, offset) of the last applied input
    gap_since: float | None = None  # since when the next seq is missing while later ones wait
    skipped: set[int] = field(default_factory=set)  # seqs given up on after the gap wait


class _Schedule:
    """When each executing session's next chunk is due: a heap with lazy deletion, so a
    worker holding thousands of sessions finds the due ones without scanning them all.
    An entry counts only while it matches its session's current ``next_due``."""

    def __init__(self, sessions: dict[str, _Session]) -> None:
        self._sessions = sessions
        self._heap: list[tuple[float, int, str, _Session]] = []
        self._seq = itertools.count()

    def add(self, sid: str, sess: _Session) -> None:
        heapq.heappush(self._heap, (sess.next_due, next(self._seq), sid, sess))

    def _valid(self, entry: tuple[float, int, str, _Session]) -> bool:
        due, _, sid, sess = entry
        return self._sessions.get(sid) is sess and sess.executing and sess.next_due == due

    def first(self) -> float | None:
        """The earliest due time, or None when nothing executes."""
        while self._heap and not self._valid(self._heap[0]):
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> list[tuple[str, _Session]]:
        """Every executing session due by ``now``, each once, earliest first."""
        due: list[tuple[str, _Session]] = []
        taken: set[int] = set()
        while self._heap and self._heap[0][0] <= now:
            entry = heapq.heappop(self._heap)
            if self._valid(entry) and id(entry[3]) not in taken:
                taken.add(id(entry[3]))
                due.append((entry[2], entry[3]))
        return due


class Worker:
    """Drives a ``StreamingModel`` for the sessions this worker currently owns."""

    def __init__(self, settings: Settings, config: WorkerConfig, model: Any, store: GenerationStore,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        settings.check_capacity(config.capacity)  # ConfigError naming max_sessions_per_worker
        self.settings = settings
        self.config = config
        self.model = model
        self.store = store
        self.clock = clock
        self.monotonic = monotonic
        self.sessions: dict[str, _Session] = {}
        self.schedule = _Schedule(self.sessions)
        self.early_inputs: dict[str, dict[int, RoutedInput]] = {}
        # offloaded sessions kept in host memory, by snapshot id: a resume here skips Redis
        self.host_cache: OrderedDict[str, tuple[str, Any, tuple[int, int]]] = OrderedDict()
        self.chunks_released = 0
        self.last_latency_s = 0.0
        self._producer: RecordProducer | None = None
        self._consumer: RecordConsumer | None = None
        self._telemetry: Any = None
        self._unacked: list[tuple[Record, Any]] = []  # sends handed to the producer, acknowledged per batch

    # --- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        from .telemetry import Telemetry

        cfg = self.config
        catalogue = TopicCatalogue.from_settings(self.settings)
        self._producer = await RecordProducer(self.settings, catalogue,
                                              client_id=f"worker-{cfg.worker_id}").start()
        self._consumer = RecordConsumer(self.settings, [WORKER_COMMANDS], self._producer,
                                        name=f"worker-{cfg.worker_id}", catalogue=catalogue)
        await self._consumer.start(subscribe=False)
        partitions = await self._consumer.partitions(WORKER_COMMANDS)
        mine = partition_for_key(cfg.worker_id.encode(), len(partitions))
        await self._consumer.assign(WORKER_COMMANDS, [mine], from_end=True)
        await self.store.register_worker(cfg.worker_id, cfg.capacity)
        await self.store.set_draining(cfg.worker_id, False)  # a restarted worker admits again
        # sessions a previous run of this worker held are not here: they owe a recovery
        # (queued before this worker counts as up again, so no replica can miss them)
        stranded = await self.store.strand(cfg.worker_id, self.clock())
        if stranded:
            log.warning("%s: %d sessions of a previous run queued for recovery", cfg.worker_id, stranded)
        await self.store.set_up(cfg.worker_id, self.clock())
        self._telemetry = Telemetry(0 if cfg.device.startswith("cuda") else None)
        await self._send(WorkerUp(worker_id=cfg.worker_id, ts=self.clock(), capacity=cfg.capacity,
                                  device=cfg.device, gpu_type=cfg.gpu_type, pool=cfg.pool))

    async def stop(self, reason: str = "shutdown") -> None:
        if self._producer is not None:
            await self._send(WorkerDown(worker_id=self.config.worker_id, ts=self.clock(),
                                        reason=reason))
            await self._acknowledged()
        if self._consumer is not None:
            await self._consumer.stop()
        if self._producer is not None:
            await self._producer.stop()

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set."""
        await self.start()
        next_beat = 0.0
        try:
            while not stop.is_set():
                # block in the poll until the next chunk is due (at most 50 ms): no spinning
                due = self.schedule.first()
                wait_s = 0.05 if due is None else min(0.05, max(0.001, due - self.monotonic()))
                await self.poll_commands(timeout_ms=int(wait_s * 1000))
                await self.tick()
                if self.monotonic() >= next_beat:
                    await self.expire_gaps()
                    await self.heartbeat()
                    next_beat = self.monotonic() + self.config.heartbeat_s
        finally:
            await self.stop()

    # --- commands ----------------------------------------------------------------------

    async def poll_commands(self, timeout_ms: int) -> None:
        assert self._consumer is not None
        for d in await self._consumer.poll(timeout_ms=timeout_ms):
            rec = d.record
            if getattr(rec, "worker_id", None) != self.config.worker_id:
                continue  # another worker's command on the shared partition
            if d.refused is not None:  # unsigned, unknown key or forged: never acted on
                await self._reject(rec, d.refused, "command failed its authenticity check")
                continue
            await self.handle(rec)
        await self._acknowledged()

    async def handle(self, rec: Record) -> None:
        if isinstance(rec, Assign):
            await self._on_assign(rec)
        elif isinstance(rec, RoutedInput):
            await self._on_input(rec)
        elif isinstance(rec, (Terminate, Revoke)):
            await self._on_stop(rec)
        elif isinstance(rec, Suspend):
            await self._on_suspend(rec)
        elif isinstance(rec, Handoff):
            await self._on_handoff(rec)
        elif isinstance(rec, Resume):
            sess = await self._current_session(rec)
            if sess is not None:
                sess.executing = True
                sess.next_due = self.monotonic()
                self.schedule.add(rec.session_id, sess)

    async def _reject(self, rec: Record, reason: str, detail: str = "") -> None:
        metrics().rejected.labels(reason).inc()
        await self._send(CommandRejected(
            worker_id=self.config.worker_id, session_id=getattr(rec, "session_id", ""),
            command=rec.TAG, reason=reason, ts=self.clock(),
            generation=getattr(rec, "generation", None), seq=getattr(rec, "seq", -1),
            detail=detail[:500], kind=getattr(rec, "kind", ""), payload=getattr(rec, "payload", "")))

    async def _on_assign(self, rec: Assign) -> None:
        held = self.sessions.get(rec.session_id)
        if held is not None and held.generation == rec.generation:
            current = await self.store.current(rec.session_id)
            if current == rec.generation:
                return  # a duplicate delivery of the command being served: nothing to do
            # a replay of a generation that has passed: refused and reported (the next chunk's
            # revalidation drops the session here)
            reason = "stale_epoch" if current is not None else "unknown_session"
            await self._reject(rec, reason, f"generation {rec.generation} has passed (now {current})")
            return
        try:
            await self.store.claim(rec.session_id, rec.generation)
        except OwnershipError as exc:
            await self._reject(rec, exc.reason_code, str(exc))
            return
        if held is not None:  # we held an older generation of the same session
            self.sessions.pop(rec.session_id)
        try:
            state, input_pos = await self._initial_state(rec)
        except ChunkserveError as exc:  # corrupt, vanished, or over max_snapshot_bytes
            await self._reject(rec, exc.reason_code, str(exc))
            try:
                await self.store.release(rec.session_id, rec.generation, close=False)
            except OwnershipError:
                pass
            return
        sess = _Session(rec.generation, state, next_due=self.monotonic(), input_pos=input_pos)
        self.sessions[rec.session_id] = sess
        self.schedule.add(rec.session_id, sess)
        if rec.recover:
            await self._replay_inputs(rec.session_id, sess)
        await self._send(Claimed(worker_id=self.config.worker_id, session_id=rec.session_id,
                                 generation=rec.generation, ts=self.clock()))
        early = self.early_inputs.pop(rec.session_id, {})
        sess.pending.update({s: i for s, i in early.items()
                             if i.generation == rec.generation and s > state.input_seq})
        await self._apply_pending(rec.session_id, sess)

    async def _initial_state(self, rec: Assign) -> tuple[Any, tuple[int, int]]:
        """A new session's state, or a restored one: host cache if it holds the latest
        snapshot, else the fenced snapshot from Redis (checksum-verified, KV rebuilt).
        Returns the state and the input position the snapshot was taken at."""
        fresh = (self.model.init_state(rec.session_id, rec.prompt, session_seed(rec.session_id)), (-1, -1))
        if not rec.restore:
            return fresh
        view = await self.store.session(rec.session_id)
        manifest = view.snapshot if view is not None else None
        if manifest is None:  # never snapshotted: start over from the prompt
            return fresh
        cached = self.host_cache.pop(rec.session_id, None)
        if cached is not None and cached[0] == manifest.snap_id:
            return cached[1].to(self.config.device), cached[2]
        got = await self.store.read_snapshot(rec.session_id)
        if got is None:
            raise SnapshotCorruptError(f"session {rec.session_id}: snapshot vanished")
        try:
            data = msgpack.unpackb(got[1], raw=False)
            pos = (int(data["input_partition"]), int(data["input_offset"]))
            if data.get("format") != SNAPSHOT_FORMAT:
                raise ValueError(f"unknown snapshot format {data.get('format')!r}")
        except Exception as exc:
            raise SnapshotCorruptError(f"session {rec.session_id}: unreadable snapshot: {exc}") from None
        return self.model.import_state(data["state"]).to(self.config.device), pos

    async def _replay_inputs(self, sid: str, sess: _Session) -> int:
        """Recovery: queue the session's inputs after the snapshot, read from ``session-inputs``
        (from the snapshot's position, or the partition's start when it has none)."""
        assert self._producer is not None
        start = sess.input_pos if sess.input_pos[0] >= 0 else None
        logged = await read_session_inputs(self.settings, sid, sess.state.input_seq, start, self._producer,
                                           name=f"worker-{self.config.worker_id}-replay")
        for got in logged:
            rec = got.record
            sess.pending[rec.seq] = RoutedInput(
                worker_id=self.config.worker_id, session_id=sid, generation=sess.generation,
                seq=rec.seq, kind=rec.kind, payload=rec.payload, ts=self.clock(),
                source_partition=got.partition, source_offset=got.offset)
        return len(logged)

    async def _snapshot(self, sid: str, sess: _Session) -> Any:
        """Fenced snapshot of the compact state at a chunk boundary; returns the manifest.

        Beside the model's compact state it records where in ``session-inputs`` the last
        applied input was, so a recovery replays exactly the inputs after it.
        """
        blob = msgpack.packb({"format": SNAPSHOT_FORMAT, "state": self.model.export_state(sess.state),
                              "input_partition": sess.input_pos[0], "input_offset": sess.input_pos[1]},
                             use_bin_type=True)
        return await self.store.put_snapshot(sid, sess.generation, blob,
                                             chunk_index=sess.state.chunk_index,
                                             input_seq=sess.state.input_seq)

    async def _on_suspend(self, rec: Suspend) -> None:
        """Offload: device -> host -> fenced snapshot in Redis, then free the slot."""
        sess = await self._current_session(rec)
        if sess is None:
            return
        if sess.pending:  # the snapshot keeps no waiting inputs: apply them now
            await self._apply_pending(rec.session_id, sess, skip_gaps=True)
            if self.sessions.get(rec.session_id) is not sess:
                return  # fenced meanwhile
        try:
            sess.state.to("cpu")
            manifest = await self._snapshot(rec.session_id, sess)
            await self.store.release(rec.session_id, sess.generation, close=False)
        except LimitError as exc:  # cannot offload: the session stays resident and says why
            sess.state.to(self.config.device)
            await self._reject(rec, exc.reason_code, str(exc))
            return
        except OwnershipError as exc:
            await self._drop(rec.session_id, sess, f"fenced: {exc}")
            return
        self.sessions.pop(rec.session_id, None)
        self.host_cache[rec.session_id] = (manifest.snap_id, sess.state, sess.input_pos)
        while len(self.host_cache) > self.config.host_cache_sessions:
            self.host_cache.popitem(last=False)
        await self._send(Released(worker_id=self.config.worker_id, session_id=rec.session_id,
                                  generation=sess.generation, ts=self.clock(), reason="suspended",
                                  chunk_index=sess.state.chunk_index))

    async def _on_handoff(self, rec: Handoff) -> None:
        """Migrate at this chunk boundary: freeze, fenced snapshot, commit to the target with a
        source guard; the target restores from the snapshot when its Assign arrives."""
        sess = await self._current_session(rec)
        if sess is None:
            return
        try:
            await self._snapshot(rec.session_id, sess)
            successor = await self.store.commit_migration(rec.session_id, sess.generation,
                                                          rec.target_worker)
        except LimitError as exc:  # its state cannot travel through Redis: keep serving here
            await self._reject(rec, exc.reason_code, str(exc))
            return
        except OwnershipError as exc:
            if exc.reason_code == "no_capacity":  # the target is full: keep serving here
                await self._reject(rec, exc.reason_code, str(exc))
                return
            await self._drop(rec.session_id, sess, f"fenced: {exc}")
            return
        self.sessions.pop(rec.session_id, None)
        await self._send(Released(worker_id=self.config.worker_id, session_id=rec.session_id,
                                  generation=sess.generation, ts=self.clock(), reason="migrated",
                                  successor=successor, chunk_index=sess.state.chunk_index))

    async def _current_session(self, rec: Record) -> _Session | None:
        """The held session if ``rec`` carries its generation; otherwise reject ``rec``.

        A Terminate or Suspend may overtake the Assign of the same generation (they come from
        different agents): if the store says the generation is current and ours, the session
        is ended or suspended in the store directly, so the late Assign finds nothing to run.
        """
        sid = rec.session_id  # type: ignore[attr-defined]
        gen = rec.generation  # type: ignore[attr-defined]
        sess = self.sessions.get(sid)
        if sess is None and isinstance(rec, (Terminate, Suspend)) and gen.worker_id == self.config.worker_id:
            if await self.store.current(sid) == gen:
                close = isinstance(rec, Terminate)
                try:
                    await self.store.release(sid, gen, close=close)
                except OwnershipError as exc:
                    await self._reject(rec, exc.reason_code, str(exc))
                    return None
                await self._send(Released(worker_id=self.config.worker_id, session_id=sid,
                                          generation=gen, ts=self.clock(),
                                          reason="closed" if close else "suspended"))
                return None
        if sess is None or sess.generation != gen:
            reason = "stale_epoch" if sess is not None and gen.epoch < sess.generation.epoch else "not_owner"
            await self._reject(rec, reason, f"held: {sess.generation if sess else None}")
            return None
        return sess

    async def _on_input(self, rec: RoutedInput) -> None:
        sess = self.sessions.get(rec.session_id)
        if sess is None:
            view = await self.store.session(rec.session_id)
            if view is None or view.state != "active" or view.generation != rec.generation:
                # we lost (or never had) the session, or it was offloaded: the router re-routes
                current = view.generation if view is not None else None
                stale = current is not None and current.epoch > rec.generation.epoch
                reason = "stale_epoch" if stale else "not_owner"
                await self._reject(rec, reason, f"current: {current} ({view.state if view else 'unknown'})")
                return
        if sess is None or sess.generation.epoch < rec.generation.epoch:
            # the Assign may not have arrived yet: keep it, bounded, until it does
            early = self.early_inputs.setdefault(rec.session_id, {})
            if len(early) < MAX_PENDING_INPUTS:
                early[rec.seq] = rec
            else:
                await self._reject(rec, "too_many_pending", "pending input buffer full")
            return
        if sess.generation != rec.generation:
            await self._reject(rec, "stale_epoch", f"held: {sess.generation}")
            return
        if rec.seq in sess.skipped:
            await self._reject(rec, "late", f"input {rec.seq} arrived after the session gave up waiting "
                               f"for it ({self.config.input_gap_wait_s:g} s) and applied later inputs")
            return
        if rec.seq <= sess.state.input_seq:
            return  # already applied (duplicate delivery)
        if len(sess.pending) >= MAX_PENDING_INPUTS:
            await self._reject(rec, "too_many_pending", "pending input buffer full")
            return
        sess.pending[rec.seq] = rec
        await self._apply_pending(rec.session_id, sess)

    async def _apply_pending(self, sid: str, sess: _Session, skip_gaps: bool = False) -> None:
        """Apply buffered inputs in order, each after revalidating the generation. A missing
        seq is waited for (``gap_since``); ``skip_gaps`` gives up on it and applies the rest."""
        while sess.pending:
            nxt = sess.state.input_seq + 1
            if nxt not in sess.pending:
                if not skip_gaps:
                    sess.gap_since = sess.gap_since if sess.gap_since is not None else self.monotonic()
                    return
                first = min(sess.pending)
                sess.skipped.update(range(nxt, first))
                if len(sess.skipped) > MAX_PENDING_INPUTS:
                    sess.skipped = set(sorted(sess.skipped)[-MAX_PENDING_INPUTS:])
                nxt = first
            rec = sess.pending.pop(nxt)
            try:
                await self.store.set_input_seq(sid, sess.generation, rec.seq)
            except OwnershipError as exc:
                await self._drop(sid, sess, f"fenced: {exc}")
                return
            self.model.apply_input(sess.state, rec.payload, rec.seq)
            if rec.source_offset >= 0:
                sess.input_pos = (rec.source_partition, rec.source_offset)
            await self._send(InputAccepted(worker_id=self.config.worker_id, session_id=sid,
                                           generation=sess.generation, seq=rec.seq, ts=self.clock()))
        sess.gap_since = None

    async def expire_gaps(self) -> int:
        """Sessions whose missing input was waited for ``input_gap_wait_s``: apply the inputs
        after it (a missing one that arrives later is refused as late). Returns how many."""
        limit = self.monotonic() - self.config.input_gap_wait_s
        due = [(sid, s) for sid, s in self.sessions.items() if s.gap_since is not None and s.gap_since <= limit]
        for sid, sess in due:
            await self._apply_pending(sid, sess, skip_gaps=True)
        return len(due)

    async def _refuse_pending(self, sess: _Session, reason: str, detail: str) -> None:
        pending, sess.pending = sess.pending, {}
        for rec in sorted(pending.values(), key=lambda r: r.seq):
            await self._reject(rec, reason, detail)

    async def _on_stop(self, rec: Terminate | Revoke) -> None:
        sess = await self._current_session(rec)
        if sess is None:
            return
        close = isinstance(rec, Terminate)
        if close:  # inputs still waiting for an earlier one are not applied: refused
            await self._refuse_pending(sess, "closed", "the session closed while this input waited "
                                       "for an earlier one")
        try:
            await self.store.release(rec.session_id, rec.generation, close=close)
        except OwnershipError as exc:
            log.info("release of %s refused: %s", rec.session_id, exc)
        self.sessions.pop(rec.session_id, None)
        await self._send(Released(worker_id=self.config.worker_id, session_id=rec.session_id,
                                  generation=rec.generation, ts=self.clock(),
                                  reason="closed" if close else f"revoked: {rec.reason}"))

    async def _drop(self, sid: str, sess: _Session, reason: str) -> None:
        """Forget a session whose generation is no longer ours (it was fenced)."""
        if self.sessions.get(sid) is sess:
            del self.sessions[sid]
        await self._send(Released(worker_id=self.config.worker_id, session_id=sid,
                                  generation=sess.generation, ts=self.clock(), reason=reason))

    # --- chunks ------------------------------------------------------------------------

    async def tick(self) -> int:
        """Run every due session's next chunk as one batch; release only revalidated outputs."""
        now = self.monotonic()
        due = self.schedule.pop_due(now)
        if not due:
            return 0
        started = time.perf_counter()
        outputs = self.model.run_batch([s.state for _, s in due])
        latency = time.perf_counter() - started
        self.last_latency_s = latency
        # one round trip: revalidate every generation and advance the released chunk indices
        verdicts = await self.store.release_chunks(
            [(sid, s.generation, out.chunk_index) for (sid, s), out in zip(due, outputs)])
        released = []
        for (sid, sess), out, (ok, why) in zip(due, outputs, verdicts):
            if not ok and why != "released":
                await self._drop(sid, sess, f"fenced: {why}")
                continue
            sess.next_due = max(sess.next_due + self.config.chunk_interval_s, now)
            self.schedule.add(sid, sess)
            if not ok:  # recomputed after a recovery: an earlier owner already released it
                continue
            released.append(ChunkDone(
                worker_id=self.config.worker_id, session_id=sid, generation=sess.generation,
                chunk_index=out.chunk_index, ts=self.clock(), latency_s=latency,
                batch_size=len(due), input_seq=out.input_seq, checksum=out.checksum))
        for chunk in released:
            await self._send(chunk)
        await self._acknowledged()
        self.chunks_released += len(released)
        metrics().chunks_released.labels(self.config.worker_id).inc(len(released))
        every = self.config.snapshot_every
        for sid, sess in due:  # periodic fenced checkpoints bound what a recovery replays
            if every and self.sessions.get(sid) is sess and sess.state.chunk_index % every == 0:
                try:
                    await self._snapshot(sid, sess)
                except LimitError as exc:  # no checkpoint: a recovery replays from the last one
                    metrics().rejected.labels(exc.reason_code).inc()
                    log.warning("worker %s: periodic snapshot skipped: %s", self.config.worker_id, exc)
                except OwnershipError as exc:
                    await self._drop(sid, sess, f"fenced: {exc}")
        return len(released)

    async def heartbeat(self) -> None:
        sample = self._telemetry.sample() if self._telemetry is not None else None
        metrics().sessions_held.set(len(self.sessions))
        await self._send(beat := Heartbeat(
            worker_id=self.config.worker_id, ts=self.clock(), sessions=len(self.sessions),
            executing=sum(1 for s in self.sessions.values() if s.executing),
            capacity=self.config.capacity, chunk_latency_s=self.last_latency_s,
            device_mem_bytes=sample.device_mem_bytes if sample else 0,
            device_util=sample.device_util if sample else 0.0,
            power_w=sample.power_w if sample else 0.0,
            cpu_percent=sample.cpu_percent if sample else 0.0,
            rss_bytes=sample.rss_bytes if sample else 0))
        observe_heartbeat(beat)

    async def _send(self, rec: Record) -> None:
        """Hand ``rec`` to the producer without waiting for the broker: events of one batch of
        commands go out together (in order per partition) and ``_acknowledged`` waits once."""
        assert self._producer is not None
        self._unacked.append((rec, await self._producer.send(rec, wait=False)))

    async def _acknowledged(self, retry_s: float = 0.5) -> None:
        """Wait until every event handed to the producer so far is acknowledged. A send the
        producer gave up on (the broker was away longer than it retries) is sent again, in
        order, until the broker takes it: a broker outage stalls the worker, never kills it."""
        from aiokafka.errors import KafkaError

        assert self._producer is not None
        pending, self._unacked = self._unacked, []
        while pending:
            results = await asyncio.gather(*(fut for _, fut in pending), return_exceptions=True)
            errors = [res for res in results if isinstance(res, BaseException)]
            for err in errors:
                if not isinstance(err, KafkaError):
                    raise err
            failed = [rec for (rec, _), res in zip(pending, results) if isinstance(res, BaseException)]
            if failed:
                log.warning("worker %s: %d events not acknowledged (%r); sending them again",
                            self.config.worker_id, len(failed), errors[0])
                await asyncio.sleep(retry_s)
            pending = [(rec, await self._producer.send(rec, wait=False)) for rec in failed]


def serve(settings: Settings, config: WorkerConfig, model: Any, worker_cls: type[Worker] = Worker) -> None:
    """Run one worker process until SIGTERM or SIGINT (the ``chunkserve worker`` main loop)."""
    import signal

    async def main() -> None:
        store = GenerationStore.from_settings(settings)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await worker_cls(settings, config, model, store).run(stop)
        finally:
            await store.aclose()

    asyncio.run(main())
