"""Discrete-event trace simulator around the real decision core.

One heap ordered by ``(t, kind, seq)`` with a per-simulator counter; the trace's own
events wait in a sorted list beside it and are taken in the order the heap would give
them. GPUs run coalesced chunks back to back, each taking ``l(n)`` from the latency
model; a session's per-chunk latency is the time from when it needed the chunk
(activation, its previous chunk's end, or the chunk boundary it migrated at) to the
chunk's end, so waiting for a GPU, migration pauses, restores a policy caused (a GPU shut
down under a session) and batch alignment all count. The one part no policy can change, the state transfer of the restore every
idle->active flip needs, is left out of the per-chunk figure and reported on its own as
the resume latency (activation to first chunk, everything included). Policies are only
ever called through ``decide``; the simulator carries out their commands, like the live
shell does.

A session's state moves only at a cost: a restore (``restore_*``) whenever a session whose
state is not fresh is put on a GPU, whatever command put it there, a migration
(``migrate_*``) for ``Migrate``. Idle sessions are offloaded unless the policy keeps them
resident (:func:`processors.policy.keeps_idle_resident`): then an idle session keeps its
GPU (and the slot the policy counts) until it is active again, at no restore, or until
the policy offloads it with ``Offload``. The snapshot shows what a live controller sees:
executing and idle sessions (with ``since``), the events since the previous decision and
the chunk latencies measured since then.
"""

from __future__ import annotations

import heapq
import math
import time
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field, fields, replace
from itertools import chain
from typing import Any, Callable, Sequence

import numpy as np

from processors.decisions import Admit, Decision, Reinstate, Vacate, Migrate, Place, Restore, Boot, Retire, Offload, Discard, well_formed
from processors.admission import AdmitPlan, WorkerLoad, admit_in_turn
from processors.detector import DetectorConfig, Signal, signals as detector_signals
from processors.latency import LatencyModel
from processors.lifecycle import SessionEvent, SessionState, moves, on_event
from processors.policy import Policy, keeps_idle_resident
from processors.snapshot import ChunkStats, Gpu, GpuState, Session, Snapshot
from schemas.errors import ChunkserveError, ConfigError, PolicyError

__all__ = ["SimConfig", "SimResult", "Signals", "Stop", "ChunkBound", "signals_for", "chunk_bound", "simulate"]

# a resident session woken by the trace starts its GPU (_WAKE) after the rest of that instant's
# events, so the sessions woken together share the chunk, as those admitted together do
_BOOT, _CHUNK, _ARRIVE, _START, _EVENT, _WAKE, _DECIDE = range(7)
_EXEC = SessionState.EXECUTION
_READY = GpuState.READY
MAX_GPUS = 4096  # a pool past this is a plug-in's bug, not a fleet (its Boot counts as invalid)
MIN_CHUNK_S = 1e-3  # a replay runs every chunk: a faster one-session chunk would take more events than a run can hold


def _with(s: Session, gpu_id: str | None, restore: bool, since: float) -> Session:
    """``replace(s, gpu_id=..., restore=..., since=...)`` at a fraction of its cost (the
    simulator's hottest record update)."""
    return Session(s.id, s.state_bytes, s.lifecycle, gpu_id, restore, since)


if tuple(f.name for f in fields(Session)) != ("id", "state_bytes", "lifecycle", "gpu_id", "restore", "since"):
    def _with(s: Session, gpu_id: str | None, restore: bool, since: float) -> Session:  # noqa: F811  (fields changed)
        return replace(s, gpu_id=gpu_id, restore=restore, since=since)


@dataclass(frozen=True, slots=True)
class SimConfig:
    """World parameters (not policy parameters) of one simulation."""

    gpu_type: str = "b300"
    initial_gpus: int = 1
    boot_s: float = 60.0
    deadline_s: float = 1.0  # a chunk's media duration
    tick_s: float = 5.0  # periodic decision rounds besides the event-driven ones
    round_s: float = 0.5  # events are quantized up to this grid (one decision round per step); 0: exact
    migrate_alpha_s: float = 0.02
    migrate_beta_s_per_byte: float = 1.0 / 25e9
    restore_alpha_s: float = 0.05
    restore_beta_s_per_byte: float = 1.0 / 12e9
    window_s: float = 60.0  # timeline window
    detector: DetectorConfig = DetectorConfig()
    # Scale-outs decided at the trace's first instant find their GPUs ready: a trace that
    # starts mid-stream (generated ones open the sessions alive at 0 at 0) meets an elastic
    # pool already at the size its policy asks for, as a fixed pool starts full.
    warm_start: bool = False

    def __post_init__(self) -> None:
        if self.initial_gpus < 0 or self.boot_s < 0 or self.deadline_s <= 0 or self.tick_s <= 0 or self.window_s <= 0:
            raise ConfigError("sim", "need initial_gpus >= 0, boot_s >= 0, deadline_s, tick_s, window_s > 0", "simulator")


@dataclass(frozen=True, slots=True)
class ChunkBound:
    """The most chunk latencies any policy's run of a trace can record from ``i * step_s``
    on (``left[i]``): a session's chunks end at least l(1) apart (the fastest GPU's
    single-session chunk) while it executes, plus what a spell's end may add."""

    step_s: float
    left: tuple[int, ...]

    def after(self, t: float) -> int:
        return self.left[min(max(0, int(t // self.step_s)), len(self.left) - 1)]


def chunk_bound(events: Sequence[SessionEvent], model: LatencyModel, round_s: float, step_s: float = 10.0) -> ChunkBound:
    """:class:`ChunkBound` of ``events`` (events quantized up to ``round_s``)."""
    fastest = min(p.latency(1) for p in model.values())
    start: dict[str, float] = {}
    spells: list[tuple[float, float]] = []
    for ev, _, state in moves(events):  # each session through the lifecycle table, as the run moves it
        run = state is _EXEC
        if run and ev.session_id not in start:
            start[ev.session_id] = ev.t
        elif not run and ev.session_id in start:
            spells.append((start.pop(ev.session_id), ev.t + round_s))
    end = events[-1].t + round_s if events else 0.0
    spells.extend((t, end) for t in start.values())
    a = np.array([x for x, _ in spells] or [0.0])
    b = np.array([y for _, y in spells] or [0.0])
    left = []
    for i in range(int(end // step_s) + 1):
        t = i * step_s
        on = b >= t
        left.append(math.floor(float((b[on] - np.maximum(a[on], t)).sum()) / fastest) + 2 * int(on.sum()))
    return ChunkBound(step_s, tuple(left))


@dataclass(frozen=True, slots=True)
class Stop:
    """Abort a run as soon as it is known to fail a bound: a chunk slower than ``worst_s``,
    or more chunks past their deadline than ``miss_rate`` of the most the run can record
    (those so far plus ``bound.after(now)``). A search for the smallest pool that meets a
    bound needs no more of a failing run."""

    worst_s: float = math.inf
    miss_rate: float = math.inf
    bound: ChunkBound | None = None

    def broken(self, worst: float, missed: int, recorded: int, now: float) -> bool:
        if worst > self.worst_s:
            return True
        return missed > 0 and self.bound is not None and missed > self.miss_rate * (recorded + self.bound.after(now))


class _Abort(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Signals:
    """The detector's signals along a trace (shared by every policy run on it)."""

    times: tuple[float, ...]
    signals: tuple[Signal, ...]

    def at(self, t: float) -> Signal | None:
        i = bisect_right(self.times, t) - 1
        return self.signals[i] if i >= 0 else None


def signals_for(events: Sequence[SessionEvent], tick_s: float, config: DetectorConfig = DetectorConfig(),
                warm: bool = False) -> Signals:
    """Run the real detector over the events, plus an ``observe`` on every tick; ``warm`` (a
    trace that starts mid-stream): the first instant's events are the state it starts in,
    not arrivals (:func:`processors.detector.signals`)."""
    return Signals(*detector_signals(events, tick_s, config, events[0].t if warm and events else None))


@dataclass
class SimResult:
    """Metrics of one run, and the per-window timeline."""

    policy: str
    worst_chunk_latency_s: float
    p99_chunk_latency_s: float
    deadline_miss_rate: float
    gpu_seconds: float
    cost: float
    migrations: int
    scale_events: int
    chunks: int
    invalid_commands: int
    worst_resume_latency_s: float | None = None  # None: no session resumed
    p99_resume_latency_s: float | None = None
    timeline: dict[str, list[float]] = field(default_factory=dict)
    missed_chunks: int = 0
    complete: bool = True  # False: aborted by a Stop (the figures are those up to then)
    stopped_at: float | None = None  # when a Stop aborted it
    # (t, worst chunk, missed, recorded) so far at each timeline window's start the run
    # reached: any run of the same policy and pool passes through the same ones
    samples: tuple[tuple[float, float, int, int], ...] = ()
    # invalid commands per command kind ("malformed KIND": a KIND command with a field of the wrong
    # type; "malformed": something that is no command)
    invalid_by_kind: dict[str, int] = field(default_factory=dict)
    # the policy's decide calls and the host time they took, s (all, the longest): how fast
    # the policy's own code is, which no figure above depends on (left out of equality)
    decide_calls: int = field(default=0, compare=False)
    decide_s: float = field(default=0.0, compare=False)
    decide_max_s: float = field(default=0.0, compare=False)

    def metrics(self) -> dict[str, Any]:
        keys = ("worst_chunk_latency_s", "p99_chunk_latency_s", "deadline_miss_rate", "gpu_seconds", "cost", "migrations", "scale_events",
                "worst_resume_latency_s", "p99_resume_latency_s")
        return {k: getattr(self, k) for k in keys}


_NO_TRANSFER = (0.0, 0.0)


class _Gpu:
    __slots__ = ("id", "type", "state", "since", "roster", "batch", "busy", "leaving", "closing", "start", "latency", "capacity")

    def __init__(self, gid: str, gtype: str, state: GpuState, since: float, latency: Callable[[int], float],
                 capacity: int) -> None:
        self.id, self.type, self.state, self.since, self.latency = gid, gtype, state, since, latency
        self.capacity = capacity  # the profile's K (what dispatch's load view says)
        self.roster: set[str] = set()  # sessions arrived and runnable here
        self.batch: set[str] = set()  # members of the running chunk
        self.start = 0.0  # when the running chunk started
        self.busy = False
        self.leaving: dict[str, tuple[str, float]] = {}  # sid -> (dst, cost) at chunk end
        self.closing = False  # shut down once the migrations leaving it are out


class _Sim:
    def __init__(self, policy: Policy, events: Sequence[SessionEvent], model: LatencyModel, cfg: SimConfig, signals: Signals,
                 stop: Stop | None = None) -> None:
        self.policy, self.events, self.model, self.cfg, self.signals = policy, events, model, cfg, signals
        self.stop = stop or Stop()
        self.stop_worst = self.stop.worst_s
        self.deadline = cfg.deadline_s + 1e-9  # a chunk later than this missed its deadline
        self.missed = self.recorded = 0  # chunk latencies past the deadline so far, and all of them
        self.heap: list[tuple[float, int, int, Any]] = []
        self.trace: list[tuple[float, int]] = []  # (round, index) of the trace's events, in order
        self.seq = 0
        self.gpus: dict[str, _Gpu] = {}
        self.gpu_view: tuple[Gpu, ...] | None = None  # the GPUs as snapshots show them (None: changed since)
        self.next_gpu = 0
        self.sessions: dict[str, Session] = {}  # executing sessions, as policies see them
        self.idle: dict[str, Session] = {}  # suspended ones (gpu_id set: still resident)
        self.offloaded: set[str] = set()  # idle ones whose state left a GPU (restored when placed)
        self.resident = keeps_idle_resident(policy)
        self.fresh: list[SessionEvent] = []  # events since the last decision
        self.seen = [0, 0, 0.0]  # chunks, missed, worst since the last decision
        self.where: dict[str, str] = {}  # sid -> gpu it runs on or travels to (sim's truth)
        # GPUs that may hold migrations leaving at their chunk's end: a session is only ever
        # in the roster of where[sid] or of one of these
        self.sources: set[str] = set()
        # sid -> when it needed its next chunk, for sessions not in a chunk that follows their
        # previous one back to back (those needed it at their GPU's chunk start)
        self.req: dict[str, float] = {}
        self.bytes: dict[str, int] = {}
        self.lat: list[float] = []  # per-chunk latencies, each counted lat_n times
        self.lat_n: list[int] = []
        self.resume_lat: list[float] = []  # activation (idle -> active) to first chunk end
        self.waking: set[str] = set()  # activated, first chunk not done yet
        self.transfer: dict[str, tuple[float, float]] = {}  # sid -> (restore transfer of its activation, when it began)
        # sid -> when its state lands on the GPU it travels to (a restore or a move on its way):
        # a move asked for meanwhile starts from there (it skipped the restore's rest before)
        self.landing: dict[str, float] = {}
        try:
            self.state = policy.initial_state()
        except Exception as exc:  # a plug-in's own code
            raise PolicyError(f"policy {policy.name!r}: initial_state raised {type(exc).__name__}: {exc}"[:500]) from exc
        self.plan: AdmitPlan | None = None  # the last round's admission plan (none before the first)
        self.decide_at: float | None = None
        self.gpu_s = 0.0
        self.cost = 0.0
        self.migrations = self.scale_events = self.invalid = 0
        self.refused: Counter[str] = Counter()  # invalid commands by kind
        self.decide_calls, self.decide_s, self.decide_max_s = 0, 0.0, 0.0
        q = cfg.round_s
        last = events[-1].t if events else 0.0
        self.end = math.ceil(last / q - 1e-9) * q if q > 0 else last
        first = events[0].t if events else 0.0
        self.start = math.ceil(first / q - 1e-9) * q if q > 0 else first
        self.warm_rounds = 0
        nwin = int(self.end // cfg.window_s) + 1
        self.tl = {k: [0.0] * nwin for k in ("gpus", "active", "migrations", "worst_latency_s")}
        self.tl_worst = self.tl["worst_latency_s"]
        self.samples: list[tuple[float, float, int, int]] = []
        self.sampled, self.worst_seen = 0, 0.0  # latencies looked at by the last sample, their worst
        for _ in range(cfg.initial_gpus):
            self.add_gpu(cfg.gpu_type, 0.0, GpuState.READY)

    # -- plumbing ----------------------------------------------------------------------
    def push(self, t: float, kind: int, item: Any) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, item))

    def win(self, t: float) -> int:
        return min(int(t // self.cfg.window_s), len(self.tl["gpus"]) - 1)

    def add_gpu(self, gtype: str, now: float, state: GpuState) -> _Gpu:
        gid = f"g{self.next_gpu:05d}"
        self.next_gpu += 1
        profile = self.model[gtype]  # unknown types fail here, as a ConfigError
        g = self.gpus[gid] = _Gpu(gid, gtype, state, now, profile.latency, profile.capacity)
        self.gpu_view = None
        return g

    def bill(self, g: _Gpu, now: float) -> None:
        secs = max(0.0, min(now, self.end) - g.since)
        self.gpu_s += secs
        self.cost += secs * self.model[g.type].cost_per_hour / 3600.0
        g.since = now

    # -- GPU execution -----------------------------------------------------------------
    def kick(self, g: _Gpu, now: float) -> None:
        if g.busy or not g.roster or g.id not in self.gpus:
            return
        g.batch = set(g.roster)
        g.start = now
        g.busy = True
        self.seq += 1
        heapq.heappush(self.heap, (now + g.latency(len(g.batch)), _CHUNK, self.seq, g.id))

    def chunk_done(self, g: _Gpu, now: float, w: int) -> None:
        """A chunk ends at ``now`` (in timeline window ``w``): record its latencies and
        start the next one."""
        g.busy = False
        worst = 0.0
        req, seen, deadline = self.req, self.seen, self.deadline
        missed0, count0 = seen[1], seen[0]
        batch, roster = g.batch, g.roster
        same = batch == roster  # nobody came or left during the chunk (the common case)
        present = batch if same else batch & roster  # only read from here on
        if g.leaving:
            present = present | (batch & g.leaving.keys())
        special = present & req.keys() if req else ()
        cont = len(present) - len(special)
        if cont:  # back to back since their previous chunk here: one latency for all of them
            worst = now - g.start
            self.lat.append(worst)
            self.lat_n.append(cont)
            seen[0] += cont
            if worst > deadline:
                seen[1] += cont
        if special:
            worst = self.special_done(special, now, worst)
        if worst > seen[2]:
            seen[2] = worst
        self.recorded += seen[0] - count0
        if seen[1] > missed0 or worst > self.stop_worst:
            self.missed += seen[1] - missed0
            if self.stop.broken(worst, self.missed, self.recorded, now):
                raise _Abort(now)
        if worst > self.tl_worst[w]:
            self.tl_worst[w] = worst
        if g.leaving:
            for sid, (dst, cost) in g.leaving.items():
                roster.discard(sid)
                req[sid] = now
                self.travel(sid, dst, now + cost)
            g.leaving = {}
            self.sources.discard(g.id)
            same = False
        if g.closing:
            g.batch = set()
            self.release(g, now)
        elif roster:  # the next chunk at once (kick, inlined: the hottest path)
            if not same:  # else the batch is the roster already (never changed in place)
                g.batch = set(roster)
            g.start = now
            g.busy = True
            self.seq += 1
            heapq.heappush(self.heap, (now + g.latency(len(g.batch)), _CHUNK, self.seq, g.id))
        else:
            g.batch = set()

    def special_done(self, special: set[str], now: float, worst: float) -> float:
        """Record the chunk latencies of ``special`` sessions (not back to back: each
        waited since it needed the chunk); returns ``worst`` raised to theirs."""
        req, lat, lat_n, seen, deadline = self.req, self.lat, self.lat_n, self.seen, self.deadline
        for sid in special:
            x = now - req.pop(sid)
            if sid in self.waking:
                self.waking.discard(sid)
                self.resume_lat.append(x)
            if self.transfer:
                x -= self.transfer.pop(sid, _NO_TRANSFER)[0]
            lat.append(x)
            lat_n.append(1)
            if x > worst:
                worst = x
            seen[0] += 1
            if x > deadline:
                seen[1] += 1
        return worst

    def travel(self, sid: str, gid: str, at: float) -> None:
        """``sid``'s state lands on ``gid`` at ``at``."""
        self.landing[sid] = at
        self.push(at, _ARRIVE, (sid, gid))

    def arrive(self, sid: str, gid: str, now: float) -> None:
        g = self.gpus.get(gid)
        if self.where.get(sid) != gid or sid not in self.sessions:
            return  # suspended, closed or re-routed while travelling
        self.landing.pop(sid, None)
        if g is None:  # its GPU went away: wait for a new placement
            self.orphan(sid)
            return
        g.roster.add(sid)
        if not g.busy:  # start after every arrival of this instant
            self.push(now, _START, g.id)

    def orphan(self, sid: str) -> None:
        self.where.pop(sid, None)
        self.landing.pop(sid, None)
        if sid in self.sessions:
            s = self.sessions[sid]
            self.sessions[sid] = _with(s, None, True, s.since)

    def leave(self, sid: str, now: float) -> None:
        """A session stops running (suspend, close): its chunk in flight is dropped."""
        gid = self.where.pop(sid, None)
        home = self.gpus.get(gid) if gid is not None else None
        gids = (gid, *self.sources) if self.sources else (gid,)  # it may still sit on a migration's source
        self.unserved(sid, now, home, gids)
        for x in gids:
            g = self.gpus.get(x)  # type: ignore[arg-type]
            if g is not None:
                g.roster.discard(sid)
                g.leaving.pop(sid, None)
        self.req.pop(sid, None)
        self.transfer.pop(sid, None)
        self.landing.pop(sid, None)
        self.waking.discard(sid)

    def unserved(self, sid: str, now: float, home: _Gpu | None, gids: tuple[str | None, ...]) -> None:
        """A session whose spell ends at ``now`` before the chunk it waits for: when it has
        waited past its deadline (for a GPU, for its state, or for a chunk that runs past
        it), that chunk counts once, as long as the wait, less its restore. Otherwise a
        spell shorter than the chunks it was given counted nowhere, and a profile slower
        than every spell read as a perfect run."""
        arrived = home is not None and sid in home.roster  # else waiting for a GPU, or its state on the way to one
        if sid in self.waking and sid in self.req:  # a return never served: its resume took all its spell
            self.resume_lat.append(now - self.req[sid])
        pause, began = self.transfer.get(sid, _NO_TRANSFER)
        need = self.req.get(sid)
        if need is not None:
            # its wait less its restore: on the way to its GPU, what passed before the restore began
            waited = (began if home is not None and not arrived and pause > 0 else now - pause) - need
        else:  # back to back in a running chunk: it needed that chunk when the chunk began
            g = next((g for x in gids if (g := self.gpus.get(x)) is not None  # type: ignore[arg-type]
                      and g.busy and sid in g.batch and sid in g.roster), None)
            waited = now - g.start if g is not None else 0.0
        if waited > self.cfg.deadline_s:
            self.lat.append(waited)  # waited past its deadline and never got the chunk
            self.lat_n.append(1)
            self.missed += waited > self.cfg.deadline_s + 1e-9
            self.recorded += 1
            if self.stop.broken(waited, self.missed, self.recorded, now):
                raise _Abort(now)

    # -- commands ----------------------------------------------------------------------
    def apply(self, cmd: Any, now: float) -> None:
        sid = getattr(cmd, "session_id", "")
        s = self.sessions.get(sid, None)
        if isinstance(cmd, (Place, Restore)):
            g = self.gpus.get(cmd.gpu_id)
            i = self.idle.get(sid) if s is None and self.resident else None
            if i is not None and i.gpu_id is None and sid not in self.offloaded and g is not None \
                    and g.state is _READY:
                # an idle session placed by a policy that keeps idle sessions resident (one
                # that opened idle, pinned at its open): its state rests there, holding a
                # slot; nobody waits for it
                self.idle[sid] = _with(i, g.id, False, i.since)
                self.where[sid] = g.id
                return
            if s is None or s.gpu_id is not None or g is None or g.state is not _READY:
                self.refuse(cmd)
                return
            self.sessions[s.id] = _with(s, g.id, False, s.since)
            self.where[s.id] = g.id
            pause = 0.0
            if s.restore:  # its state is elsewhere: restored, whichever command placed it
                pause = self.cfg.restore_alpha_s + self.cfg.restore_beta_s_per_byte * s.state_bytes
                if s.id in self.waking:  # the activation's own restore (once), not a policy's
                    self.transfer.setdefault(s.id, (pause, now))
            self.travel(s.id, g.id, now + pause)
        elif isinstance(cmd, Migrate) and s is None and sid in self.idle:
            i, dst = self.idle[sid], self.gpus.get(cmd.dst)
            if i.gpu_id != cmd.src or dst is None or dst.state is not _READY or cmd.src == cmd.dst:
                self.refuse(cmd)
                return
            self.idle[sid] = _with(i, dst.id, i.restore, i.since)  # an idle resident state moves; nobody waits
            self.where[sid] = dst.id
            self.migrations += 1
            self.tl["migrations"][self.win(now)] += 1
        elif isinstance(cmd, Offload):
            i = self.idle.get(sid)
            if i is not None and i.gpu_id is None:
                return  # its state is off every GPU already (a policy that offloads none finds it so): nothing to do
            if i is None or cmd.gpu_id not in (None, i.gpu_id):  # not resident where it says
                self.refuse(cmd)
                return
            self.idle[sid] = _with(i, None, True, i.since)  # offloaded: placing it restores (its snapshot says so)
            self.where.pop(sid, None)
            self.offloaded.add(sid)  # and no Place of it while idle (it rested there again for free)
        elif isinstance(cmd, Migrate):
            src, dst = self.gpus.get(cmd.src), self.gpus.get(cmd.dst)
            if s is None or s.gpu_id != cmd.src or dst is None or dst.state is not _READY or cmd.src == cmd.dst:
                self.refuse(cmd)
                return
            self.sessions[s.id] = _with(s, dst.id, s.restore, s.since)
            self.where[s.id] = dst.id
            self.migrations += 1
            self.tl["migrations"][self.win(now)] += 1
            cost = self.cfg.migrate_alpha_s + self.cfg.migrate_beta_s_per_byte * s.state_bytes
            if src is not None and src.busy and s.id in src.batch and s.id in src.roster:
                src.leaving[s.id] = (dst.id, cost)  # moves at the chunk boundary
                self.sources.add(src.id)
            else:
                if src is not None:
                    src.roster.discard(s.id)
                    self.req.setdefault(s.id, now)
                # still on its way to the source (a restore, a move): it moves once it has landed
                self.travel(s.id, dst.id, max(now, self.landing.get(s.id, now)) + cost)
        elif isinstance(cmd, Boot):
            count = cmd.count  # a whole number, whatever its type (3, 3.0, numpy's int64)
            if (not math.isfinite(count) or count != int(count) or count < 1 or cmd.gpu_type not in self.model
                    or len(self.gpus) + count > MAX_GPUS):  # a plug-in's Boot the simulator cannot carry out
                self.refuse(cmd)
                return
            count = int(count)
            self.scale_events += 1
            warm = self.cfg.warm_start and now <= self.start and self.warm_rounds < 8
            for _ in range(count):
                g = self.add_gpu(cmd.gpu_type, now, GpuState.READY if warm else GpuState.BOOTING)
                if not warm:
                    self.push(now + self.cfg.boot_s, _BOOT, g.id)
            if warm:  # place onto them at once (a few rounds at most)
                self.warm_rounds += 1
                self.schedule_decide(now)
        elif isinstance(cmd, Vacate):
            g = self.gpus.get(cmd.gpu_id)
            if g is None:
                self.refuse(cmd)
                return
            if g.state is not GpuState.DRAINING:
                self.scale_events += 1
            g.state = GpuState.DRAINING
            self.gpu_view = None
        elif isinstance(cmd, Reinstate):
            g = self.gpus.get(cmd.gpu_id)
            if g is None or g.state is not GpuState.DRAINING or g.closing:
                self.refuse(cmd)
                return
            self.scale_events += 1
            g.state = GpuState.READY
            self.gpu_view = None
        elif isinstance(cmd, Admit):
            self.plan = AdmitPlan(cmd.order, {}, cmd.fallback, now)
            # an entry for a GPU it does not have or that takes no session (booting, draining), or
            # for no session, admits nobody: said, not carried (a draining GPU's went uncounted)
            self.refuse(cmd, sum(1 for gid, n in cmd.order
                                 if gid not in self.gpus or self.gpus[gid].state is not _READY or not n >= 1))
        elif isinstance(cmd, Retire):
            g = self.gpus.get(cmd.gpu_id)
            if g is None or g.id in self.where.values():  # a session runs, rests or lands there: not released
                self.refuse(cmd)
                return
            if g.state is not GpuState.DRAINING:  # shut down without a drain first: a scale-in too
                self.scale_events += 1
            if g.leaving:  # like the live shell: release after the outgoing transfers
                g.closing = True
                return
            self.release(g, now)
        else:
            self.refuse(cmd)

    def release(self, g: _Gpu, now: float) -> None:
        del self.gpus[g.id]
        self.gpu_view = None
        self.bill(g, now)
        for sid, i in list(self.idle.items()):  # idle residents lose their GPU: offloaded
            if i.gpu_id == g.id:
                self.idle[sid] = _with(i, None, True, i.since)
                self.where.pop(sid, None)
                self.offloaded.add(sid)
        for sid in list(g.roster):  # none but those that left by migration (Retire waits for them)
            self.orphan(sid)
            self.req[sid] = now
            self.transfer.pop(sid, None)

    # -- rounds ------------------------------------------------------------------------
    def snapshot(self, now: float) -> Snapshot:
        gpus = self.gpu_view
        if gpus is None:
            gpus = self.gpu_view = tuple(Gpu(g.id, g.type, g.state) for g in self.gpus.values())
        chunks = ChunkStats(self.seen[0], self.seen[1], self.seen[2], self.deadline)
        sessions = (*self.sessions.values(), *self.idle.values())
        return Snapshot(now, gpus, sessions, tuple(self.fresh), chunks)

    def decide(self, now: float) -> None:
        self.decide_at = None
        self.admit_waiting(now)  # before the snapshot: the policy sees where they went
        snap = self.snapshot(now)
        self.fresh, self.seen = [], [0, 0, 0.0]
        began = time.perf_counter()
        try:
            d = self.policy.decide(snap, self.signals.at(now), self.state)
        except ChunkserveError:
            raise
        except Exception as exc:  # a plug-in's own code: named, in one line
            raise PolicyError(f"policy {self.policy.name!r}: decide at t={now:.1f} s raised "
                              f"{type(exc).__name__}: {exc}"[:500]) from exc
        took = time.perf_counter() - began
        self.decide_calls += 1
        self.decide_s += took
        self.decide_max_s = max(self.decide_max_s, took)
        if not isinstance(d, Decision):
            raise PolicyError(f"policy {self.policy.name!r}: decide at t={now:.1f} s returned {type(d).__name__}, not a Decision")
        if not isinstance(d.commands, (tuple, list)):
            raise PolicyError(f"policy {self.policy.name!r}: decide at t={now:.1f} s returned commands as "
                              f"{type(d.commands).__name__}, "
                              "not a tuple or list of commands")
        self.state = d.state
        self.plan = AdmitPlan(fallback=False, ts=now)  # a policy that issues no Admit: its Place
        for cmd in d.commands:
            if well_formed(cmd):
                self.apply(cmd, now)
            else:  # a field of the wrong type (a plug-in's): said, not carried out
                self.refuse(cmd, kind=f"malformed {cmd.kind}" if isinstance(getattr(cmd, "kind", None), str) else "malformed")

    def refuse(self, cmd: Any, n: int = 1, kind: str | None = None) -> None:
        """Count ``n`` of ``cmd``'s entries (a command, or an Admit's entries) as invalid."""
        if n:
            self.invalid += n
            self.refused[kind or getattr(cmd, "kind", type(cmd).__name__)] += n

    def admit_waiting(self, now: float) -> bool:
        """Dispatch's part: the sessions that arrived or woke since the last round go where
        that round's admission plan says (processors.admission.candidate, as live, asked for
        each in turn: admit_in_turn), before the policy decides again; whatever the plan
        leaves waits for the policy's Place."""
        plan = self.plan
        if plan is None or not (plan.order or plan.fallback):
            return False
        execs = self.sessions.values()  # executing sessions only; GPU ids are never empty
        waiting = [s for s in execs if not s.gpu_id]
        if not waiting:
            return False
        # sessions whose state is on each GPU (executing or idle-resident), as Snapshot.resident
        held = Counter([s.gpu_id for s in chain(execs, self.idle.values())])
        workers = {g.id: WorkerLoad(held[g.id], g.capacity, g.state is not _READY) for g in self.gpus.values()}
        for s, best in zip(waiting, admit_in_turn(plan, workers, [s.id for s in waiting])):
            if best is not None:
                self.apply(Restore(s.id, best) if s.restore else Place(s.id, best), now)
        return True

    def schedule_decide(self, t: float) -> None:
        if self.decide_at is None or t < self.decide_at:
            self.decide_at = t
            self.push(t, _DECIDE, t)

    def on_trace(self, ev: SessionEvent, now: float) -> None:
        sid = ev.session_id
        self.fresh.append(ev)
        old = self.sessions.get(sid) or self.idle.get(sid)
        if old is None and sid in self.bytes:  # closed and seen again: rebuild its record
            old = Session(sid, self.bytes[sid], SessionState.SUSPENDED)
        new, cmds = on_event(old, ev)
        self.bytes[sid] = new.state_bytes
        if new.lifecycle is _EXEC:
            if old is None or old.lifecycle is not _EXEC:
                self.req[sid] = now
                if old is not None:
                    self.waking.add(sid)
                home = self.gpus.get(old.gpu_id) if old is not None and old.gpu_id is not None else None
                if home is not None and self.where.get(sid) == home.id:  # resident: runs where it is
                    new = _with(new, home.id, False, new.since)
                    home.roster.add(sid)
                    if not home.busy:
                        self.push(now, _WAKE, home.id)
                self.idle.pop(sid, None)
                self.sessions[sid] = _with(new, new.gpu_id, new.restore, now)
        else:
            was_exec = old is not None and old.lifecycle is _EXEC
            self.sessions.pop(sid, None)
            keep = self.resident and was_exec and new.lifecycle is SessionState.SUSPENDED and self.where.get(sid) in self.gpus
            if keep:  # stays resident: off the GPU's batches, state and slot kept
                g = self.gpus[self.where[sid]]
                self.unserved(sid, now, g, (g.id,))
                g.roster.discard(sid)
                g.leaving.pop(sid, None)
                self.req.pop(sid, None)
                self.transfer.pop(sid, None)
                self.waking.discard(sid)
                self.idle[sid] = Session(sid, new.state_bytes, SessionState.SUSPENDED, g.id, since=now)
            else:
                # offloaded: placing it again restores, unless it never had state anywhere (it
                # went idle before its first placement, as one that opens idle does)
                stored = old is not None and (old.restore or sid in self.where)
                if any(isinstance(c, (Offload, Discard)) for c in cmds) or was_exec:
                    self.leave(sid, now)
                self.where.pop(sid, None)
                if new.lifecycle is SessionState.SUSPENDED:
                    if was_exec:
                        self.idle[sid] = Session(sid, new.state_bytes, SessionState.SUSPENDED, None, stored, since=now)
                else:
                    self.idle.pop(sid, None)
            if new.lifecycle is SessionState.TERMINATED:
                self.bytes.pop(sid, None)
        self.schedule_decide(now)

    def run(self, progress: Callable[[float], None] | None = None) -> SimResult:
        q = self.cfg.round_s
        at = [math.ceil(ev.t / q - 1e-9) * q if q > 0 else ev.t for ev in self.events]
        self.trace = sorted(zip(at, range(len(at))))  # (round, index): the order the heap would give them
        t = self.cfg.tick_s
        while t < self.end:
            self.push(t, _DECIDE, None)
            t += self.cfg.tick_s
        try:
            self.loop(progress)
        except _Abort as stop:
            return self.result(stopped_at=stop.args[0])
        for g in list(self.gpus.values()):
            self.bill(g, self.end)
        return self.result()

    def loop(self, progress: Callable[[float], None] | None) -> None:
        heap, gpus, sessions, end, tl_gpus, tl_active = self.heap, self.gpus, self.sessions, self.end, self.tl["gpus"], self.tl["active"]
        w, edge, last = -1, -math.inf, len(tl_gpus) - 1
        pop = heapq.heappop
        # the trace's events come from their own sorted list, merged with the heap as if
        # they were in it as (t, _EVENT, index): the heap holds only what the run adds
        trace, nxt = self.trace, 0
        te = trace[0][0] if trace else math.inf  # the next trace event's time
        while True:
            if heap and not (te < heap[0][0] or (te == heap[0][0] and heap[0][1] > _EVENT)):
                now, kind, _, item = pop(heap)
            elif nxt < len(trace):
                now, item = trace[nxt]
                kind = _EVENT
                nxt += 1
                te = trace[nxt][0] if nxt < len(trace) else math.inf
            else:
                break
            if now > end and kind != _EVENT:
                break
            crossed = now >= edge  # heap times never fall: windows change only at an edge
            if crossed:
                w = self.win(now)
                edge = (w + 1) * self.cfg.window_s if w < last else math.inf
                self.sample(w * self.cfg.window_s)
                if progress is not None:
                    progress(now)
            if kind == _CHUNK:
                g = gpus.get(item)
                if g is not None and g.busy:
                    self.chunk_done(g, now, w)
            elif kind == _ARRIVE:
                self.arrive(item[0], item[1], now)
            elif kind == _START or kind == _WAKE:
                g = gpus.get(item)
                if g is not None:
                    self.kick(g, now)
            elif kind == _EVENT:
                self.on_trace(self.events[item], now)
            elif kind == _BOOT:
                g = gpus.get(item)
                if g is not None and g.state is GpuState.BOOTING:
                    g.state = GpuState.READY
                    self.gpu_view = None
                    self.schedule_decide(now)
            elif item is None or item == self.decide_at:
                self.decide(now)
            # the window's most GPUs and executing sessions (only decisions and trace
            # events add to them: other events cannot raise a window's most)
            if crossed or kind >= _EVENT:
                if len(gpus) > tl_gpus[w]:
                    tl_gpus[w] = len(gpus)
                if len(sessions) > tl_active[w]:
                    tl_active[w] = len(sessions)

    def sample(self, t: float) -> None:
        """The run so far at ``t`` (a window's start, before its first event)."""
        if len(self.lat) > self.sampled:
            self.worst_seen = max(self.worst_seen, max(self.lat[self.sampled:]))
            self.sampled = len(self.lat)
        self.samples.append((t, self.worst_seen, self.missed, self.recorded))

    def result(self, stopped_at: float | None = None) -> SimResult:
        lat = np.asarray(self.lat) if self.lat else np.zeros(1)
        n = np.asarray(self.lat_n) if self.lat else np.ones(1, dtype=np.int64)
        res = np.asarray(self.resume_lat) if self.resume_lat else None  # none resumed: no figure, not 0 s
        return SimResult(
            policy=self.policy.name,
            worst_chunk_latency_s=float(lat.max()),
            p99_chunk_latency_s=_percentile(lat, n, 99.0),
            deadline_miss_rate=float(n[lat > self.cfg.deadline_s + 1e-9].sum() / n.sum()),
            gpu_seconds=self.gpu_s,
            cost=self.cost,
            migrations=self.migrations,
            scale_events=self.scale_events,
            chunks=int(n.sum()) if self.lat else 0,
            invalid_commands=self.invalid,
            invalid_by_kind=dict(sorted(self.refused.items())),
            worst_resume_latency_s=None if res is None else float(res.max()),
            p99_resume_latency_s=None if res is None else float(np.percentile(res, 99)),
            timeline=self.tl,
            missed_chunks=int(n[lat > self.cfg.deadline_s + 1e-9].sum()),
            complete=stopped_at is None,
            stopped_at=stopped_at,
            samples=tuple(self.samples),
            decide_calls=self.decide_calls,
            decide_s=self.decide_s,
            decide_max_s=self.decide_max_s,
        )


def _percentile(values: np.ndarray, counts: np.ndarray, q: float) -> float:
    """``np.percentile`` (linear) of ``values`` each repeated ``counts`` times, without repeating."""
    order = np.argsort(values, kind="stable")
    v, cum = values[order], np.cumsum(counts[order])
    pos = q / 100.0 * (cum[-1] - 1)
    lo = int(np.searchsorted(cum, math.floor(pos) + 1))
    hi = int(np.searchsorted(cum, math.ceil(pos) + 1))
    return float(v[lo] + (pos - math.floor(pos)) * (v[hi] - v[lo]))


def simulate(
    policy: Policy,
    events: Sequence[SessionEvent],
    model: LatencyModel,
    config: SimConfig = SimConfig(),
    signals: Signals | None = None,
    progress: Callable[[float], None] | None = None,
    stop: Stop | None = None,
) -> SimResult:
    """Replay ``events`` through ``policy`` (pass ``signals`` to share one detector pass);
    with ``stop``, a run that breaks it ends there (``complete`` False)."""
    fast = min(model, key=lambda t: model[t].latency(1), default=None)
    if fast is not None and model[fast].latency(1) < MIN_CHUNK_S:
        raise ConfigError(f"gpu_types.{fast}.latency_s", f"a one-session chunk of {model[fast].latency(1):g} s: the simulator "
                          f"replays every chunk and takes chunks of {MIN_CHUNK_S:g} s or longer", model.name)
    if signals is None:
        signals = signals_for(events, config.tick_s, config.detector, config.warm_start)
    return _Sim(policy, events, model, config, signals, stop).run(progress)
