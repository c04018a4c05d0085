"""The worker runtime: claims generations, runs coalesced chunks, releases only when current.

One process per device. Commands arrive on the ``worker-commands`` partition the worker id
hashes to (records for other workers are skipped); the worker's core decides what each leads
to (``core.py``, one session's rules in ``ownership.py``) and its shell carries that out
(``commands.py``). Every state-advancing step is fenced: a
session is claimed before its first chunk or input, the whole coalesced batch is revalidated
in one round trip before any output is released, and inputs are applied once, in sequence
order. A worker that learns its generation is stale drops the session at once. One process
holds a worker id at a time: a lease in the store (``streams.lease``), taken at start and
refreshed on the heartbeat timer, refuses a second process started with a live worker's id.
Once serving, a worker waits out a store outage of any length (``PatientStore``): the call
that failed is tried again until Redis answers, its chunks held unreleased meanwhile, while
heartbeats (on the broker) go on; one warning names the worker when the store stops
answering and one when it is back.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from schemas.errors import InfraError, LeaseHeldError
from schemas.records import ChunkDone, Heartbeat, Record, WorkerDown, WorkerUp
from schemas.topics import WORKER_COMMANDS
from streams.config import Settings
from streams.generations import GenerationStore, LeaseAnswer
from streams.input_log import read_session_inputs
from streams.kafka import RecordConsumer, RecordProducer
from streams.lease import Lease, holder_of
from streams.prom import metrics, observe_heartbeat
from streams.topics import TopicCatalogue, partition_for_key

from .commands import CommandHandler, Ports, session_seed
from .core_types import ChunksReleased, Send
from .outbox import Outbox

__all__ = ["WorkerConfig", "Worker", "StoreOutage", "PatientStore", "id_held", "session_seed", "serve"]

log = logging.getLogger(__name__)

# between tries of a store call that failed with InfraError: doubling up to the last
PATIENCE_WAITS_S = (0.5, 1.0, 2.0, 5.0)
# at a stop, how long the events sent so far may take to be acknowledged (the broker away)
STOP_SEND_S = 20.0


class StoreOutage:
    """Whether a process's store answers: one warning naming ``who`` when it stops answering
    and one when it answers again, however many calls fail in between."""

    def __init__(self, who: str, monotonic: Callable[[], float] = time.monotonic,
                 meanwhile: str = "holding unreleased chunks and trying again until it answers") -> None:
        self.who, self.monotonic, self.meanwhile = who, monotonic, meanwhile
        self.since: float | None = None  # when the first call of this outage failed
        self.outages = 0

    def failed(self, exc: BaseException) -> None:
        if self.since is None:
            self.since, self.outages = self.monotonic(), self.outages + 1
            log.warning("%s: the generation store is unreachable (%s); %s", self.who,
                        " ".join(str(exc).split())[:300], self.meanwhile)

    def answered(self) -> None:
        if self.since is not None:
            log.warning("%s: the generation store answers again after %.1f s; carrying on",
                        self.who, self.monotonic() - self.since)
            self.since = None


class _Stopped(InfraError):
    """The process was asked to stop while its store was unreachable."""


class PatientStore:
    """``store`` as a serving process sees it: a call that fails with InfraError (Redis down,
    paused or failing over; a fenced write no replica acknowledged) is tried again, 0.5 s to
    5 s apart, until it answers, so nothing is acted on without the store's answer. Every
    script is safe to repeat (``streams.store_backends.RETRY_WAITS_S``); a call whose first
    try landed answers its repeat with the same result or a refusal. Once ``stop`` is set a
    failing call gives up (``_Stopped``, an InfraError naming ``outage.who``). ``rejoin`` runs
    once after each outage: a worker registers again (an upsert), so a Redis restarted
    without its data knows it again."""

    def __init__(self, store: Any, outage: StoreOutage, stop: asyncio.Event | None = None,
                 rejoin: Callable[[], Awaitable[Any]] | None = None) -> None:
        self.store, self.outage, self.stop, self.rejoin = store, outage, stop, rejoin
        self._rejoined = 0  # the outages seen over (``rejoin`` runs once after each)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.store, name)
        if not asyncio.iscoroutinefunction(attr):
            return attr

        async def patient(*args: Any, **kwargs: Any) -> Any:
            waits = iter(PATIENCE_WAITS_S)
            wait = next(waits)
            while True:
                try:
                    result = await (attr(*args, **kwargs) if self.outage.since is None
                                    else self._unless_stopped(attr(*args, **kwargs)))
                except InfraError as exc:
                    if isinstance(exc, _Stopped):
                        raise
                    self.outage.failed(exc)
                    await self._unless_stopped(asyncio.sleep(wait))
                    wait = next(waits, wait)
                    continue
                self.outage.answered()
                if self.rejoin is not None and self._rejoined != self.outage.outages:
                    try:
                        await self.rejoin()
                        self._rejoined = self.outage.outages
                    except InfraError as exc:  # away again: after the next call it answers
                        self.outage.failed(exc)
                return result

        return patient

    async def _unless_stopped(self, call: Any) -> Any:
        """``call``'s result, or _Stopped as soon as ``stop`` is set (the call cancelled)."""
        if self.stop is None:
            return await call
        task = asyncio.ensure_future(call)
        if not self.stop.is_set():
            stopping = asyncio.ensure_future(self.stop.wait())
            await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
        if task.done():
            return task.result()
        task.cancel()
        raise _Stopped(f"{self.outage.who}: stopped while the generation store was unreachable")


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
    handoff_wait_s: float = 10.0  # a session frozen for a handoff runs here again after this
    lease_s: float = 5.0  # this process's hold on the id lapses this long after its last refresh

    @property
    def lease_ttl_s(self) -> float:
        """The id's lease time: ``lease_s``, never under three heartbeats (one refresh each)."""
        return max(self.lease_s, 3 * self.heartbeat_s)


class Worker:
    """Drives a ``StreamingModel`` for the sessions this worker currently owns."""

    def __init__(self, settings: Settings, config: WorkerConfig, model: Any, store: GenerationStore,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        settings.check_capacity(config.capacity)  # ConfigError naming max_sessions_per_worker
        self.settings, self.config, self.model, self.store = settings, config, model, store
        self.clock, self.monotonic = clock, monotonic
        self.outbox: Outbox | None = None
        self.patient = PatientStore(store, StoreOutage(f"worker {config.worker_id}", monotonic),
                                    rejoin=lambda: store.register_worker(config.worker_id, config.capacity))
        self.commands = CommandHandler(Ports(
            worker_id=config.worker_id, device=config.device, store=self.patient, model=model,
            send=self._send, clock=clock, monotonic=monotonic, replay=self._replay,
            gap_wait_s=config.input_gap_wait_s, host_cache_sessions=config.host_cache_sessions,
            flush=self._flush))
        self.sessions, self.schedule = self.commands.sessions, self.commands.schedule
        self.chunks_released = 0
        # its series at 0 from the start, not from the first chunk (and only a worker's)
        metrics().chunks_released.labels(config.worker_id)
        metrics().sessions_held.labels(config.worker_id)
        self.last_latency_s = 0.0
        self._producer: RecordProducer | None = None
        self._consumer: RecordConsumer | None = None
        self._telemetry: Any = None
        # one live process per worker id (streams.lease): another holder's start is refused
        self.lease = Lease(store, f"worker:{config.worker_id}", config.lease_ttl_s, monotonic=monotonic)
        self.lease_lost: LeaseHeldError | None = None  # another process took the id: it stopped

    # --- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Take the id's lease (LeaseHeldError when another live process holds it), then join:
        register, queue a previous run's sessions for recovery, say WorkerUp."""
        await self._take_lease()  # before anything the id's live holder would see
        try:
            await self._join()
        except BaseException:
            await self.lease.release()  # a restart need not wait out the lease
            raise

    async def _join(self) -> None:
        from .telemetry import Telemetry

        cfg = self.config
        catalogue = TopicCatalogue.from_settings(self.settings)
        self._producer = await RecordProducer(self.settings, catalogue,
                                              client_id=f"worker-{cfg.worker_id}").start()
        self.outbox = Outbox(self._producer, f"worker {cfg.worker_id}")
        self._consumer = RecordConsumer(self.settings, [WORKER_COMMANDS], self._producer,
                                        name=f"worker-{cfg.worker_id}", catalogue=catalogue)
        await self._consumer.start(subscribe=False)
        partitions = await self._consumer.partitions(WORKER_COMMANDS)
        mine = partition_for_key(cfg.worker_id.encode(), len(partitions))
        await self._consumer.assign({WORKER_COMMANDS: [mine]}, "end")
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
                                  chunk_interval_s=cfg.chunk_interval_s,
                                  input_rate_per_s=self.settings.input_rate_per_s,
                                  input_burst=self.settings.input_burst,
                                  device=cfg.device, gpu_type=cfg.gpu_type, pool=cfg.pool, pid=os.getpid()))

    async def _take_lease(self) -> None:
        """Hold the id alone, or LeaseHeldError: a second process started with a live
        worker's id would queue its sessions for recovery and mark it down at its stop."""
        answer = await self.lease.take()
        if not answer.ours:
            raise id_held(self.config.worker_id, self.lease, answer)

    async def keep_lease(self, stop: asyncio.Event) -> None:
        """Refresh the id's lease (a task of its own); stop when another process took the id."""
        taken = await self.lease.keep(stop, self.config.heartbeat_s, self.patient.outage)
        if taken is not None:
            self.lease_lost = id_held(self.config.worker_id, self.lease, taken, lost=True)
            log.error("%s", self.lease_lost)
            stop.set()

    async def stop(self, reason: str = "shutdown") -> None:
        """Say WorkerDown (not when another holds the id now: it is up), stop the clients, free the id."""
        try:
            if self.outbox is not None and self.lease_lost is None:
                await self._send(WorkerDown(worker_id=self.config.worker_id, ts=self.clock(),
                                            reason=reason))
                await _acknowledged_at_stop(self.outbox, self.config.worker_id)
            if self._consumer is not None:
                await self._consumer.stop()
            if self._producer is not None:
                await self._producer.stop()
        finally:
            await self.lease.release()

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set; LeaseHeldError (after a clean stop) when another
        process took the id meanwhile."""
        await self.start()
        self.patient.stop = stop  # a stop asked during a store outage is not held up by it
        beats = asyncio.get_running_loop().create_task(self.beat(stop))
        lease = asyncio.get_running_loop().create_task(self.keep_lease(stop))
        next_check = 0.0
        try:
            while not stop.is_set():
                # block in the poll until the next chunk is due (at most 50 ms): no spinning
                due = self.schedule.first()
                wait_s = 0.05 if due is None else min(0.05, max(0.001, due - self.monotonic()))
                await self.poll_commands(timeout_ms=int(wait_s * 1000))
                await self.tick()
                if self.monotonic() >= next_check:
                    await self.expire_gaps()
                    await self.thaw_stuck()
                    next_check = self.monotonic() + self.config.heartbeat_s
        except _Stopped as exc:  # asked to stop while the store was away: what waited is dropped
            log.warning("%s", exc)
        finally:
            beats.cancel()
            lease.cancel()
            await self.stop()
        if self.lease_lost is not None:
            raise self.lease_lost

    async def beat(self, stop: asyncio.Event) -> None:
        """Heartbeats on their own timer, needing no Redis: a loop waiting out a store outage is
        still a live worker, not to be declared dead for it; a stopped process sends none."""
        while not stop.is_set():
            await self.heartbeat()
            try:
                await asyncio.wait_for(stop.wait(), self.config.heartbeat_s)
            except asyncio.TimeoutError:
                pass

    # --- commands ----------------------------------------------------------------------

    async def poll_commands(self, timeout_ms: int) -> None:
        assert self._consumer is not None and self.outbox is not None
        for d in await self._consumer.poll(timeout_ms=timeout_ms):
            rec = d.record
            if getattr(rec, "worker_id", None) != self.config.worker_id:
                continue  # another worker's command on the shared partition
            if d.refused is not None:  # unsigned, unknown key or forged: never acted on
                await self.commands.unauthentic(rec, d.refused)
                continue
            await self.commands.handle(rec)
        await self.outbox.acknowledged()

    async def handle(self, rec: Record) -> None:
        await self.commands.handle(rec)

    async def expire_gaps(self) -> int:
        return await self.commands.expire_gaps()

    async def thaw_stuck(self) -> int:
        """Sessions frozen for a handoff that nobody completed within ``handoff_wait_s`` run
        again (should dispatch commit the move later, this generation is fenced at its next
        write)."""
        return await self.commands.thaw_stuck(self.config.handoff_wait_s)

    async def _replay(self, sid: str, after_seq: int, start: tuple[int, int] | None) -> list[Any]:
        """Recovery: the session's inputs after ``after_seq`` from ``session-inputs``."""
        return await read_session_inputs(self.settings, sid, after_seq, start,
                                         name=f"worker-{self.config.worker_id}-replay")

    # --- chunks ------------------------------------------------------------------------

    async def tick(self) -> int:
        """Run every due session's next chunk as one batch; release only revalidated outputs."""
        await self.commands.replayed()  # recovered sessions whose inputs were read run from now
        now = self.monotonic()
        due = self.schedule.pop_due(now)
        if not due:
            return 0
        started = time.perf_counter()
        outputs = self.model.run_batch([s.state for _, s in due])
        latency = time.perf_counter() - started
        self.last_latency_s = latency
        # one round trip: revalidate every generation and advance the released chunk indices
        verdicts = await self.patient.release_chunks(
            [(sid, s.generation, out.chunk_index) for (sid, s), out in zip(due, outputs)])
        # the core releases what the store revalidated, drops what it fenced, schedules the
        # next chunks and takes the periodic snapshots that bound what a recovery replays
        decided = await self.commands.feed(ChunksReleased(
            tuple(due), tuple(outputs), tuple(verdicts), now, latency, self.config.chunk_interval_s,
            self.config.snapshot_every))
        released = sum(isinstance(c, Send) and isinstance(c.rec, ChunkDone) for c in decided)
        self.chunks_released += released
        metrics().chunks_released.labels(self.config.worker_id).inc(released)
        return released

    async def heartbeat(self) -> None:
        sample = self._telemetry.sample() if self._telemetry is not None else None
        metrics().sessions_held.labels(self.config.worker_id).set(len(self.sessions))
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

    async def _flush(self) -> None:
        assert self.outbox is not None, "the worker has not started"
        await self.outbox.acknowledged()

    async def _send(self, rec: Record) -> None:
        assert self.outbox is not None, "the worker has not started"
        await self.outbox.send(rec)


def id_held(worker_id: str, lease: Lease, answer: LeaseAnswer, lost: bool = False) -> LeaseHeldError:
    """Why a worker does not serve under ``worker_id``: another live process holds its lease
    (at start), or took it while this one could not refresh it (``lost``)."""
    holder = holder_of(answer.holder)
    if lost:
        said = (f"worker id {worker_id} was taken by another worker ({holder}) while this one could not "
                f"refresh its lease for {lease.ttl_s:g} s; this one stopped; give each worker its own id")
    else:
        said = (f"worker id {worker_id} is held by another live worker ({holder}); give each worker its own "
                f"id (one that stopped without a clean shutdown frees its id within {lease.ttl_s:g} s)")
    return LeaseHeldError(lease.name, holder, said)


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
        except InfraError as exc:  # Redis or the broker away at the start: one line naming the worker
            raise InfraError(f"worker {config.worker_id}: {exc}") from exc
        finally:
            await store.aclose()

    asyncio.run(main())


async def _acknowledged_at_stop(outbox: Outbox, worker_id: str) -> None:
    """The events sent so far acknowledged, for at most ``STOP_SEND_S``: a stop during a broker
    outage hung for ever before, holding the id's lease."""
    try:
        await asyncio.wait_for(outbox.acknowledged(), STOP_SEND_S)
    except asyncio.TimeoutError:
        log.warning("%s: stopped with events the broker did not take within %.0f s (its WorkerDown "
                    "among them: control declares it dead when its heartbeats stop)", worker_id, STOP_SEND_S)
