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

Bounded footprint: a closed session's snapshot data goes at the close and its hash expires
``retention_s`` later (until then it refuses any commit or write as closed; after it the
session is unknown, so an open of that id starts a new session at epoch 1). A worker declared
down, not heard from for ``retention_s`` and holding no slot is deregistered by
``forget_down`` (dispatch's recovery sweep runs it); a deregistered worker leaves no key.

Cluster story: a commit must change a session's generation *and* two workers' slot counts
atomically, and on Redis Cluster one script reaches one slot. Any (session, worker) pair may
meet in a commit, so the only sound static layout is one slot for all ownership keys: the
store shards by namespace (run one namespace per pool or region to spread load). Per-session
tags would need a two-phase reservation with leases; we do not do that. Snapshot parts live
in the same slot because their writes are fenced by the generation in the same script; the
portable snapshot is the compact state (DESIGN.md §5), written in bounded parts.

The operations are sans-IO generators of script calls, run by the async ``GenerationStore``
or the blocking ``SyncGenerationStore``; ``generations_memory`` runs the same operations
against a pure-Python twin of the scripts.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from enum import Enum
from typing import Any, Iterable, NamedTuple

from schemas.errors import (
    ConfigError,
    InfraError,
    LimitError,
    NoCapacityError,
    NotOwnerError,
    OwnershipError,
    SnapshotCorruptError,
    StaleGenerationError,
    UnknownSessionError,
)
from schemas.records import Generation

from .config import Settings
from .store_backends import (SCRIPTS, Op, _AsyncBackend, _ClusterSlotBackend, _drive_async, _drive_sync, _s,
                             _SyncBackend)

__all__ = [
    "DEFAULT_PART_SIZE",
    "DEFAULT_RETENTION_S",
    "GenerationStore",
    "SyncGenerationStore",
    "Keys",
    "SessionView",
    "StoreState",
    "SnapshotManifest",
    "WorkerLoad",
    "SCRIPTS",
    "closed_error",
]

DEFAULT_PART_SIZE = 8 * 1024 * 1024
DEFAULT_MAX_SNAPSHOT_BYTES = Settings.max_snapshot_bytes
DEFAULT_RETENTION_S = Settings.store_retention_s


class StoreState(str, Enum):
    """A session's state as the store keeps it (field ``st``, written by the Lua scripts):
    the lifecycle's EXECUTION, SUSPENDED and TERMINATED (``processors.lifecycle.STORE_STATE``
    maps them; a test holds the scripts and the twin to these values)."""

    ACTIVE = "active"  # a generation holds a slot on its worker
    SUSPENDED = "suspended"  # offloaded: a snapshot and no slot
    CLOSED = "closed"  # terminated; refuses every commit and write


class WorkerLoad(NamedTuple):
    """One worker in the load view."""

    used: int
    capacity: int
    draining: bool
    down: bool = False  # declared dead and not heard from since


@dataclass(frozen=True, slots=True)
class SnapshotManifest:
    """A published snapshot: ``parts`` parts of ``snap_id``, ``size`` bytes in all."""

    snap_id: str
    parts: int
    size: int
    sha256: str
    epoch: int
    chunk_index: int | None = None
    input_seq: int | None = None


@dataclass(frozen=True, slots=True)
class SessionView:
    """Everything the store keeps for a session (a read: no authority implied)."""

    generation: Generation
    state: StoreState
    claimed: bool
    chunk_index: int | None
    input_seq: int | None
    snapshot: SnapshotManifest | None
    close_requested: bool = False  # the user closed it: it is never moved again
    stranded_epoch: int | None = None  # this epoch's owner was lost: a recovery is owed

    @property
    def stranded(self) -> bool:
        """The current generation's owner was lost and no new owner holds it yet."""
        return self.state == "active" and self.stranded_epoch == self.generation.epoch


class Keys:
    """The key layout above; ``{ns}`` is the one hash tag."""

    def __init__(self, namespace: str) -> None:
        if not namespace or any(c in namespace for c in "{}"):
            raise ConfigError("namespace", f"{namespace!r}: must be non-empty, without braces")
        self.tag = "{" + namespace + "}"
        self.workers = f"{self.tag}:workers"

    def session(self, sid: str) -> str:
        return f"{self.tag}:s:{sid}"

    def snapdata(self, sid: str) -> str:
        return f"{self.tag}:sd:{sid}"

    def slots(self, worker: str) -> str:
        return f"{self.tag}:ws:{worker}"

    @property
    def recovery(self) -> str:
        return f"{self.tag}:recover"


def _opt_int(v: Any) -> int | None:
    return None if v is None or _s(v) == "" else int(_s(v))


def closed_error(sid: str) -> UnknownSessionError:
    """Refusal for a terminated session (an UnknownSessionError whose message says closed)."""
    err = UnknownSessionError(sid)
    err.args = (f"session {sid}: closed (terminated); it cannot be committed or written again",)
    return err


def _error(reply: list[Any]) -> OwnershipError | SnapshotCorruptError:
    code, *rest = [_s(x) for x in reply[1:]]
    if code == "unknown_session":
        return UnknownSessionError(rest[0])
    if code == "closed":
        return closed_error(rest[0])
    if code == "stale_epoch":
        return StaleGenerationError(rest[0], int(rest[1]), int(rest[2]))
    if code == "not_owner":
        return NotOwnerError(rest[0], rest[1], rest[2])
    if code == "no_capacity":
        return NoCapacityError(rest[0], rest[1])
    if code == "missing_part":
        sid, snap, part = rest
        return SnapshotCorruptError(f"session {sid}: snapshot {snap} lost part {part} before commit")
    raise InfraError(f"generation store: unexpected script reply {reply!r}")


def _check(reply: list[Any]) -> list[Any]:
    if _s(reply[0]) != "ok":
        raise _error(reply)
    return reply


def _pairs(flat: list[Any]) -> dict[str, Any]:
    return {_s(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}


def _worker(w: str) -> str:
    if not isinstance(w, str) or not w:
        raise ValueError(f"worker id {w!r}: must be a non-empty string")
    return w


class _Ops:
    """The store's operations as generators of script calls (no I/O here)."""

    def __init__(self, namespace: str, part_size: int = DEFAULT_PART_SIZE,
                 max_snapshot_bytes: int = DEFAULT_MAX_SNAPSHOT_BYTES,
                 retention_s: float = DEFAULT_RETENTION_S) -> None:
        if part_size <= 0:
            raise ConfigError("part_size", f"{part_size}: must be positive")
        if not retention_s >= 0.001:
            raise ConfigError("store_retention_s", f"{retention_s}: must be positive")
        self.retention_s = retention_s
        self.keys = Keys(namespace)
        self.namespace = namespace
        self.part_size = part_size
        self.max_snapshot_bytes = max_snapshot_bytes
        self._owner_hint: dict[str, str] = {}  # last owner seen per session: saves a retry

    def _hint(self, sid: str, worker: str) -> None:
        if len(self._owner_hint) > 4096:
            self._owner_hint.clear()
        self._owner_hint[sid] = worker

    def register_worker(self, worker_id: str, capacity: int) -> Op:
        if int(capacity) < 0:
            raise ValueError(f"capacity {capacity}: must be >= 0")
        _check((yield "register_worker", [self.keys.workers], [_worker(worker_id), int(capacity)]))

    def set_draining(self, worker_id: str, draining: bool) -> Op:
        args = [_worker(worker_id), "1" if draining else "0"]
        _check((yield "set_draining", [self.keys.workers], args))

    def deregister_worker(self, worker_id: str, force: bool = False) -> Op:
        k = [self.keys.workers, self.keys.slots(_worker(worker_id))]
        reply = _check((yield "deregister_worker", k, [worker_id, "1" if force else "0"]))
        return sorted(_s(x) for x in reply[1:])

    def forget_down(self, now: float) -> Op:
        """Deregister the workers declared down ``retention_s`` before ``now`` or earlier and
        holding no slot; returns their ids."""
        flat = _pairs((yield "load_view", [self.keys.workers], []))
        cutoff = float(now) - self.retention_s
        gone = []
        for field, since in sorted(flat.items()):
            w = field[2:]
            if field.startswith("x:") and float(_s(since)) <= cutoff:
                reply = _check((yield "forget_worker", [self.keys.workers, self.keys.slots(w)], [w, repr(cutoff)]))
                if _s(reply[1]) == "1":
                    gone.append(w)
        return gone

    def load_view(self) -> Op:
        flat = _pairs((yield "load_view", [self.keys.workers], []))
        out = {}
        for field, cap in sorted(flat.items()):
            if field.startswith("c:"):
                w = field[2:]
                used, draining = int(_s(flat.get("u:" + w, 0))), _s(flat.get("d:" + w, "0")) == "1"
                out[w] = WorkerLoad(used, int(_s(cap)), draining, "x:" + w in flat)
        return out

    def set_down(self, worker_id: str, ts: float) -> Op:
        reply = _check((yield "set_down", [self.keys.workers], [_worker(worker_id), repr(float(ts))]))
        return _s(reply[1]) == "1"

    def set_up(self, worker_id: str, ts: float) -> Op:
        reply = _check((yield "set_up", [self.keys.workers], [_worker(worker_id), repr(float(ts))]))
        return _s(reply[1]) == "1"

    def strand(self, worker_id: str, now: float) -> Op:
        sids = yield from self.sessions_of(worker_id)
        if not sids:
            return 0
        keys = [self.keys.recovery] + [self.keys.session(sid) for sid in sids]
        reply = _check((yield "strand", keys, [worker_id, repr(float(now)), *sids]))
        return int(_s(reply[1]))

    def recovery_due(self, now: float, limit: int) -> Op:
        reply = yield "recovery_due", [self.keys.recovery], [repr(float(now)), int(limit)]
        due = [(_s(reply[i]), float(_s(reply[i + 1]))) for i in range(1, len(reply), 2)]
        return int(_s(reply[0])), due

    def recovery_mark(self, session_id: str, at: float | None) -> Op:
        _check((yield "recovery_mark", [self.keys.recovery],
                [session_id, "" if at is None else repr(float(at))]))

    def request_close(self, session_id: str) -> Op:
        _check((yield "request_close", [self.keys.session(session_id)], [session_id]))

    def sessions_of(self, worker_id: str) -> Op:
        return sorted(_s(x) for x in (yield "sessions_of", [self.keys.slots(_worker(worker_id))], []))

    def _commit(self, sid: str, expected: int, target: str, source: str) -> Op:
        guess = source or (self._owner_hint.get(sid, "") if expected else "")
        for _ in range(4):
            k = [self.keys.session(sid), self.keys.workers, self.keys.slots(target), self.keys.slots(guess)]
            reply = yield "commit", k, [sid, int(expected), target, source, guess]
            if _s(reply[0]) == "retry":
                guess = _s(reply[1])
                continue
            _check(reply)
            self._hint(sid, target)
            return Generation(target, int(_s(reply[2])))
        raise InfraError(f"session {sid}: owner kept changing under commit")

    def commit(self, session_id: str, expected_epoch: int, worker_id: str) -> Op:
        return (yield from self._commit(session_id, expected_epoch, _worker(worker_id), ""))

    def commit_migration(self, session_id: str, source: Generation, target_worker: str) -> Op:
        src = _worker(source.worker_id)
        return (yield from self._commit(session_id, source.epoch, _worker(target_worker), src))

    def _fenced(self, sid: str, gen: Generation) -> tuple[list[str], list[Any]]:
        _worker(gen.worker_id)
        return [self.keys.session(sid), self.keys.slots(gen.worker_id)], [sid, gen.worker_id, int(gen.epoch)]

    def claim(self, session_id: str, gen: Generation) -> Op:
        k, a = self._fenced(session_id, gen)
        _check((yield "claim", k, a))

    def revalidate(self, items: Iterable[tuple[str, Generation]]) -> Op:
        keys: list[str] = []
        args: list[Any] = []
        for sid, gen in items:
            k, a = self._fenced(sid, gen)
            keys += k
            args += a
        if not keys:
            return []
        return [(_s(r) == "ok", _s(r)) for r in (yield "revalidate", keys, args)]

    def release_chunks(self, items: Iterable[tuple[str, Generation, int]]) -> Op:
        keys: list[str] = []
        args: list[Any] = []
        for sid, gen, index in items:
            k, a = self._fenced(sid, gen)
            keys += k
            args += a + [int(index)]
        if not keys:
            return []
        return [(_s(r) == "ok", _s(r)) for r in (yield "release_chunks", keys, args)]

    def release(self, session_id: str, gen: Generation, close: bool = False) -> Op:
        k = [self.keys.session(session_id), self.keys.workers, self.keys.slots(gen.worker_id),
             self.keys.snapdata(session_id)]
        retention_ms = max(1, round(self.retention_s * 1000))
        _check((yield "release", k, [session_id, gen.worker_id, int(gen.epoch), "1" if close else "0", retention_ms]))

    def write_progress(self, session_id: str, gen: Generation, chunk_index: int | None = None,
                       input_seq: int | None = None) -> Op:
        k, a = self._fenced(session_id, gen)
        a += ["" if chunk_index is None else int(chunk_index), "" if input_seq is None else int(input_seq)]
        _check((yield "progress", k, a))

    def current(self, session_id: str) -> Op:
        view = yield from self.session(session_id)
        return None if view is None or view.state == "closed" else view.generation

    def session(self, session_id: str) -> Op:
        f = _pairs((yield "session", [self.keys.session(session_id)], []))
        if "e" not in f:
            return None
        gen = Generation(_s(f["w"]), int(_s(f["e"])))
        self._hint(session_id, gen.worker_id)
        snap = None
        if "sn_id" in f:
            snap = SnapshotManifest(_s(f["sn_id"]), int(_s(f["sn_n"])), int(_s(f["sn_size"])), _s(f["sn_sha"]),
                                    int(_s(f["sn_e"])), _opt_int(f.get("sn_ci")), _opt_int(f.get("sn_sq")))
        return SessionView(gen, StoreState(_s(f["st"])), _s(f.get("cl", "0")) == "1", _opt_int(f.get("ci")),
                           _opt_int(f.get("sq")), snap, _s(f.get("cr", "0")) == "1", _opt_int(f.get("rv")))

    def put_snapshot(self, session_id: str, gen: Generation, data: bytes, chunk_index: int | None = None,
                     input_seq: int | None = None) -> Op:
        data = bytes(data)
        if len(data) > self.max_snapshot_bytes:  # refused before anything is written
            raise LimitError(f"snapshot of session {session_id}", len(data), self.max_snapshot_bytes,
                             "max_snapshot_bytes")
        snap_id = f"{gen.epoch}.{uuid.uuid4().hex[:12]}"
        k, a = self._fenced(session_id, gen)
        k = k + [self.keys.snapdata(session_id)]
        n = max(1, -(-len(data) // self.part_size))
        for i in range(n):
            part = data[i * self.part_size:(i + 1) * self.part_size]
            _check((yield "snap_part", k, a + [f"{snap_id}:{i}", part]))
        sha = hashlib.sha256(data).hexdigest()
        extra = ["" if chunk_index is None else int(chunk_index), "" if input_seq is None else int(input_seq)]
        _check((yield "snap_commit", k, a + [snap_id, n, len(data), sha] + extra))
        return SnapshotManifest(snap_id, n, len(data), sha, gen.epoch, chunk_index, input_seq)

    def read_snapshot(self, session_id: str) -> Op:
        for _ in range(3):
            view = yield from self.session(session_id)
            if view is None or view.snapshot is None:
                return None
            m = view.snapshot
            if m.size > self.max_snapshot_bytes:  # never pull an unbounded blob into memory
                raise LimitError(f"stored snapshot of session {session_id}", m.size,
                                 self.max_snapshot_bytes, "max_snapshot_bytes")
            parts = []
            for i in range(m.parts):
                part = yield "snap_read", [self.keys.snapdata(session_id)], [f"{m.snap_id}:{i}"]
                if part is None:
                    break  # replaced by a newer snapshot under our feet: read the new manifest
                parts.append(part if isinstance(part, bytes) else _s(part).encode())
            else:
                data = b"".join(parts)
                if len(data) != m.size or hashlib.sha256(data).hexdigest() != m.sha256:
                    raise SnapshotCorruptError(f"session {session_id}: snapshot {m.snap_id} fails its checksum")
                return m, data
        raise SnapshotCorruptError(f"session {session_id}: snapshot parts kept vanishing while reading")


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
        import redis.asyncio

        return cls(redis.asyncio.Redis.from_url(url), namespace, **kwargs)

    @classmethod
    def from_settings(cls, settings: Settings) -> "GenerationStore":
        """The store of a deployment: its Redis (auth and TLS included), namespace and bounds;
        on a Redis Cluster (``redis.cluster``) the namespace's slot master, fenced writes
        acknowledged by ``redis.replica_acks`` replicas."""
        r = settings.redis
        if r.cluster == "on":
            backend = _ClusterSlotBackend(r.url, Keys(settings.namespace).workers, r.acks,
                                          r.replica_ack_timeout_ms, r.client_kwargs())
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

    async def recovery_mark(self, session_id: str, at: float | None) -> None:
        """Look at a queued session again at ``at``; None drops it from the queue."""
        await _drive_async(self._backend, self._ops.recovery_mark(session_id, at))

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

    async def sessions_of(self, worker_id: str) -> list[str]:
        """Sessions currently holding a slot on the worker (e.g. to recover a dead one)."""
        return await _drive_async(self._backend, self._ops.sessions_of(worker_id))

    async def commit(self, session_id: str, expected_epoch: int, worker_id: str) -> Generation:
        """Epoch e -> e+1 on ``worker_id`` iff stored epoch is e (0: none yet) and a slot is free."""
        return await _drive_async(self._backend, self._ops.commit(session_id, expected_epoch, worker_id))

    async def commit_migration(self, session_id: str, source: Generation, target_worker: str) -> Generation:
        """A commit that applies only while ``source`` is still the exact current generation."""
        op = self._ops.commit_migration(session_id, source, target_worker)
        return await _drive_async(self._backend, op)

    async def claim(self, session_id: str, gen: Generation) -> None:
        """The worker takes up ``gen``; refused unless current and holding its slot."""
        await _drive_async(self._backend, self._ops.claim(session_id, gen))

    async def revalidate(self, items: Iterable[tuple[str, Generation]]) -> list[tuple[bool, str]]:
        """One round trip: ``(ok, reason)`` per item; reason is "ok", a reason_code or "closed"."""
        return await _drive_async(self._backend, self._ops.revalidate(list(items)))

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

    async def set_chunk_index(self, session_id: str, gen: Generation, index: int) -> None:
        await self.write_progress(session_id, gen, chunk_index=index)

    async def set_input_seq(self, session_id: str, gen: Generation, seq: int) -> None:
        await self.write_progress(session_id, gen, input_seq=seq)

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

    def revalidate(self, items: Iterable[tuple[str, Generation]]) -> list[tuple[bool, str]]:
        return _drive_sync(self._backend, self._ops.revalidate(list(items)))

    def release(self, session_id: str, gen: Generation, close: bool = False) -> None:
        _drive_sync(self._backend, self._ops.release(session_id, gen, close))

    def write_progress(self, session_id: str, gen: Generation, chunk_index: int | None = None,
                       input_seq: int | None = None) -> None:
        _drive_sync(self._backend, self._ops.write_progress(session_id, gen, chunk_index, input_seq))

    def set_chunk_index(self, session_id: str, gen: Generation, index: int) -> None:
        self.write_progress(session_id, gen, chunk_index=index)

    def set_input_seq(self, session_id: str, gen: Generation, seq: int) -> None:
        self.write_progress(session_id, gen, input_seq=seq)

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
