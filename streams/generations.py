"""The generation store: who may execute a session right now (DESIGN.md §3, DHSched).

Every check-and-change is one Lua script (``streams/lua/``), loaded with SCRIPT LOAD and run
by EVALSHA (reloaded on NOSCRIPT), so capacity admission, the epoch CAS and the slot moves
happen in one atomic step.

Key layout, all under one hash tag per namespace so each script touches one cluster slot::

    {ns}:s:<session>    hash: w, e (epoch), st (active|suspended|closed), cl (claimed),
                        ci (chunk index), sq (input seq), sn_* (snapshot manifest),
                        cr (close requested), rv (the epoch that owes a recovery)
    {ns}:sd:<session>   hash: snapshot parts, field "<snap id>:<i>"
    {ns}:workers        hash: c:<w> capacity, d:<w> draining, u:<w> slots used,
                        x:<w> declared down at (Unix seconds)
    {ns}:ws:<worker>    set: sessions holding a slot on the worker
    {ns}:recover        sorted set: sessions owing a recovery, scored by when to look next
    {ns}:lease:<name>   string: the token of the one live holder of ``name`` (``worker:<id>``),
                        expiring unless refreshed (``streams.lease``)

Bounded footprint: a closed session's snapshot data goes at the close and its hash expires
``retention_s`` later (until then it refuses any commit or write as closed; after it the
session is unknown, so an open of that id starts a new session at epoch 1). A worker declared
down, not heard from for ``retention_s`` and holding no slot is deregistered by
``forget_down`` (dispatch's recovery sweep runs it); a deregistered worker leaves no key. A
lease expires by itself once its holder stops refreshing it.

Cluster story: a commit must change a session's generation *and* two workers' slot counts
atomically, and on Redis Cluster one script reaches one slot. Any (session, worker) pair may
meet in a commit, so the only sound static layout is one slot for all ownership keys: the
store shards by namespace (run one namespace per pool or region to spread load). Per-session
tags would need a two-phase reservation with leases; we do not do that. Snapshot parts live
in the same slot because their writes are fenced by the generation in the same script; the
portable snapshot is the compact state (DESIGN.md §5), written in bounded parts.

The operations (``store_ops``) are sans-IO generators of script calls, run through a backend
(``store_backends``) by the async ``GenerationStore`` or the blocking ``SyncGenerationStore``
below; the records they return are in ``store_records``. ``generations_memory`` runs the same
operations against a pure-Python twin of the scripts.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from schemas.records import Generation

from .config import Settings, redis_client
from .store_backends import SCRIPTS, _AsyncBackend, _ClusterSlotBackend, _drive_async, _drive_sync, _SyncBackend
from .store_ops import DEFAULT_MAX_SNAPSHOT_BYTES, DEFAULT_PART_SIZE, DEFAULT_RETENTION_S, _Ops, closed_error
from .store_records import Keys, LeaseAnswer, LeaseState, SessionView, SnapshotManifest, StoreState, WorkerLoad

__all__ = [
    "DEFAULT_PART_SIZE",
    "DEFAULT_RETENTION_S",
    "GenerationStore",
    "SyncGenerationStore",
    "Keys",
    "LeaseAnswer",
    "LeaseState",
    "SessionView",
    "StoreState",
    "SnapshotManifest",
    "WorkerLoad",
    "SCRIPTS",
    "closed_error",
]


class GenerationStore:
    """Async generation store on a ``redis.asyncio`` client (decode_responses=False).

    Refusals raise: StaleGenerationError (epoch moved), NotOwnerError (another worker's
    generation), NoCapacityError (target full / draining / unregistered, or the generation no
    longer holds a slot), UnknownSessionError (no generation; or closed, see ``closed_error``).
    """

    def __init__(self, client: Any, namespace: str, *, part_size: int = DEFAULT_PART_SIZE,
                 backend: Any = None, max_snapshot_bytes: int = DEFAULT_MAX_SNAPSHOT_BYTES,
                 retention_s: float = DEFAULT_RETENTION_S) -> None:
        self._ops = _Ops(namespace, part_size, max_snapshot_bytes, retention_s)
        self._backend = backend if backend is not None else _AsyncBackend(client)
        self.client = client

    @classmethod
    def from_url(cls, url: str, namespace: str, **kwargs: Any) -> "GenerationStore":
        return cls(redis_client(url), namespace, **kwargs)

    @classmethod
    def from_settings(cls, settings: Settings) -> "GenerationStore":
        """The store of a deployment: its Redis (auth and TLS included), namespace and bounds;
        on a Redis Cluster (``redis.cluster``) the namespace's slot master, fenced writes
        acknowledged by ``redis.replica_acks`` replicas."""
        r = settings.redis
        if r.cluster == "on":
            backend = _ClusterSlotBackend(r.url, Keys(settings.namespace).workers, r.acks,
                                          r.replica_ack_timeout_ms, r.client_kwargs(), seeds=r.seed_nodes())
            return cls(None, settings.namespace, backend=backend, max_snapshot_bytes=settings.max_snapshot_bytes,
                       retention_s=settings.store_retention_s)
        return cls(r.async_client(), settings.namespace, max_snapshot_bytes=settings.max_snapshot_bytes,
                   retention_s=settings.store_retention_s)

    @property
    def keys(self) -> Keys:
        return self._ops.keys

    def for_namespace(self, namespace: str) -> "GenerationStore":
        """A store on another namespace sharing this one's client and loaded scripts (on a
        cluster: the same seeds and settings, that namespace's slot)."""
        backend = self._backend
        if isinstance(backend, _ClusterSlotBackend):
            backend = backend.for_key(Keys(namespace).workers)
        return GenerationStore(self.client, namespace, part_size=self._ops.part_size, backend=backend,
                               max_snapshot_bytes=self._ops.max_snapshot_bytes, retention_s=self._ops.retention_s)

    async def aclose(self) -> None:
        if self.client is not None:
            await self.client.aclose()
        if isinstance(self._backend, _ClusterSlotBackend):
            await self._backend.aclose()

    async def register_worker(self, worker_id: str, capacity: int) -> None:
        """Add a worker or set its capacity (refused below the slots in use)."""
        await _drive_async(self._backend, self._ops.register_worker(worker_id, capacity))

    async def set_draining(self, worker_id: str, draining: bool) -> None:
        """A draining worker keeps its sessions but admits no new commit."""
        await _drive_async(self._backend, self._ops.set_draining(worker_id, draining))

    async def set_down(self, worker_id: str, ts: float) -> bool:
        """Declare a worker dead at ``ts``: no commit targets it until ``set_up`` with a later
        time. False when it is not registered (a clean shutdown deregistered it)."""
        return await _drive_async(self._backend, self._ops.set_down(worker_id, ts))

    async def set_up(self, worker_id: str, ts: float) -> bool:
        """A sign of life at ``ts``: clears a down mark set before it (True when cleared)."""
        return await _drive_async(self._backend, self._ops.set_up(worker_id, ts))

    async def strand(self, worker_id: str, now: float) -> int:
        """Queue every session still active on the worker for recovery of its current epoch;
        returns how many were newly queued (one already owing that epoch keeps its place)."""
        return await _drive_async(self._backend, self._ops.strand(worker_id, now))

    async def recovery_due(self, now: float, limit: int = 64) -> tuple[int, list[tuple[str, float]]]:
        """The recovery queue's size and its entries due by ``now``, earliest first."""
        return await _drive_async(self._backend, self._ops.recovery_due(now, limit))

    async def recovery_mark(self, session_id: str, at: float | None, expected: float | None = None) -> bool:
        """Look at a queued session again at ``at``; None drops it from the queue. With
        ``expected`` (the entry's time as read), only while the entry is still that one: a
        session queued again meanwhile keeps its newer entry. Whether it was marked."""
        return await _drive_async(self._backend, self._ops.recovery_mark(session_id, at, expected))

    async def recovery_take(self, session_id: str, now: float, until: float) -> bool:
        """Take a queued session due by ``now`` for this replica until ``until`` (its next look
        moves there): True for the one replica that took it, False when it is not queued or
        not due (another replica took it). A step with effects outside the store (dead
        letters) is carried out by one replica, and again after ``until`` if that one died."""
        return await _drive_async(self._backend, self._ops.recovery_take(session_id, now, until))

    async def request_close(self, session_id: str) -> None:
        """The user closed the session: commits refuse it from now on (UnknownSessionError
        when the session was never opened)."""
        await _drive_async(self._backend, self._ops.request_close(session_id))

    async def deregister_worker(self, worker_id: str, force: bool = False) -> list[str]:
        """Remove a worker; only when it holds no slot unless ``force``. Returns dropped sessions."""
        return await _drive_async(self._backend, self._ops.deregister_worker(worker_id, force))

    async def forget_down(self, now: float) -> list[str]:
        """Deregister the workers declared down at least ``retention_s`` before ``now`` that
        hold no slot (a sign of life since clears the mark); returns their ids."""
        return await _drive_async(self._backend, self._ops.forget_down(now))

    async def load_view(self) -> dict[str, WorkerLoad]:
        """``{worker_id: (used, capacity, draining)}``, for ranking candidates (advisory)."""
        return await _drive_async(self._backend, self._ops.load_view())

    async def acquire_lease(self, name: str, token: str, ttl_ms: int) -> LeaseAnswer:
        """Take the lease ``name`` for ``token``, or refresh it when ``token`` holds it: it
        expires ``ttl_ms`` from now. Held by another token: that holder and its time left."""
        return await _drive_async(self._backend, self._ops.acquire_lease(name, token, ttl_ms))

    async def bind_log(self, prefix: str, end: int, retained: bool, adopt: bool = False) -> tuple[str, int]:
        """Check that this store serves the log of topic prefix ``prefix`` whose
        ``session-events`` end offsets now sum to ``end`` (``retained``: some record is still
        in it), and record ``end``: ``("ok", recorded before)``, ``("behind", recorded)``
        when the store served a longer log (the topics were made anew), or ``("unknown", 0)``
        when the log holds records the store knows nothing of (``adopt`` takes it anyway)."""
        return await _drive_async(self._backend, self._ops.bind_log(prefix, end, retained, adopt))

    async def release_lease(self, name: str, token: str) -> bool:
        """Delete the lease while ``token`` holds it (True when it did)."""
        return await _drive_async(self._backend, self._ops.release_lease(name, token))

    async def sessions_of(self, worker_id: str) -> list[str]:
        """Sessions currently holding a slot on the worker (e.g. to recover a dead one)."""
        return await _drive_async(self._backend, self._ops.sessions_of(worker_id))

    async def commit(self, session_id: str, expected_epoch: int, worker_id: str, opened_by: str = "") -> Generation:
        """Epoch e -> e+1 on ``worker_id`` iff stored epoch is e (0: none yet) and a slot is free;
        a first commit keeps ``opened_by`` (where its open sits: ``SessionView.opened_by``)."""
        return await _drive_async(self._backend, self._ops.commit(session_id, expected_epoch, worker_id, opened_by))

    async def commit_migration(self, session_id: str, source: Generation, target_worker: str) -> Generation:
        """A commit that applies only while ``source`` is still the exact current generation."""
        op = self._ops.commit_migration(session_id, source, target_worker)
        return await _drive_async(self._backend, op)

    async def claim(self, session_id: str, gen: Generation) -> None:
        """The worker takes up ``gen``; refused unless current and holding its slot."""
        await _drive_async(self._backend, self._ops.claim(session_id, gen))

    async def release_chunks(self, items: Iterable[tuple[str, Generation, int]]) -> list[tuple[bool, str]]:
        """Revalidate a batch and advance each released chunk index, in one round trip:
        ``(ok, reason)`` per item; reason "released" means an earlier owner released it."""
        return await _drive_async(self._backend, self._ops.release_chunks(list(items)))

    async def release(self, session_id: str, gen: Generation, close: bool = False) -> None:
        """Free the slot of the current ``gen`` (suspended); ``close`` terminates for good."""
        await _drive_async(self._backend, self._ops.release(session_id, gen, close))

    async def write_progress(self, session_id: str, gen: Generation, chunk_index: int | None = None,
                             input_seq: int | None = None) -> None:
        """Fenced write of the chunk index and/or the last applied input seq."""
        await _drive_async(self._backend, self._ops.write_progress(session_id, gen, chunk_index, input_seq))

    async def set_input_seq(self, session_id: str, gen: Generation, seq: int,
                            skipped: Sequence[int] | None = None) -> None:
        """The last input applied (fenced); with ``skipped``, the seqs given up on so far."""
        await _drive_async(self._backend, self._ops.write_progress(session_id, gen, None, seq, skipped))

    async def current(self, session_id: str) -> Generation | None:
        """The current generation; None when unknown or closed."""
        return await _drive_async(self._backend, self._ops.current(session_id))

    async def session(self, session_id: str) -> SessionView | None:
        """Everything stored for the session, or None."""
        return await _drive_async(self._backend, self._ops.session(session_id))

    async def put_snapshot(self, session_id: str, gen: Generation, data: bytes, chunk_index: int | None = None,
                           input_seq: int | None = None) -> SnapshotManifest:
        """Fenced, part by part (``part_size``), then a fenced manifest with sha256 and count."""
        return await _drive_async(self._backend,
                                  self._ops.put_snapshot(session_id, gen, data, chunk_index, input_seq))

    async def read_snapshot(self, session_id: str) -> tuple[SnapshotManifest, bytes] | None:
        """The last published snapshot, checksum-verified (SnapshotCorruptError), or None."""
        return await _drive_async(self._backend, self._ops.read_snapshot(session_id))


class SyncGenerationStore:
    """The same store, blocking, on a sync ``redis.Redis`` client (CLIs, tests, studies)."""

    def __init__(self, client: Any, namespace: str, *, part_size: int = DEFAULT_PART_SIZE,
                 backend: Any = None, max_snapshot_bytes: int = DEFAULT_MAX_SNAPSHOT_BYTES,
                 retention_s: float = DEFAULT_RETENTION_S) -> None:
        self._ops = _Ops(namespace, part_size, max_snapshot_bytes, retention_s)
        self._backend = backend if backend is not None else _SyncBackend(client)
        self.client = client

    @classmethod
    def from_url(cls, url: str, namespace: str, **kwargs: Any) -> "SyncGenerationStore":
        import redis

        return cls(redis.Redis.from_url(url), namespace, **kwargs)

    @property
    def keys(self) -> Keys:
        return self._ops.keys

    def for_namespace(self, namespace: str) -> "SyncGenerationStore":
        """A store on another namespace sharing this one's client and loaded scripts."""
        return SyncGenerationStore(self.client, namespace, part_size=self._ops.part_size,
                                   backend=self._backend, max_snapshot_bytes=self._ops.max_snapshot_bytes,
                                   retention_s=self._ops.retention_s)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()

    def register_worker(self, worker_id: str, capacity: int) -> None:
        _drive_sync(self._backend, self._ops.register_worker(worker_id, capacity))

    def set_draining(self, worker_id: str, draining: bool) -> None:
        _drive_sync(self._backend, self._ops.set_draining(worker_id, draining))

    def deregister_worker(self, worker_id: str, force: bool = False) -> list[str]:
        return _drive_sync(self._backend, self._ops.deregister_worker(worker_id, force))

    def set_down(self, worker_id: str, ts: float) -> bool:
        return _drive_sync(self._backend, self._ops.set_down(worker_id, ts))

    def set_up(self, worker_id: str, ts: float) -> bool:
        return _drive_sync(self._backend, self._ops.set_up(worker_id, ts))

    def forget_down(self, now: float) -> list[str]:
        return _drive_sync(self._backend, self._ops.forget_down(now))

    def load_view(self) -> dict[str, WorkerLoad]:
        return _drive_sync(self._backend, self._ops.load_view())

    def acquire_lease(self, name: str, token: str, ttl_ms: int) -> LeaseAnswer:
        return _drive_sync(self._backend, self._ops.acquire_lease(name, token, ttl_ms))

    def bind_log(self, prefix: str, end: int, retained: bool, adopt: bool = False) -> tuple[str, int]:
        return _drive_sync(self._backend, self._ops.bind_log(prefix, end, retained, adopt))

    def release_lease(self, name: str, token: str) -> bool:
        return _drive_sync(self._backend, self._ops.release_lease(name, token))

    def sessions_of(self, worker_id: str) -> list[str]:
        return _drive_sync(self._backend, self._ops.sessions_of(worker_id))

    def commit(self, session_id: str, expected_epoch: int, worker_id: str) -> Generation:
        return _drive_sync(self._backend, self._ops.commit(session_id, expected_epoch, worker_id))

    def commit_migration(self, session_id: str, source: Generation, target_worker: str) -> Generation:
        return _drive_sync(self._backend, self._ops.commit_migration(session_id, source, target_worker))

    def claim(self, session_id: str, gen: Generation) -> None:
        _drive_sync(self._backend, self._ops.claim(session_id, gen))

    def release_chunks(self, items: Iterable[tuple[str, Generation, int]]) -> list[tuple[bool, str]]:
        return _drive_sync(self._backend, self._ops.release_chunks(list(items)))


    def release(self, session_id: str, gen: Generation, close: bool = False) -> None:
        _drive_sync(self._backend, self._ops.release(session_id, gen, close))

    def write_progress(self, session_id: str, gen: Generation, chunk_index: int | None = None,
                       input_seq: int | None = None) -> None:
        _drive_sync(self._backend, self._ops.write_progress(session_id, gen, chunk_index, input_seq))

    def set_input_seq(self, session_id: str, gen: Generation, seq: int, skipped: Sequence[int] | None = None) -> None:
        _drive_sync(self._backend, self._ops.write_progress(session_id, gen, None, seq, skipped))

    def current(self, session_id: str) -> Generation | None:
        return _drive_sync(self._backend, self._ops.current(session_id))

    def session(self, session_id: str) -> SessionView | None:
        return _drive_sync(self._backend, self._ops.session(session_id))

    def put_snapshot(self, session_id: str, gen: Generation, data: bytes, chunk_index: int | None = None,
                     input_seq: int | None = None) -> SnapshotManifest:
        op = self._ops.put_snapshot(session_id, gen, data, chunk_index, input_seq)
        return _drive_sync(self._backend, op)

    def read_snapshot(self, session_id: str) -> tuple[SnapshotManifest, bytes] | None:
        return _drive_sync(self._backend, self._ops.read_snapshot(session_id))
