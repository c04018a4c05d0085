"""Placement controller: arrivals, draining GPUs, and exact migration-aware min-max rebalancing.

One epoch minimises L + eta * sum(kappa_i) over the sessions it migrates, where L is the
worst per-chunk latency after the epoch and kappa_i = alpha + beta * state_bytes_i, from the
previous placement, with the epoch's arrivals placed too. The minimum is exact
(:mod:`processors._levels`: a search over the worst-latency level) under the product's
constraints: at most ``max_moves`` migrations, no GPU above K after receiving, a GPU either
sends or receives, and the transient limit on every move (its kappa plus the target's
l(n - 1) and l(n) at the position n it lands on; a GPU's moves land largest kappa first,
ahead of its new sessions). Among optimal placements it takes the one with fewest moves and
fills receiving GPUs least-latency first. Ties between equal sessions go by snapshot order.

Draining GPUs are evacuated first by a greedy pass (cheapest session to the least-loaded
GPU, within ``drain_max_kappa_s`` and the transient limit, keeping room for arrivals); the
search then runs on what it leaves.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace
from itertools import repeat
from operator import attrgetter

import numpy as np

from processors._levels import search
from processors.decisions import Command, Migrate, Place, Resume
from processors.latency import LatencyModel
from processors.lifecycle import SessionState
from processors.snapshot import GpuState, Session, Snapshot
from schemas.errors import ConfigError

__all__ = ["RebalanceConfig", "PlacementPlan", "plan_placement", "worst_latency"]

_EXEC = SessionState.EXECUTION
_FRESH = -1  # cost key of a session placed in this epoch: moving it is free
_GPU_ID = attrgetter("gpu_id")
_BYTES = attrgetter("state_bytes")


@dataclass(frozen=True, slots=True)
class RebalanceConfig:
    """Migration cost model (alpha-beta), its weight eta, and the per-epoch move budget.

    ``drain_max_kappa_s`` bounds which sessions a draining GPU sheds by migration: a larger
    one would stall its next chunk longer than that, so it stays until it goes idle or
    closes (the GPU shuts down a little later instead). ``max_transient_s`` bounds any move
    by the moved session's next chunk at worst (:meth:`transient`): a move that would make
    that chunk slower than this is not made.
    """

    eta: float = 0.1
    alpha_s: float = 0.02
    beta_s_per_byte: float = 1.0 / 25e9
    max_moves: int = 512
    drain_max_kappa_s: float = math.inf
    max_transient_s: float = math.inf

    def __post_init__(self) -> None:
        if (self.eta < 0 or self.alpha_s < 0 or self.beta_s_per_byte < 0 or self.max_moves < 0
                or not self.drain_max_kappa_s >= 0 or not self.max_transient_s >= 0):
            raise ConfigError("rebalance", "eta, alpha_s, beta_s_per_byte, max_moves, drain_max_kappa_s and max_transient_s must be >= 0", "placement")

    def kappa(self, state_bytes: int) -> float:
        """Estimated seconds to migrate a session holding ``state_bytes``."""
        return self.alpha_s + self.beta_s_per_byte * state_bytes

    def transient(self, kappa_s: float, target_now_s: float, target_after_s: float) -> float:
        """The moved session's next chunk at worst: its transfer, then the target's running
        chunk (``target_now_s`` = l_t(n_t)) to wait out, then its own (l_t(n_t + 1))."""
        return kappa_s + target_now_s + target_after_s


@dataclass(frozen=True, slots=True)
class PlacementPlan:
    """Commands of one placement epoch, sessions left without a GPU, L before and after."""

    commands: tuple[Command, ...]
    unplaced: tuple[str, ...]
    worst_before: float
    worst_after: float
    loads: dict[str, int]


class _Pool:
    """Mutable working copy of the placement, private to one call."""

    def __init__(self, snapshot: Snapshot, model: LatencyModel, cfg: RebalanceConfig) -> None:
        gpus = sorted(snapshot.gpus, key=lambda g: g.id)
        self.cfg = cfg
        self.ids = [g.id for g in gpus]
        types = sorted({g.type for g in gpus})
        tindex = {t: k for k, t in enumerate(types)}
        self.profiles = [model[t] for t in types]
        self.curves = [p.curve for p in self.profiles]
        self.tidx = [tindex[g.type] for g in gpus]
        self.cap = [self.profiles[k].capacity for k in self.tidx]
        self.usable = [g.state is GpuState.READY for g in gpus]
        self.draining = [i for i, g in enumerate(gpus) if g.state is GpuState.DRAINING]
        m = len(gpus)
        raw: list[list[Session]] = [[] for _ in range(m)]
        by_id = dict(zip(self.ids, raw))
        self.bytes: dict[str, int] = {}
        self.pending: list[tuple[str, bool]] = []
        for s in snapshot.sessions:  # the hot loop of large pools: keep it lean
            if s.lifecycle is _EXEC:
                lst = by_id.get(s.gpu_id)
                if lst is not None:
                    lst.append(s)
                else:  # waiting for a GPU, or its GPU is gone: restore elsewhere
                    self.pending.append((s.id, s.restore or s.gpu_id is not None))
        self.raw = raw
        self.members: list[list[tuple[int, str]] | None] = [None] * m  # heaps, built on first use
        self.n = [len(x) for x in raw]
        self.loc: dict[str, int] = {}
        self.home: dict[str, int] = {}
        self.fresh: dict[str, bool] = {}
        self.heap = [(-self.lat(i), i) for i in range(m)]
        heapq.heapify(self.heap)
        self.free: list[list[tuple[int, int]]] = [[] for _ in types]
        for i in range(m):
            if self.usable[i] and self.n[i] < self.cap[i]:
                self.free[self.tidx[i]].append((self.n[i], i))
        for h in self.free:
            heapq.heapify(h)

    def lat(self, i: int, extra: int = 0) -> float:
        c, n = self.curves[self.tidx[i]], self.n[i] + extra
        return c[n] if n < len(c) else self.profiles[self.tidx[i]].latency(n)

    def set_n(self, i: int, n: int) -> None:
        self.n[i] = n
        heapq.heappush(self.heap, (-self.lat(i), i))
        if self.usable[i] and n < self.cap[i]:
            heapq.heappush(self.free[self.tidx[i]], (n, i))

    def top(self) -> tuple[float, int]:
        h = self.heap
        while -h[0][0] != self.lat(h[0][1]):
            heapq.heappop(h)
        return -h[0][0], h[0][1]

    def best_target(self, exclude: set[int]) -> int | None:
        best: tuple[float, int] | None = None
        for h in self.free:
            aside = []
            while h:
                n, i = h[0]
                if n != self.n[i] or n >= self.cap[i]:
                    heapq.heappop(h)
                elif i in exclude:
                    aside.append(heapq.heappop(h))
                else:
                    cand = (self.lat(i, 1), i)
                    if best is None or cand < best:
                        best = cand
                    break
            for e in aside:
                heapq.heappush(h, e)
        return None if best is None else best[1]

    def heap_of(self, i: int) -> list[tuple[int, str]]:
        h = self.members[i]
        if h is None:
            h = self.members[i] = [(s.state_bytes, s.id) for s in self.raw[i]]
            heapq.heapify(h)
        return h

    def pop_cheapest(self, i: int) -> tuple[int, str] | None:
        h = self.heap_of(i)
        loc = self.loc
        while h:
            key, sid = heapq.heappop(h)
            if loc.get(sid, i) == i:
                return key, sid
        return None

    def push(self, i: int, entry: tuple[int, str]) -> None:
        heapq.heappush(self.heap_of(i), entry)

    def kappa(self, key: int) -> float:
        return 0.0 if key == _FRESH else self.cfg.kappa(key)

    def too_slow(self, key: int, dst: int) -> bool:
        """Whether moving a session (cost key ``key``) to ``dst`` breaks max_transient_s."""
        if key == _FRESH or self.cfg.max_transient_s == math.inf:
            return False  # placed this epoch: it has not started anywhere yet
        return self.cfg.transient(self.cfg.kappa(key), self.lat(dst), self.lat(dst, 1)) > self.cfg.max_transient_s

    def move(self, entry: tuple[int, str], src: int, dst: int) -> None:
        sid = entry[1]
        if entry[0] != _FRESH:
            self.home.setdefault(sid, src)
            self.bytes[sid] = entry[0]
        self.loc[sid] = dst
        self.push(dst, entry)
        self.set_n(src, self.n[src] - 1)
        self.set_n(dst, self.n[dst] + 1)


def _evacuate(pool: _Pool, order: list[str], gamma: dict[str, tuple[float, str]]) -> None:
    """Move draining GPUs' sessions off, cheapest first, keeping room for the waiting ones."""
    eta, cap = pool.cfg.eta, pool.cfg.drain_max_kappa_s
    room = sum(max(0, c - n) for c, n, u in zip(pool.cap, pool.n, pool.usable) if u) - len(pool.pending)
    for src in pool.draining:
        while pool.n[src] > 0 and room > 0:
            entry = pool.pop_cheapest(src)
            if entry is not None and pool.kappa(entry[0]) > cap:
                pool.push(src, entry)  # the rest are dearer still: they leave when idle
                break
            dst = pool.best_target(set()) if entry is not None else None
            if entry is None or dst is None or pool.too_slow(entry[0], dst):
                if entry is not None:
                    pool.push(src, entry)  # the best target now: none better for the rest
                return
            before = pool.top()[0]
            room -= 1
            pool.move(entry, src, dst)
            if entry[1] not in gamma and entry[1] not in pool.fresh:
                order.append(entry[1])
            gamma[entry[1]] = (before - pool.top()[0] - eta * pool.kappa(entry[0]), "drain")


class _Parsed:
    """The snapshot as arrays: GPUs by id, placed sessions cheapest first per GPU."""

    def __init__(self, snapshot: Snapshot, model: LatencyModel, cfg: RebalanceConfig) -> None:
        gpus = sorted(snapshot.gpus, key=lambda g: g.id)
        self.ids = [g.id for g in gpus]
        types = sorted({g.type for g in gpus})
        tindex = {t: k for k, t in enumerate(types)}
        self.profiles = [model[t] for t in types]
        self.caps = [p.capacity for p in self.profiles]
        self.tidx = np.array([tindex[g.type] for g in gpus], dtype=np.int64)
        self.usable = np.array([g.state is GpuState.READY for g in gpus], dtype=bool)
        index = {g.id: i for i, g in enumerate(gpus)}
        execs = [s for s in snapshot.sessions if s.lifecycle is _EXEC]  # the hot loops of large pools
        where = np.fromiter(map(index.get, map(_GPU_ID, execs), repeat(-1)), np.int64, len(execs))
        size = np.fromiter(map(_BYTES, execs), np.int64, len(execs))
        # waiting for a GPU, or its GPU is gone: restore elsewhere
        self.pending = [(execs[k].id, execs[k].restore or execs[k].gpu_id is not None) for k in np.nonzero(where < 0)[0].tolist()]
        placed = np.nonzero(where >= 0)[0]
        order = placed[np.lexsort((size[placed], where[placed]))]
        self.execs = execs
        self.order = order  # indices into execs: by GPU, then state bytes, then snapshot order
        self.have = np.bincount(where[placed], minlength=len(gpus)).astype(np.int64)
        self.start = np.concatenate(([0], np.cumsum(self.have)))
        self.kappa = cfg.alpha_s + cfg.beta_s_per_byte * size[order].astype(np.float64)
        curves = []
        for t, p in enumerate(self.profiles):
            mine = self.have[self.tidx == t]
            top = max(p.capacity, int(mine.max()) if mine.size else 0)
            curves.append(np.array(p.curve[: top + 1] if len(p.curve) > top else [p.latency(n) for n in range(top + 1)]))
        self.curves = curves
        width = max((len(c) for c in curves), default=1)
        self.lat = np.full((len(curves), width), np.inf)
        for t, c in enumerate(curves):
            self.lat[t, : len(c)] = c


def _assign(pz: _Parsed, receive: np.ndarray, shed: np.ndarray, limit: float) -> tuple[list[tuple[int, int, int]], list[int | None], np.ndarray]:
    """Land the shed sessions (largest kappa first, each on the next position of a GPU it
    fits, lowest l(n - 1) + l(n) first) and the arrivals (least l(n) first) on the receiving
    GPUs' positions up to ``receive``; returns (exec index, src, dst) moves, arrival GPUs, loads."""
    m = len(pz.ids)
    cap = np.where(pz.usable & (shed == 0), np.maximum(0, receive[pz.tidx] - pz.have), 0)
    gpu = np.repeat(np.arange(m), cap)
    n = pz.have[gpu] + 1 + np.arange(gpu.size) - np.repeat(np.cumsum(cap) - cap, cap)
    lat = pz.lat[pz.tidx[gpu], n]
    taken = np.zeros(gpu.size, dtype=bool)
    loads = pz.have - shed
    moves: list[tuple[int, int, int]] = []
    if shed.any():
        rank = np.arange(len(pz.order)) - np.repeat(pz.start[:-1], pz.have)
        owner = np.repeat(np.arange(m), pz.have)
        pick = np.nonzero(rank < shed[owner])[0]
        pick = pick[np.lexsort((pick, -pz.kappa[pick]))]  # largest kappa first
        key = lat if limit == math.inf else pz.lat[pz.tidx[gpu], n - 1] + lat
        slots = np.lexsort((n, gpu, key))[: pick.size]
        fits = key[slots] <= limit - pz.kappa[pick] if limit != math.inf else np.ones(pick.size, dtype=bool)
        taken[slots[fits]] = True  # every one fits once the level passed the transient check
        np.add.at(loads, owner[pick[~fits]], 1)
        moves = list(zip(pz.order[pick[fits]].tolist(), owner[pick[fits]].tolist(), gpu[slots[fits]].tolist()))
    free = np.lexsort((n, gpu, lat))
    free = free[~taken[free]][: len(pz.pending)].tolist()
    arrivals: list[int | None] = gpu[free].tolist() + [None] * (len(pz.pending) - len(free))
    loads = loads + np.bincount(gpu[taken], minlength=m) + np.bincount(gpu[free], minlength=m)
    return moves, arrivals, loads


def _commands(pz: _Parsed, moves: list[tuple[int, int, int]], arrivals: list[int | None], gain: float,
              cfg: RebalanceConfig, drained: dict[str, tuple[str, float]]) -> tuple[list[Command], list[str]]:
    """Place/Resume for arrivals, then Migrate from each moved session's original GPU."""
    ids = pz.ids
    cmds: list[Command] = []
    unplaced: list[str] = []
    for (sid, restore), dst in zip(pz.pending, arrivals):
        if dst is None:
            unplaced.append(sid)
        else:
            cmds.append(Resume(sid, ids[dst]) if restore else Place(sid, ids[dst]))
    moved = set()
    for k, src, dst in moves:
        s = pz.execs[k]
        moved.add(s.id)
        home = drained[s.id][0] if s.id in drained else ids[src]
        cmds.append(Migrate(s.id, home, ids[dst], gain, cfg.kappa(s.state_bytes), "rebalance"))
    if drained:
        for s in pz.execs:
            if s.id in drained and s.id not in moved and s.gpu_id is not None:
                home, g = drained[s.id]
                cmds.append(Migrate(s.id, home, s.gpu_id, g, cfg.kappa(s.state_bytes), "drain"))
    return cmds, unplaced


def _drain(snapshot: Snapshot, model: LatencyModel, cfg: RebalanceConfig) -> tuple[Snapshot, dict[str, tuple[str, float]]]:
    """The snapshot after the greedy evacuation of draining GPUs, and the sessions it moved
    (id -> (draining GPU, gain))."""
    pool = _Pool(snapshot, model, cfg)
    order: list[str] = []
    gamma: dict[str, tuple[float, str]] = {}
    _evacuate(pool, order, gamma)
    if not order:
        return snapshot, {}
    ids = pool.ids
    where = {sid: ids[pool.loc[sid]] for sid in order}
    sessions = tuple(replace(s, gpu_id=where[s.id]) if s.id in where else s for s in snapshot.sessions)
    return replace(snapshot, sessions=sessions), {sid: (ids[pool.home[sid]], gamma[sid][0]) for sid in order}


def plan_placement(
    snapshot: Snapshot,
    model: LatencyModel,
    config: RebalanceConfig = RebalanceConfig(),
    *,
    rebalance: bool = True,
) -> PlacementPlan:
    """Evacuate draining GPUs, place waiting sessions and rebalance exactly (when
    ``rebalance``; otherwise only place waiting sessions, least-latency first).

    Returns Place/Resume for sessions that get a GPU, then Migrate commands (largest kappa
    first; a session moved twice gets one Migrate from its old GPU to its final one).
    """
    drained: dict[str, tuple[str, float]] = {}
    pz = _Parsed(snapshot, model, config)
    worst_before = float(pz.lat[pz.tidx, pz.have].max()) if pz.ids else 0.0
    if rebalance and any(g.state is GpuState.DRAINING for g in snapshot.gpus):
        view, drained = _drain(snapshot, model, config)
        if drained:
            pz = _Parsed(view, model, config)
    m = len(pz.ids)
    if m == 0:
        return PlacementPlan((), tuple(sid for sid, _ in pz.pending), 0.0, 0.0, {})
    if rebalance:
        level = search(pz.curves, pz.caps, pz.tidx, pz.have, pz.usable, pz.kappa, pz.start, len(pz.pending),
                       config.eta, config.max_transient_s, config.max_moves)
        receive, shed, gain = level.receive, level.shed, level.baseline - level.objective
    else:
        receive, shed, gain = np.array(pz.caps), np.zeros(m, dtype=np.int64), 0.0
    moves, arrivals, loads = _assign(pz, receive, shed, config.max_transient_s)
    cmds, unplaced = _commands(pz, moves, arrivals, gain, config, drained)
    worst_after = float(pz.lat[pz.tidx, loads].max())
    return PlacementPlan(tuple(cmds), tuple(unplaced), worst_before, worst_after, dict(zip(pz.ids, loads.tolist())))


def worst_latency(snapshot: Snapshot, model: LatencyModel) -> float:
    """L = max_j l_j(n_j) over the snapshot's placement (0 for an empty pool)."""
    types = {g.id: g.type for g in snapshot.gpus}
    return max((model[types[g]].latency(n) for g, n in snapshot.loads().items()), default=0.0)
