"""The cluster view: a pure fold of the log into what the policy needs to see.

``apply(view, record) -> view`` folds session events, worker events, scaling commands and
the control plane's own ``Handoff`` commands. Delivery is at-least-once and records of
different keys (and topics) arrive in any interleaving, so every field is either a join
(a max over timestamps, epochs or tuples: commutative and idempotent) or, for the session
lifecycle, driven by per-session ordered events with duplicates dropped by timestamp.
Replaying the same records therefore rebuilds the same view. Nothing here is authoritative:
ownership lives in Redis; the view only feeds decisions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Collection, Iterable

from processors.latency import LatencyModel
from processors.lifecycle import EVENT_KIND, REFUSED_UNKNOWN, EventKind, SessionState, transition
from processors.snapshot import Gpu, GpuState, Session, Snapshot
from schemas import records as r

__all__ = ["latest_claims", "gpu_type_of", 
    "WorkerInfo",
    "SessionInfo",
    "ClusterView",
    "apply",
    "apply_all",
    "to_snapshot",
    "dead_workers",
    "current_generation",
    "prune",
    "BOOTING_PREFIX",
]

_NEVER = -math.inf
BOOTING_PREFIX = "booting:"  # ids of placeholder GPUs for workers still booting



@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One worker as the log tells it; each tuple is the max seen (ts first)."""

    id: str
    up: tuple[float, int, str, str] = (_NEVER, 0, "cpu", "default")  # ts, capacity, gpu_type, pool
    beat: tuple[float, float, int, int, int] = (_NEVER, 0.0, 0, 0, 0)  # ts, latency, sessions, executing, capacity
    down_ts: float = _NEVER
    drain_ts: float = _NEVER
    reinstate_ts: float = _NEVER  # a Reinstate after the last Drain calls the drain off
    shutdown_ts: float = _NEVER
    provisioned_ts: float = _NEVER  # when a provisioner announced it (WorkerProvisioned)

    @property
    def provisioned(self) -> bool:
        """A provisioner started it and can stop it; else it was started outside chunkserve."""
        return self.provisioned_ts > _NEVER

    @property
    def last_seen(self) -> float:
        return max(self.up[0], self.beat[0])

    @property
    def alive(self) -> bool:
        """Up (WorkerUp or a heartbeat) more recently than any WorkerDown."""
        return self.last_seen > self.down_ts

    @property
    def state(self) -> GpuState:
        """READY once up; DRAINING after a Drain issued since it came up and not called off
        by a later Reinstate."""
        return GpuState.DRAINING if self.drain_ts >= self.up[0] and self.drain_ts > self.reinstate_ts else GpuState.READY

    @property
    def capacity(self) -> int:
        """Slots, from the most recent WorkerUp or heartbeat."""
        return self.beat[4] if self.beat[0] > self.up[0] else self.up[1]

    @property
    def gpu_type(self) -> str:
        return self.up[2]

    @property
    def pool(self) -> str:
        return self.up[3]

    @property
    def chunk_latency_s(self) -> float:
        return self.beat[1]


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """One session: lifecycle (from session events) and ownership (from worker events).

    ``owner`` is the highest ``(epoch, worker)`` claimed or named as a successor;
    ``released`` the highest epoch released. The session is on its owner's GPU while
    ``owner`` epoch > ``released``. ``handoff`` is the last migration this control plane
    asked for: ``(epoch, target, ts)``.
    """

    id: str
    lifecycle: SessionState | None = None
    last_event: float = _NEVER  # the latest session event's time
    changed: float = _NEVER  # the time of the event that last changed its lifecycle state (its idle age starts there)
    state_bytes: int = 0
    owner: tuple[int, str] = (0, "")
    released: int = 0
    handoff: tuple[int, str, float] | None = None

    @property
    def placed_on(self) -> str | None:
        """The worker holding the session's current generation, if it holds it."""
        return self.owner[1] if self.owner[0] > self.released else None


@dataclass(frozen=True)
class ClusterView:
    """Workers, sessions and recent scale-outs (``decision_id -> (ts, pool, gpu_type, count)``).

    Treat as immutable: ``apply`` returns a new view and never mutates the dicts.
    """

    workers: dict[str, WorkerInfo] = field(default_factory=dict)
    sessions: dict[str, SessionInfo] = field(default_factory=dict)
    scale_outs: dict[str, tuple[float, str, str, int]] = field(default_factory=dict)
    last_scale_ts: float = _NEVER


def _worker(view: ClusterView, wid: str, **changes: object) -> ClusterView:
    old = view.workers.get(wid) or WorkerInfo(wid)
    return replace(view, workers={**view.workers, wid: replace(old, **changes)})  # type: ignore[arg-type]


def _session(view: ClusterView, sid: str, **changes: object) -> ClusterView:
    old = view.sessions.get(sid) or SessionInfo(sid)
    return replace(view, sessions={**view.sessions, sid: replace(old, **changes)})  # type: ignore[arg-type]


def _on_session_event(view: ClusterView, rec: r.Record, kind: EventKind) -> ClusterView:
    sid, ts = rec.session_id, rec.ts  # type: ignore[attr-defined]
    known = view.sessions.get(sid)
    if known is None and kind in REFUSED_UNKNOWN:
        return view  # dispatch refuses an idle or close of a session it does not know: so does the view
    old = known or SessionInfo(sid)
    # in the log's order, as dispatch takes them, whatever their times (a skewed producer's
    # close stamped before its open was dropped here as a stale redelivery while dispatch
    # closed the session); a redelivery repeats a stretch of the log in order, and the table
    # lands where the stretch left it
    nxt, _ = transition(old.lifecycle, kind)
    size = rec.state_bytes if isinstance(rec, r.SessionOpened) and rec.state_bytes else old.state_bytes
    changed = old.changed if nxt is old.lifecycle else ts  # a duplicate leaves its age as it is
    return _session(view, sid, lifecycle=nxt, last_event=max(ts, old.last_event), changed=changed, state_bytes=size)


def apply(view: ClusterView, rec: r.Record) -> ClusterView:
    """Fold one record into the view; records the view does not track leave it unchanged."""
    match rec:
        case r.SessionOpened() | r.SessionActive() | r.SessionIdle() | r.SessionClosed():
            return _on_session_event(view, rec, EVENT_KIND[type(rec)])
        case r.WorkerUp() | r.Heartbeat() | r.WorkerDown() | r.WorkerProvisioned():
            return _on_worker(view, rec)
        case r.Claimed() | r.Released() | r.Handoff():
            return _on_owner(view, rec)
        case r.ScaleOut(decision_id=did, pool=pool, ts=ts):
            key = f"{did}/{rec.gpu_type}" if did else f"{pool}@{ts!r}"
            entry = max(view.scale_outs.get(key, (_NEVER, "", "", 0)), (ts, pool, rec.gpu_type, rec.count))
            return replace(view, scale_outs={**view.scale_outs, key: entry},
                           last_scale_ts=max(view.last_scale_ts, ts))
        case r.Drain(worker_id=wid, ts=ts):
            w = view.workers.get(wid) or WorkerInfo(wid)
            view = _worker(view, wid, drain_ts=max(w.drain_ts, ts))
            return replace(view, last_scale_ts=max(view.last_scale_ts, ts))
        case r.Reinstate(worker_id=wid, ts=ts):
            w = view.workers.get(wid) or WorkerInfo(wid)
            view = _worker(view, wid, reinstate_ts=max(w.reinstate_ts, ts))
            return replace(view, last_scale_ts=max(view.last_scale_ts, ts))
        case r.Shutdown(worker_id=wid, ts=ts):
            w = view.workers.get(wid) or WorkerInfo(wid)
            return _worker(view, wid, shutdown_ts=max(w.shutdown_ts, ts))
    return view


def _on_worker(view: ClusterView, rec: r.WorkerUp | r.Heartbeat | r.WorkerDown | r.WorkerProvisioned) -> ClusterView:
    w = view.workers.get(rec.worker_id) or WorkerInfo(rec.worker_id)
    match rec:
        case r.WorkerUp():
            return _worker(view, rec.worker_id, up=max(w.up, (rec.ts, rec.capacity, rec.gpu_type, rec.pool)))
        case r.Heartbeat():
            beat = max(w.beat, (rec.ts, rec.chunk_latency_s, rec.sessions, rec.executing, rec.capacity))
            return _worker(view, rec.worker_id, beat=beat)
        case r.WorkerDown():
            return _worker(view, rec.worker_id, down_ts=max(w.down_ts, rec.ts))
    return _worker(view, rec.worker_id, provisioned_ts=max(w.provisioned_ts, rec.ts))


def _on_owner(view: ClusterView, rec: r.Claimed | r.Released | r.Handoff) -> ClusterView:
    s = view.sessions.get(rec.session_id) or SessionInfo(rec.session_id)
    gen = rec.generation
    match rec:
        case r.Claimed():
            return _session(view, rec.session_id, owner=max(s.owner, (gen.epoch, gen.worker_id)))
        case r.Released(successor=succ):
            owner = s.owner if succ is None else max(s.owner, (succ.epoch, succ.worker_id))
            return _session(view, rec.session_id, owner=owner, released=max(s.released, gen.epoch))
    mine = (gen.epoch, rec.target_worker, rec.ts)
    return _session(view, rec.session_id, handoff=mine if s.handoff is None else max(s.handoff, mine))


def latest_claims(recs: Iterable[r.Record]) -> dict[str, r.Claimed]:
    """Each session's claim of the highest epoch among ``recs`` (who owns it last): the
    owner fold the tools share (chaos, the flows)."""
    out: dict[str, r.Claimed] = {}
    for rec in recs:
        if isinstance(rec, r.Claimed) and (rec.session_id not in out
                                           or rec.generation.epoch >= out[rec.session_id].generation.epoch):
            out[rec.session_id] = rec
    return out


def apply_all(view: ClusterView, recs: Iterable[r.Record]) -> ClusterView:
    """Fold records in order."""
    for rec in recs:
        view = apply(view, rec)
    return view


def current_generation(view: ClusterView, session_id: str) -> r.Generation | None:
    """The generation the view believes current for a placed session."""
    s = view.sessions.get(session_id)
    if s is None or s.placed_on is None:
        return None
    return r.Generation(s.owner[1], s.owner[0])


def dead_workers(view: ClusterView, now: float, timeout_s: float) -> tuple[str, ...]:
    """Live workers (by the log) not heard from (WorkerUp or Heartbeat) for ``timeout_s``."""
    return tuple(sorted(w.id for w in view.workers.values()
                        if w.alive and now - w.last_seen > timeout_s))


def _booting(view: ClusterView, now: float, boot_timeout_s: float) -> list[Gpu]:
    """Placeholders for workers that recent scale-outs asked for and that have not come up."""
    groups: dict[tuple[str, str], list[tuple[float, int]]] = {}
    for ts, pool, gpu_type, count in view.scale_outs.values():
        if now - ts < boot_timeout_s:
            groups.setdefault((pool, gpu_type), []).append((ts, count))
    out: list[Gpu] = []
    for (pool, gpu_type), asks in sorted(groups.items()):
        since = min(ts for ts, _ in asks)
        arrived = sum(1 for w in view.workers.values()  # a worker started by hand answers no scale-out
                      if w.provisioned and w.pool == pool and w.gpu_type == gpu_type and w.up[0] >= since)
        for i in range(max(0, sum(c for _, c in asks) - arrived)):
            out.append(Gpu(f"{BOOTING_PREFIX}{pool}:{i}", gpu_type, GpuState.BOOTING))
    return out


def gpu_type_of(w: WorkerInfo, model: LatencyModel | None = None) -> str:
    """The GPU type a worker is planned as: its own, or ``TYPE@K`` where ``model`` holds one
    for the slots it reports (``fit_capacity`` makes one for each K a type's workers differ in)."""
    if model is None or w.gpu_type not in model or model[w.gpu_type].capacity == w.capacity:
        return w.gpu_type
    own = f"{w.gpu_type}@{w.capacity}"
    return own if own in model else w.gpu_type


def to_snapshot(view: ClusterView, now: float, *, heartbeat_timeout_s: float = math.inf,
                boot_timeout_s: float = 120.0, handoff_timeout_s: float = 30.0,
                gpu_types: Collection[str] | None = None, model: LatencyModel | None = None) -> Snapshot:
    """The policy's snapshot at ``now``.

    GPUs: live workers heard from within ``heartbeat_timeout_s`` (of ``gpu_types`` when
    given; ``external`` when no provisioner announced them), plus booting placeholders. Sessions: every non-terminated one, on its owner's GPU
    when that GPU is in the snapshot, or on the target of a pending handoff (one asked for at
    the current epoch less than ``handoff_timeout_s`` ago), so a migration in flight is not
    asked for twice. With ``model``, each worker is of :func:`gpu_type_of`'s type. A session's ``since`` is the time of its last session event (its idle
    age, for a suspended one).
    """
    typed = ((w, gpu_type_of(w, model)) for _, w in sorted(view.workers.items()))
    gpus = [Gpu(w.id, t, w.state, external=not w.provisioned) for w, t in typed
            if w.alive and now - w.last_seen <= heartbeat_timeout_s and (gpu_types is None or t in gpu_types)]
    gpus += [g for g in _booting(view, now, boot_timeout_s) if gpu_types is None or g.type in gpu_types]
    usable = {g.id for g in gpus}
    sessions = []
    for sid, s in sorted(view.sessions.items()):
        where = s.placed_on
        lifecycle = s.lifecycle if s.lifecycle is not None else (SessionState.EXECUTION if where else None)
        if lifecycle is None or lifecycle is SessionState.TERMINATED:
            continue
        h = s.handoff
        if where is not None and h is not None and h[0] == s.owner[0] and now - h[2] < handoff_timeout_s \
                and h[1] in usable:
            where = h[1]
        gpu = where if where in usable else None
        sessions.append(Session(sid, s.state_bytes, lifecycle, gpu,
                                restore=lifecycle is SessionState.EXECUTION and gpu is None and s.released > 0,
                                since=s.changed if s.changed > _NEVER else 0.0))
    return Snapshot(now, tuple(gpus), tuple(sessions))


def prune(view: ClusterView, before_ts: float) -> ClusterView:
    """Forget closed sessions, down workers and scale-outs whose last record is older than ``before_ts``.

    Bounds memory in a long run; a record older than the cut that is redelivered later may
    then be folded again, so cut well behind the consumer's position.
    """
    sessions = {k: s for k, s in view.sessions.items()
                if not (s.lifecycle is SessionState.TERMINATED and s.last_event < before_ts)}
    workers = {k: w for k, w in view.workers.items()  # a provisioned worker may still be booting
               if w.alive or max(w.down_ts, w.provisioned_ts) >= before_ts}
    scale_outs = {k: v for k, v in view.scale_outs.items() if v[0] >= before_ts}
    return replace(view, sessions=sessions, workers=workers, scale_outs=scale_outs)
