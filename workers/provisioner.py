"""The provisioner: carries out ``scaling-commands`` by starting and stopping workers.

``ScaleOut`` starts workers (each registers with ``WorkerUp`` once its model is loaded: that
is the boot time); ``Drain`` marks a worker draining in the generation store so no session
is admitted there, and ``Reinstate`` clears the mark (refused, as ``stopping``, for a worker
already asked to stop); ``Shutdown`` drains too and stops the worker only once the store shows
it holds no session, retrying until then. How workers run is behind the small
:class:`Provisioner` protocol: :class:`LocalProcessProvisioner` runs child processes; a
Kubernetes one can follow. Bad records go to ``dead-letters``.

Every command is safe to carry out twice (a commit the group refused, after the broker was
paused or the group rebalanced, delivers it again): a scale-out's decision id is refused as
replayed, a drain sets the flag again and a reinstate clears it again, a shutdown of a worker
already stopped here is done. A store outage is waited out (``workers.runtime.PatientStore``),
its workers, its children, left running.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol

from schemas import records as r
from schemas.codec import encode
from schemas.errors import OwnershipError
from schemas.topics import SCALING_COMMANDS
from streams.config import PROVISIONER_ENV, Settings
from streams.config_file import child_env, env_number, env_var, role_credentials, role_sasl_env
from streams.signing import COMMAND_KEYS_ENV, CommandKeys, worker_env

from .supervision import port_free, prometheus_targets, spawn, stop_in_order

__all__ = ["Provisioner", "LocalProcessProvisioner", "ProvisionerService", "run_provisioner",
           "next_index", "WORKER_SASL_ENV", "worker_credentials"]

log = logging.getLogger(__name__)


class Provisioner(Protocol):
    """Starts and stops the workers of one pool; the store bookkeeping is not its business."""

    pool: str

    async def start(self, count: int, gpu_type: str) -> list[str]:
        """Start ``count`` workers; returns their ids (they register themselves when booted)."""
        ...

    async def drain(self, worker_id: str) -> None:
        """The worker will get no new session (platform hook; admission is closed in Redis)."""
        ...

    async def reinstate(self, worker_id: str) -> None:
        """The worker takes new sessions again, its drain called off (platform hook; admission
        is reopened in Redis)."""
        ...

    async def shutdown(self, worker_id: str) -> bool:
        """Stop the worker (called once it is empty); False when it is not this provisioner's."""
        ...


def next_index(pool: str, worker_ids: Iterable[str]) -> int:
    """One past the highest ``n`` of the ``<pool>-<n>`` ids given (0 when none)."""
    pattern = re.compile(re.escape(pool) + r"-(\d+)$")
    return 1 + max((int(m.group(1)) for w in worker_ids if (m := pattern.match(w))), default=-1)


# the Kafka SASL user and password the provisioner's workers run as (the worker principal of
# streams.kafka_acls), so they do not inherit the provisioner's own
WORKER_SASL_ENV = role_sasl_env("worker")


def worker_credentials(env: Mapping[str, str]) -> tuple[str, str] | None:
    """The workers' own SASL user and password from ``env``: both variables or neither
    (then the workers run as the provisioner's principal)."""
    return role_credentials(env, "worker")


class LocalProcessProvisioner:
    """Workers as child processes: ``python -m infra worker --worker-id <pool>-<n> ...``.

    Children inherit the ``CHUNKSERVE_*`` environment (pointed at ``settings``) with
    ``CHUNKSERVE_PROVISIONER`` naming this provisioner (so each announces itself as one
    chunkserve may shut down: ``WorkerProvisioned``), with ``worker_credentials`` (SASL user
    and password) as their Kafka principal when given, log to
    ``log_dir/<id>.log`` (or to this process's output) and stop with this provisioner, even
    when it is killed (``workers.supervision``).
    """

    def __init__(self, settings: Settings, pool: str = "default", *, capacity: int = 8,
                 device: str = "cpu", chunk_interval_s: float = 0.1, first_index: int = 0,
                 log_dir: Path | None = None, stop_timeout_s: float = 15.0,
                 command: Iterable[str] = (sys.executable, "-m", "infra", "worker"),
                 worker_credentials: tuple[str, str] | None = None,
                 metrics: tuple[str, int] | None = None, targets: Path | None = None) -> None:
        self.settings = settings
        # (host, first port): each worker serves Prometheus on the next free port from it,
        # listed in ``targets`` (a Prometheus file_sd file) while it runs
        self.metrics, self.targets = metrics, targets
        self.ports: dict[str, int] = {}
        self.worker_credentials = worker_credentials
        self.pool = pool
        self.capacity = capacity
        self.device = device
        self.chunk_interval_s = chunk_interval_s
        self.index = first_index
        self.log_dir = log_dir
        self.stop_timeout_s = stop_timeout_s
        self.command = list(command)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    async def start(self, count: int, gpu_type: str) -> list[str]:
        ids = []
        for _ in range(count):
            wid = f"{self.pool}-{self.index}"
            self.index += 1
            args = [*self.command, "--worker-id", wid, "--pool", self.pool, "--capacity", str(self.capacity),
                    "--device", self.device, "--gpu-type", gpu_type,
                    "--chunk-interval", str(self.chunk_interval_s), *self._metrics_args(wid)]
            out: Any = None
            if self.log_dir is not None:
                self.log_dir.mkdir(parents=True, exist_ok=True)
                out = open(self.log_dir / f"{wid}.log", "ab")
            try:
                env = {**child_env(self.settings), PROVISIONER_ENV: f"provisioner-{self.pool}"}
                if (verify_only := CommandKeys.from_env(env).verify_only()) is not None:
                    env[COMMAND_KEYS_ENV] = verify_only  # a worker reads commands: nothing that signs them
                worker_env(env, wid)  # and writes only its own events
                for name in WORKER_SASL_ENV:  # the provisioner's to hand out, not the worker's
                    env.pop(name, None)
                if self.worker_credentials is not None:
                    env[env_var("kafka.sasl_username")], env[env_var("kafka.sasl_password")] = self.worker_credentials
                self.procs[wid] = spawn(args, env, stdout=out,
                                        stderr=subprocess.STDOUT if out else None, stdin=subprocess.DEVNULL)
            finally:
                if out is not None:
                    out.close()
            log.info("provisioner: started %s (pid %d)", wid, self.procs[wid].pid)
            ids.append(wid)
        self._write_targets()
        return ids

    def _metrics_args(self, wid: str) -> list[str]:
        if self.metrics is None:
            return []
        host, first = self.metrics
        taken = set(self.ports.values())  # a worker's port stays its own until it is stopped
        port = next((p for p in range(first, 65536) if p not in taken and port_free(host, p)), None)
        if port is None:  # every port from the first is taken: the worker runs without an endpoint
            log.warning("provisioner: no free metrics port from %d for worker %s", first, wid)
            return []
        self.ports[wid] = port
        return ["--metrics-port", str(port), "--metrics-host", host]

    def _write_targets(self) -> None:
        """The running workers' metrics endpoints as a Prometheus file_sd file (written whole,
        then renamed: Prometheus never reads half of it)."""
        for wid in [w for w in self.ports if w not in self.procs]:
            del self.ports[wid]
        if self.targets is None or self.metrics is None:
            return
        doc = prometheus_targets(self.metrics[0], dict(sorted(self.ports.items())))
        part = self.targets.with_name(self.targets.name + ".part")
        part.write_text(json.dumps(doc, indent=2) + "\n")
        part.replace(self.targets)

    async def drain(self, worker_id: str) -> None:
        log.info("provisioner: %s draining", worker_id)

    async def reinstate(self, worker_id: str) -> None:
        log.info("provisioner: %s reinstated", worker_id)

    async def shutdown(self, worker_id: str) -> bool:
        proc = self.procs.pop(worker_id, None)
        if proc is None:
            return False
        await asyncio.to_thread(stop_in_order, [[proc]], self.stop_timeout_s)
        log.info("provisioner: stopped %s (rc %s)", worker_id, proc.returncode)
        self._write_targets()
        return True

    def running(self) -> list[str]:
        """Ids of the children still running."""
        return [w for w, p in self.procs.items() if p.poll() is None]

    def exited(self) -> dict[str, int]:
        """Children that exited without being asked to, with their return codes (forgotten here)."""
        gone = {w: p.returncode for w, p in self.procs.items() if p.poll() is not None}
        for w in gone:
            del self.procs[w]
        if gone:
            self._write_targets()
        return gone

    async def close(self) -> None:
        """Stop every child still running (all at once, each with its grace period)."""
        procs = list(self.procs.values())
        self.procs.clear()
        self._write_targets()  # none listed, before the wait: a provisioner stopped meanwhile leaves none
        log.info("provisioner: stopping %d workers", len(procs))
        await asyncio.to_thread(stop_in_order, [procs], self.stop_timeout_s)


class ProvisionerService:
    """Applies scaling commands to the store and the provisioner; retries pending shutdowns."""

    def __init__(self, provisioner: Provisioner, store: Any, publish: Callable[[r.Record], Any],
                 clock: Callable[[], float] = time.time, max_start: int = r.SCALE_OUT_MAX) -> None:
        self.provisioner = provisioner
        self.store = store
        self.publish = publish
        self.clock = clock
        self.max_start = max_start
        self.pending: set[str] = set()
        self.seen: set[str] = set()  # decision id / GPU type of the scale-outs carried out
        self.refused: set[str] = set()  # workers asked to stop that this provisioner did not start
        self.stopped: set[str] = set()  # workers this provisioner stopped (a Shutdown again is done)

    async def reject(self, rec: r.Record, reason: r.RejectReason, detail: str) -> None:
        """Refuse a command without acting on it: counted and reported as CommandRejected."""
        from streams.prom import metrics

        metrics().rejected.labels(reason).inc()
        await self.publish(r.CommandRejected(worker_id=f"provisioner-{self.provisioner.pool}", session_id="",
                                             command=rec.TAG, reason=reason, ts=self.clock(), detail=detail))

    async def handle(self, rec: r.Record) -> None:
        """Carry out one command; ValueError when the record is unusable (dead-letter it)."""
        if getattr(rec, "pool", None) != self.provisioner.pool:
            return  # another pool's provisioner
        if isinstance(rec, r.ScaleOut):
            if not 0 < rec.count <= self.max_start:
                raise ValueError(f"scale-out of {rec.count} workers: must be 1..{self.max_start}")
            key = f"{rec.decision_id}/{rec.gpu_type}"  # a decision boots each GPU type once
            if rec.decision_id and key in self.seen:  # a replay: refused, reported
                await self.reject(rec, "replayed", f"scale-out decision {rec.decision_id} ({rec.gpu_type}) was already carried out")
                return
            self.seen.add(key)
            await self.provisioner.start(rec.count, rec.gpu_type)
        elif isinstance(rec, (r.Drain, r.Shutdown)):
            if rec.worker_id in self.stopped:
                return  # delivered again: stopped (and deregistered) already
            try:
                await self.store.set_draining(rec.worker_id, True)
            except OwnershipError as exc:  # not registered (yet, or any more): nothing to close in the store
                log.info("provisioner: %s not marked draining: %s", rec.worker_id, exc)
            await self.provisioner.drain(rec.worker_id)
            if isinstance(rec, r.Shutdown):
                self.pending.add(rec.worker_id)
                await self.retry()
        elif isinstance(rec, r.Reinstate):
            if rec.worker_id in self.stopped or rec.worker_id in self.pending:  # its Shutdown came first
                await self.reject(rec, "stopping", f"{rec.worker_id} is being stopped: it is not reinstated")
                return
            try:
                await self.store.set_draining(rec.worker_id, False)
            except OwnershipError as exc:  # not registered (any more): nothing to reopen in the store
                log.info("provisioner: %s not reinstated in the store: %s", rec.worker_id, exc)
            await self.provisioner.reinstate(rec.worker_id)

    async def retry(self) -> None:
        """Stop every pending worker the store shows empty; the others wait for the next try."""
        if not self.pending:
            return
        view = await self.store.load_view()
        for wid in sorted(self.pending):
            load = view.get(wid)
            if load is not None and (load.used > 0 or await self.store.sessions_of(wid)):
                continue
            self.pending.discard(wid)
            if await self.provisioner.shutdown(wid):
                self.stopped.add(wid)
                if load is not None:
                    await self.store.deregister_worker(wid)
                await self.publish(r.WorkerDown(worker_id=wid, ts=self.clock(), reason="shutdown by provisioner"))
            elif wid not in self.refused:  # started elsewhere: said once, never retried
                self.refused.add(wid)
                await self.reject(r.Shutdown(pool=self.provisioner.pool, worker_id=wid, ts=self.clock()),
                                  "not-provisioned", f"{wid} was not started by this provisioner")

    async def reap(self) -> None:
        """Report children that died on their own."""
        exited = getattr(self.provisioner, "exited", None)
        for wid, rc in (exited() if exited else {}).items():
            log.warning("provisioner: %s exited on its own (rc %s)", wid, rc)
            await self.publish(r.WorkerDown(worker_id=wid, ts=self.clock(), reason=f"exited rc={rc}"))


def _credentials(settings: Settings) -> tuple[str, str] | None:
    """The workers' own SASL credentials from the environment; on SASL without them, a warning."""
    credentials = worker_credentials(os.environ)
    if credentials is None and settings.kafka.sasl_mechanism:
        log.warning("provisioner: the workers it starts sign in to Kafka as its own user %r, which the "
                    "ACL table gives no worker topic; set %s / %s to give them the worker's",
                    settings.kafka.sasl_username, *WORKER_SASL_ENV)
    return credentials


def _patient(store: Any, pool: str, stop_event: asyncio.Event) -> Any:
    """The store as the provisioner's loop uses it: a Redis outage is waited out, not the end
    of the provisioner and of its children (``workers.runtime.PatientStore``)."""
    from .runtime import PatientStore, StoreOutage

    outage = StoreOutage(f"provisioner {pool}",
                         meanwhile="scaling commands wait, its workers keep running; trying again until it answers")
    return PatientStore(store, outage, stop_event)


async def run_provisioner(settings: Settings, stop_event: asyncio.Event,
                          provisioner: Provisioner | None = None, *, retry_s: float = 1.0,
                          metrics: tuple[str, int] | None = None, targets: Path | None = None) -> None:
    """Consume ``scaling-commands`` in the provisioner group until ``stop_event`` is set.

    Without ``provisioner``, a :class:`LocalProcessProvisioner` for ``CHUNKSERVE_POOL``
    (default ``default``) starting workers of ``CHUNKSERVE_WORKER_CAPACITY`` slots (default 8),
    logging under ``CHUNKSERVE_LOG_DIR`` when set, as the Kafka principal of
    ``CHUNKSERVE_WORKER_KAFKA_SASL_USERNAME`` / ``_PASSWORD`` when set.
    """
    from streams.generations import GenerationStore
    from streams.kafka import RecordConsumer, RecordProducer
    from streams.topics import ensure_topics

    credentials = _credentials(settings) if provisioner is None else None
    catalogue = await ensure_topics(settings)
    store = GenerationStore.from_settings(settings)
    if provisioner is None:
        pool = os.environ.get("CHUNKSERVE_POOL") or "default"
        log_dir = os.environ.get("CHUNKSERVE_LOG_DIR")
        provisioner = LocalProcessProvisioner(
            settings, pool, capacity=env_number(os.environ, "CHUNKSERVE_WORKER_CAPACITY", 8, positive=True),
            first_index=next_index(pool, await store.load_view()),
            log_dir=Path(log_dir) if log_dir else None, worker_credentials=credentials,
            metrics=metrics, targets=targets)
    producer = await RecordProducer(settings, catalogue, client_id="provisioner").start()
    consumer = RecordConsumer(settings, [SCALING_COMMANDS], producer, name="provisioner",
                              group_id=f"{settings.topic_prefix}provisioner", catalogue=catalogue)
    service = ProvisionerService(provisioner, _patient(store, provisioner.pool, stop_event), producer.send)
    await consumer.start()
    next_retry = 0.0
    try:
        while not stop_event.is_set():
            for d in await consumer.poll(timeout_ms=200):
                if d.refused is not None:  # unsigned, unknown key or forged: never acted on
                    await service.reject(d.record, d.refused, "scaling command failed its authenticity check")
                    continue
                try:
                    await service.handle(d.record)
                except ValueError as exc:
                    await consumer.dead_letter(d.topic, d.partition, d.offset, encode(d.record), d.key,
                                               f"refused: {exc}")
            await consumer.commit()  # refused when the group moved on: they come again (all safe to repeat)
            if time.monotonic() >= next_retry:
                await service.retry()
                await service.reap()
                next_retry = time.monotonic() + retry_s
    finally:  # drain, then stop: no session is admitted on a worker that is going away
        for wid in getattr(provisioner, "running", list)():
            try:
                await store.set_draining(wid, True)
            except Exception as exc:  # Redis away: the workers stop all the same
                log.warning("provisioner: could not mark %s draining: %s", wid, exc)
        close = getattr(provisioner, "close", None)
        if close is not None:
            await close()
        await consumer.stop()
        await producer.stop()
        await store.aclose()
