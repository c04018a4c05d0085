"""Placement controller: arrivals, draining GPUs, and exact migration-aware min-max rebalancing.

One round minimises L + eta * sum(kappa_i) over the sessions it migrates, where L is the
worst per-chunk latency after the round and kappa_i = alpha + beta * state_bytes_i, from the
previous placement, with the round's arrivals placed too. The minimum is exact
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

import bisect
import heapq
import math
from dataclasses import dataclass, replace
from functools import lru_cache
from itertools import repeat
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from processors._levels import TRANSIENT_SLACK_S, search
from processors.decisions import Command, Migrate, Place, Restore
from processors.latency import GpuProfile, LatencyModel
from processors.lifecycle import SessionState
from processors.snapshot import Gpu, GpuState, Snapshot
from schemas.errors import ConfigError

__all__ = ["RebalanceConfig", "PlacementPlan", "plan_placement", "admission_order", "free_positions", "ADMIT_LIMIT",
           "worst_latency"]

#: the most entries of an admission order (the sessions expected before the next round,
#: with room to spare; past it a session goes least-loaded)
ADMIT_LIMIT = 128

_EXEC = SessionState.EXECUTION


@dataclass(frozen=True, slots=True)
class RebalanceConfig:
    """Migration cost model (alpha-beta), its weight eta, and the per-round move budget.

    ``drain_max_kappa_s`` bounds which sessions a draining GPU sheds by migration: a larger
    one would stall its next chunk longer than that, so it stays until it goes idle or
    closes (the GPU shuts down a little later instead). ``max_transient_s`` bounds any move
    by the moved session's next chunk at worst (:meth:`transient`) at the position it lands
    on (a GPU's moves land largest kappa first, ahead of its new sessions): a move that
    would make that chunk slower than this is not made.
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

    def within(self, transient_s: float) -> bool:
        """Whether a move's :meth:`transient` keeps the limit (up to a float rounding)."""
        return transient_s <= self.max_transient_s + TRANSIENT_SLACK_S


@dataclass(frozen=True, slots=True)
class PlacementPlan:
    """Commands of one placement round, sessions left without a GPU, L before and after."""

    commands: tuple[Command, ...]
    unplaced: tuple[str, ...]
    worst_before: float
    worst_after: float
    loads: dict[str, int]


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
        self.draining = np.array([g.state is GpuState.DRAINING for g in gpus], dtype=bool)
        index = {g.id: i for i, g in enumerate(gpus)}
        # the hot loops of large pools: list comprehensions (faster than map/compress chains)
        execs = [s for s in snapshot.sessions if s.lifecycle is _EXEC]
        where = np.fromiter([index.get(s.gpu_id, -1) for s in execs], np.int64, len(execs))
        size = np.array([s.state_bytes for s in execs], np.int64)
        # waiting for a GPU, or its GPU is gone: restore elsewhere
        self.pending = [(execs[k].id, execs[k].restore or execs[k].gpu_id is not None) for k in np.nonzero(where < 0)[0].tolist()]
        placed = np.nonzero(where >= 0)[0]
        if size.size and 0 <= int(size.min()) and int(size.max()) < 1 << 41 and len(gpus) < 1 << 21:  # one key: GPU, then bytes (stable)
            order = placed[np.argsort((where[placed] << 41) | size[placed], kind="stable")]
        else:
            order = placed[np.lexsort((size[placed], where[placed]))]
        self.execs = execs
        self.order = order  # indices into execs: by GPU, then state bytes, then snapshot order
        self.have = np.bincount(where[placed], minlength=len(gpus)).astype(np.int64)
        self.start = np.concatenate(([0], np.cumsum(self.have)))
        self.kappa = cfg.alpha_s + cfg.beta_s_per_byte * size[order].astype(np.float64)
        tops = tuple(max(p.capacity, int(self.have[self.tidx == t].max(initial=0))) for t, p in enumerate(self.profiles))
        self.curves, self.lat = _curves(tuple(self.profiles), tops)


_CURVES: dict[tuple[tuple[GpuProfile, ...], tuple[int, ...]], tuple[list[np.ndarray], np.ndarray]] = {}


def _curves(profiles: tuple[GpuProfile, ...], tops: tuple[int, ...]) -> tuple[list[np.ndarray], np.ndarray]:
    """Each type's l(0..top), and all of them as one matrix padded with inf (read-only: the
    same few pools recur at every decision, so kept)."""
    hit = _CURVES.get((profiles, tops))
    if hit is None:
        curves = [np.array(p.curve[: top + 1] if len(p.curve) > top else [p.latency(n) for n in range(top + 1)])
                  for p, top in zip(profiles, tops)]
        lat = np.full((len(curves), max((len(c) for c in curves), default=1)), np.inf)
        for t, c in enumerate(curves):
            lat[t, : len(c)] = c
        for a in (*curves, lat):
            a.flags.writeable = False
        if len(_CURVES) >= 256:
            _CURVES.clear()
        hit = _CURVES[(profiles, tops)] = (curves, lat)
    return hit


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
        fits = key[slots] <= limit + TRANSIENT_SLACK_S - pz.kappa[pick] if limit != math.inf else np.ones(pick.size, dtype=bool)
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
    """Place/Restore for arrivals, then Migrate from each moved session's original GPU."""
    ids = pz.ids
    cmds: list[Command] = []
    unplaced: list[str] = []
    for (sid, restore), dst in zip(pz.pending, arrivals):
        if dst is None:
            unplaced.append(sid)
        else:
            cmds.append(Restore(sid, ids[dst]) if restore else Place(sid, ids[dst]))
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


def _drain(snapshot: Snapshot, pz: _Parsed, cfg: RebalanceConfig,
           overdue: frozenset[str] = frozenset()) -> tuple[Snapshot, dict[str, tuple[str, float]]]:
    """Evacuate draining GPUs greedily: cheapest session first, to the GPU with the least
    l(n + 1), while kappa <= drain_max_kappa_s (any kappa on an ``overdue`` GPU), the move
    keeps the transient limit and room stays for the waiting sessions. Returns the snapshot
    after it and the moved sessions (id -> (draining GPU, the move's gain L - L' - eta *
    kappa))."""
    n = pz.have.copy()
    caps = np.asarray(pz.caps)[pz.tidx]
    room = int(np.maximum(0, caps - n)[pz.usable].sum()) - len(pz.pending)
    moved: dict[str, tuple[str, float]] = {}
    where: dict[str, str] = {}
    for src in np.nonzero(pz.draining & (pz.have > 0))[0].tolist():
        bound = math.inf if pz.ids[src] in overdue else cfg.drain_max_kappa_s
        for k in range(int(pz.start[src]), int(pz.start[src + 1])):
            kappa = float(pz.kappa[k])
            if kappa > bound or room <= 0:
                break  # the rest are dearer still: they leave when idle
            after = np.where(pz.usable & (n < caps), pz.lat[pz.tidx, np.minimum(n + 1, pz.lat.shape[1] - 1)], np.inf)
            dst = int(np.argmin(after))
            if after[dst] == np.inf or not cfg.within(cfg.transient(kappa, float(pz.lat[pz.tidx[dst], n[dst]]), float(after[dst]))):
                return _moved(snapshot, where), moved  # the best target now: none better for the rest
            before = float(pz.lat[pz.tidx, n].max())
            n[src] -= 1
            n[dst] += 1
            room -= 1
            s = pz.execs[int(pz.order[k])]
            where[s.id] = pz.ids[dst]
            moved[s.id] = (pz.ids[src], before - float(pz.lat[pz.tidx, n].max()) - cfg.eta * kappa)
    return _moved(snapshot, where), moved


def _moved(snapshot: Snapshot, where: dict[str, str]) -> Snapshot:
    if not where:
        return snapshot
    return replace(snapshot, sessions=tuple(replace(s, gpu_id=where[s.id]) if s.id in where else s for s in snapshot.sessions))


def plan_placement(
    snapshot: Snapshot,
    model: LatencyModel,
    config: RebalanceConfig = RebalanceConfig(),
    *,
    rebalance: bool = True,
    overdue: frozenset[str] = frozenset(),
) -> PlacementPlan:
    """Evacuate draining GPUs, place waiting sessions and rebalance exactly (when
    ``rebalance``; otherwise only place waiting sessions, least-latency first). A draining
    GPU in ``overdue`` sheds its sessions whatever their transfer time (the transient limit
    still holds each move), not only those within ``drain_max_kappa_s``.

    Returns Place/Restore for sessions that get a GPU, then Migrate commands (largest kappa
    first; a session moved twice gets one Migrate from its old GPU to its final one).
    """
    drained: dict[str, tuple[str, float]] = {}
    pz = _Parsed(snapshot, model, config)
    worst_before = float(pz.lat[pz.tidx, pz.have].max()) if pz.ids else 0.0
    if rebalance and pz.draining.any():
        view, drained = _drain(snapshot, pz, config, overdue)
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


def admission_order(snapshot: Snapshot, model: LatencyModel, loads: dict[str, int],
                    limit: int = ADMIT_LIMIT) -> tuple[tuple[str, int], ...]:
    """Where the next ``limit`` sessions go after this round's placement (``loads``): the free
    positions of the ready GPUs, least l(n) first (then fewest sessions, then GPU id), as
    (gpu_id, n) entries -- the rule the placement gives arrivals, applied ahead of them."""
    keys = {t: _latency_keys(model[t]) for t in {g.type for g in snapshot.gpus}}
    return free_positions(snapshot.gpus, loads, keys, limit)


@lru_cache(maxsize=256)
def _latency_keys(profile: GpuProfile) -> tuple[tuple[float, int], ...]:
    """The admission order's key of each position n = 1..K of a GPU type: (l(n), n)."""
    return tuple((profile.curve[k + 1], k + 1) for k in range(profile.capacity))


def free_positions(gpus: Iterable[Gpu], loads: Mapping[str, int], keys: Mapping[str, Sequence[Any]],
                   limit: int = ADMIT_LIMIT) -> tuple[tuple[str, int], ...]:
    """The first ``limit`` free positions of the ready ``gpus``, lowest key first, ties by GPU
    id, as (gpu_id, n) entries: the n-th session on a GPU of type t is keyed ``keys[t][n - 1]``
    (as many keys as the type's capacity), on top of the ``loads`` it holds. Every admission
    order (turboserve's, the greedy baselines') is this walk with its own keys."""
    table = {g.id: keys[g.type] for g in gpus if g.state is GpuState.READY}
    shared = {id(t) for t in table.values()}
    if len(shared) == 1:  # one type (the common case): the same walk, level by level
        t = next(iter(table.values()))
        if all(a <= b for a, b in zip(t, t[1:])):
            return _by_level(table, loads, t, limit)
    heap = [(t[n], gid, n + 1) for gid, t in table.items() if (n := loads.get(gid, 0)) < len(t)]
    heapq.heapify(heap)
    out: list[tuple[str, int]] = []
    while heap and len(out) < limit:
        _, gid, n = heap[0]  # the lowest (key, id): GPU ids are distinct, so the order is total
        out.append((gid, n))
        if n < len(table[gid]):
            heapq.heapreplace(heap, (table[gid][n], gid, n + 1))
        else:
            heapq.heappop(heap)
    return tuple(out)


def _by_level(table: Mapping[str, Sequence[Any]], loads: Mapping[str, int], t: Sequence[Any],
              limit: int) -> tuple[tuple[str, int], ...]:
    """:func:`free_positions` where every GPU has the same nondecreasing keys ``t``: the
    positions in order of (key, GPU id, n), emitted a run of equal keys at a time (each run
    of positions n, GPU by GPU in id order) without a heap."""
    by_load = sorted((min(loads.get(gid, 0), len(t)), gid) for gid in table)
    open_: list[str] = []  # GPUs with a free position at the current level, by id
    out: list[tuple[str, int]] = []
    k, lo = 0, 0
    while lo < len(t) and len(out) < limit:
        hi = lo + 1  # positions lo + 1 .. hi share one key
        while hi < len(t) and t[hi] == t[lo]:
            hi += 1
        while k < len(by_load) and by_load[k][0] < hi:
            bisect.insort(open_, by_load[k][1])
            k += 1
        if hi == lo + 1:  # one position per open GPU (keys that rise at every n)
            out.extend(zip(open_, repeat(hi)))
        else:
            for gid in open_:
                out.extend((gid, n) for n in range(max(lo, loads.get(gid, 0)) + 1, hi + 1))
                if len(out) >= limit:
                    break
        lo = hi
    return tuple(out[:limit])


def worst_latency(snapshot: Snapshot, model: LatencyModel) -> float:
    """L = max_j l_j(n_j) over the snapshot's placement (0 for an empty pool)."""
    types = {g.id: g.type for g in snapshot.gpus}
    return max((model[types[g]].latency(n) for g, n in snapshot.loads().items()), default=0.0)
