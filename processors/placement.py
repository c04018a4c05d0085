"""Placement controller: least-loaded arrival placement and migration-aware min-max rebalancing.

Rebalancing starts from the previous placement. A step takes the bottleneck GPU b (worst
latency L) and moves one session off it to a target t; the new worst latency is
L' = max(second-worst, l_b(n_b - 1), l_t(n_t + 1)) and the gain is
Gamma = L - L' - eta * kappa_i with kappa_i = alpha + beta * state_bytes_i. Candidate
evaluation is exact but cheap by construction: L' depends only on the target and kappa only
on the session, so the best pair is (cheapest session on b, target with the least
l_t(n_t + 1)), found with one lazy min-heap of loads per GPU type.

Ties: when several GPUs share the worst latency no single move lowers L, so a step may take
the bottleneck *set*: it keeps moving one session off the GPU that now binds L' while that
GPU is untouched, evaluates Gamma after each prefix (summing kappa over the prefix) and
applies the prefix with the largest Gamma > 0. With one bottleneck GPU this is the paper's
rule exactly. Steps repeat until no prefix has Gamma > 0 or the move budget is spent.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from processors._levels import landings, search
from processors.decisions import Command, Migrate, Place, Resume
from processors.latency import LatencyModel
from processors.lifecycle import SessionState
from processors.snapshot import GpuState, Session, Snapshot
from schemas.errors import ConfigError

__all__ = ["RebalanceConfig", "PlacementPlan", "plan_placement", "worst_latency"]

_EXEC = SessionState.EXECUTION
_FRESH = -1  # cost key of a session placed in this epoch: moving it is free


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


def _place_pending(pool: _Pool, order: list[str]) -> list[str]:
    unplaced = []
    for sid, restore in pool.pending:
        dst = pool.best_target(set())
        if dst is None:
            unplaced.append(sid)
            continue
        pool.fresh[sid] = restore
        pool.loc[sid] = dst
        pool.push(dst, (_FRESH, sid))
        pool.set_n(dst, pool.n[dst] + 1)
        order.append(sid)
    return unplaced


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


def _members(pool: _Pool, i: int) -> list[tuple[int, str]]:
    """(state_bytes, id) of the sessions GPU i holds now, cheapest first."""
    h = pool.members[i]
    if h is None:
        return sorted([(s.state_bytes, s.id) for s in pool.raw[i]])
    return sorted(e for e in h if pool.loc.get(e[1], i) == i and e[0] != _FRESH)


def _curve(pool: _Pool, t: int, top: int) -> np.ndarray:
    c = pool.curves[t]
    if len(c) > top:
        return np.asarray(c[: top + 1])
    return np.array([pool.profiles[t].latency(n) for n in range(top + 1)])


def _rebalance(pool: _Pool, order: list[str], gamma: dict[str, tuple[float, str]]) -> list[str]:
    """Exact level search, then sheds land largest kappa first, then arrivals; returns unplaced."""
    cfg, m = pool.cfg, len(pool.ids)
    touched = {pool.loc[sid] for sid in pool.loc} | {pool.home[sid] for sid in pool.home}
    flat: list[int] = []
    start = [0]
    for i in range(m):  # the hot loop of large pools: plain sorted ints
        if i in touched:
            flat.extend(b for b, _ in _members(pool, i))
        else:
            flat.extend(sorted([s.state_bytes for s in pool.raw[i]]))
        start.append(len(flat))
    tidx = np.array(pool.tidx, dtype=np.int64)
    have = np.array(pool.n, dtype=np.int64)
    curves = []
    for t, p in enumerate(pool.profiles):
        mine = have[tidx == t]
        curves.append(_curve(pool, t, max(p.capacity, int(mine.max()) if mine.size else 0)))
    caps = [p.capacity for p in pool.profiles]
    kappa = cfg.alpha_s + cfg.beta_s_per_byte * np.array(flat, dtype=np.float64)
    level = search(curves, caps, tidx, have, np.array(pool.usable), kappa, np.array(start), len(pool.pending),
                   cfg.eta, cfg.max_transient_s, cfg.max_moves)
    shed = level.shed.tolist()
    moved: list[tuple[int, str, int]] = []
    for i in range(m):
        if shed[i]:
            moved.extend((b, sid, i) for b, sid in _members(pool, i)[: shed[i]])
    moved.sort(key=lambda e: (-e[0], e[1]))
    receive = level.receive.tolist()
    n = pool.n
    heaps: list[list[tuple[int, int]]] = [[] for _ in pool.profiles]
    for i in range(m):
        if pool.usable[i] and not shed[i] and n[i] < receive[pool.tidx[i]]:
            heaps[pool.tidx[i]].append((n[i], i))
    for h in heaps:
        heapq.heapify(h)

    def land(bound: list[int]) -> int | None:
        best: tuple[float, int] | None = None
        for t, h in enumerate(heaps):
            if h and h[0][0] < bound[t]:
                cand = (pool.lat(h[0][1], 1), h[0][1])
                if best is None or cand < best:
                    best = cand
        if best is None:
            return None
        i = best[1]
        t = pool.tidx[i]
        heapq.heappop(heaps[t])
        n[i] += 1
        if n[i] < receive[t]:
            heapq.heappush(heaps[t], (n[i], i))
        return i

    gain = level.baseline - level.objective
    for b, sid, src in moved:
        k = cfg.kappa(b)
        bound = [min(r, int(landings(c, p.capacity, cfg.max_transient_s, k))) for r, c, p in zip(receive, curves, pool.profiles)]
        dst = land(bound)
        if dst is None:
            continue  # cannot happen when the level passed the transient check
        n[src] -= 1
        pool.home.setdefault(sid, src)
        pool.bytes[sid] = b
        pool.loc[sid] = dst
        if sid not in gamma:
            order.append(sid)
        gamma[sid] = (gain, "rebalance")
    unplaced = []
    arrivals = []
    for sid, restore in pool.pending:
        dst = land(receive)
        if dst is None:
            unplaced.append(sid)
            continue
        pool.fresh[sid] = restore
        pool.loc[sid] = dst
        arrivals.append(sid)
    order[:0] = arrivals
    return unplaced


def plan_placement(
    snapshot: Snapshot,
    model: LatencyModel,
    config: RebalanceConfig = RebalanceConfig(),
    *,
    rebalance: bool = True,
) -> PlacementPlan:
    """Evacuate draining GPUs, then place waiting sessions and rebalance exactly (when
    ``rebalance``; otherwise only place waiting sessions on the least-loaded GPU).

    Returns Place/Resume for sessions that get a GPU, then Migrate commands; a session that
    moves more than once in the epoch gets one Migrate from its old GPU to its final one.
    """
    pool = _Pool(snapshot, model, config)
    worst_before = max((pool.lat(i) for i in range(len(pool.ids))), default=0.0)
    order: list[str] = []
    gamma: dict[str, tuple[float, str]] = {}
    if not rebalance:
        unplaced = _place_pending(pool, order)
    elif not pool.ids:
        unplaced = [sid for sid, _ in pool.pending]
    else:
        _evacuate(pool, order, gamma)
        unplaced = _rebalance(pool, order, gamma)
    cmds: list[Command] = []
    migrations: list[Command] = []
    ids = pool.ids
    for sid in order:
        dst = pool.loc[sid]
        if sid in pool.fresh:
            cmds.append(Resume(sid, ids[dst]) if pool.fresh[sid] else Place(sid, ids[dst]))
        elif pool.home[sid] != dst:
            g, why = gamma[sid]
            migrations.append(Migrate(sid, ids[pool.home[sid]], ids[dst], g, config.kappa(pool.bytes[sid]), why))
    worst_after = max((pool.lat(i) for i in range(len(ids))), default=0.0)
    loads = dict(zip(ids, pool.n))
    return PlacementPlan(tuple(cmds + migrations), tuple(unplaced), worst_before, worst_after, loads)


def worst_latency(snapshot: Snapshot, model: LatencyModel) -> float:
    """L = max_j l_j(n_j) over the snapshot's placement (0 for an empty pool)."""
    types = {g.id: g.type for g in snapshot.gpus}
    return max((model[types[g]].latency(n) for g, n in snapshot.loads().items()), default=0.0)
