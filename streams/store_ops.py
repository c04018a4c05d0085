"""The generation store's operations as sans-IO generators of script calls, and the mapping
of script refusals to errors. ``store_backends`` drives them against Redis,
``generations_memory`` against its in-memory twin of the scripts."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any, Iterable, Sequence

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
from .store_backends import Op, _s
from .store_records import Keys, LeaseAnswer, LeaseState, SessionView, SnapshotManifest, StoreState, WorkerLoad

MAX_SKIPPED = 256  # the latest seqs given up on that the store (and a snapshot) keeps per session

__all__ = ["DEFAULT_MAX_SNAPSHOT_BYTES", "DEFAULT_PART_SIZE", "DEFAULT_RETENTION_S", "MAX_SKIPPED", "closed_error",
           "untold_from"]

DEFAULT_PART_SIZE = 8 * 1024 * 1024
DEFAULT_MAX_SNAPSHOT_BYTES = Settings.max_snapshot_bytes
DEFAULT_RETENTION_S = Settings.store_retention_s


def untold_from(skipped: Sequence[int]) -> int:
    """Below which seq a list of seqs given up on, as the store or a snapshot keeps it, no
    longer tells an input given up on from one applied: the list is full (it keeps only the
    latest ``MAX_SKIPPED``), so older ones may have dropped out of it; 0 when it is not."""
    return min(skipped) if len(skipped) >= MAX_SKIPPED else 0


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
    if code == StoreState.CLOSED:  # a closed or close-requested session, refused by the state's name
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

    def recovery_mark(self, session_id: str, at: float | None, expected: float | None = None) -> Op:
        reply = _check((yield "recovery_mark", [self.keys.recovery],
                        [session_id, "" if at is None else repr(float(at)),
                         "" if expected is None else repr(float(expected))]))
        return _s(reply[1]) == "1"

    def recovery_take(self, session_id: str, now: float, until: float) -> Op:
        reply = _check((yield "recovery_take", [self.keys.recovery],
                        [session_id, repr(float(now)), repr(float(until))]))
        return _s(reply[1]) == "1"

    def request_close(self, session_id: str) -> Op:
        _check((yield "request_close", [self.keys.session(session_id)], [session_id]))

    def acquire_lease(self, name: str, token: str, ttl_ms: int) -> Op:
        if not name or not token or int(ttl_ms) <= 0:
            raise ValueError(f"lease {name!r} for {token!r}, {ttl_ms} ms: needs a name, a token and a positive time")
        reply = yield "acquire_lease", [self.keys.lease(name)], [token, int(ttl_ms)]
        return LeaseAnswer(LeaseState(_s(reply[0])), _s(reply[1]), int(_s(reply[2])))

    def bind_log(self, prefix: str, end: int, retained: bool, adopt: bool = False) -> Op:
        reply = yield "bind_log", [self.keys.logs, self.keys.workers], [prefix, int(end), int(retained), int(adopt)]
        return _s(reply[0]), int(_s(reply[1]))

    def release_lease(self, name: str, token: str) -> Op:
        reply = _check((yield "release_lease", [self.keys.lease(name)], [token]))
        return _s(reply[1]) == "1"

    def sessions_of(self, worker_id: str) -> Op:
        return sorted(_s(x) for x in (yield "sessions_of", [self.keys.slots(_worker(worker_id))], []))

    def _commit(self, sid: str, expected: int, target: str, source: str, opened_by: str = "") -> Op:
        guess = source or (self._owner_hint.get(sid, "") if expected else "")
        for _ in range(4):
            k = [self.keys.session(sid), self.keys.workers, self.keys.slots(target), self.keys.slots(guess)]
            reply = yield "commit", k, [sid, int(expected), target, source, guess, str(opened_by)[:200]]
            if _s(reply[0]) == "retry":
                guess = _s(reply[1])
                continue
            _check(reply)
            self._hint(sid, target)
            return Generation(target, int(_s(reply[2])))
        raise InfraError(f"session {sid}: owner kept changing under commit")

    def commit(self, session_id: str, expected_epoch: int, worker_id: str, opened_by: str = "") -> Op:
        return (yield from self._commit(session_id, expected_epoch, _worker(worker_id), "", opened_by))

    def commit_migration(self, session_id: str, source: Generation, target_worker: str) -> Op:
        src = _worker(source.worker_id)
        return (yield from self._commit(session_id, source.epoch, _worker(target_worker), src))

    def _fenced(self, sid: str, gen: Generation) -> tuple[list[str], list[Any]]:
        _worker(gen.worker_id)
        return [self.keys.session(sid), self.keys.slots(gen.worker_id)], [sid, gen.worker_id, int(gen.epoch)]

    def claim(self, session_id: str, gen: Generation) -> Op:
        k, a = self._fenced(session_id, gen)
        _check((yield "claim", k, a))

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
                       input_seq: int | None = None, skipped: Sequence[int] | None = None) -> Op:
        k, a = self._fenced(session_id, gen)
        a += ["" if chunk_index is None else int(chunk_index), "" if input_seq is None else int(input_seq),
              "" if skipped is None else ",".join(str(int(x)) for x in skipped[-MAX_SKIPPED:])]
        _check((yield "progress", k, a))

    def current(self, session_id: str) -> Op:
        view = yield from self.session(session_id)
        return None if view is None or view.state == StoreState.CLOSED else view.generation

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
        skipped = tuple(int(x) for x in _s(f.get("sk", "")).split(",") if x)
        return SessionView(gen, StoreState(_s(f["st"])), _s(f.get("cl", "0")) == "1", _opt_int(f.get("ci")),
                           _opt_int(f.get("sq")), snap, _s(f.get("cr", "0")) == "1", _opt_int(f.get("rv")), skipped,
                           _s(f.get("op", "")))

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

