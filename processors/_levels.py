"""Exact min-max placement with migration cost, by a search over the worst-latency level.

For a level L, GPU j may hold at most N_j(L) = max{n : l_j(n) <= L} sessions (at most K to
receive any). A GPU above that sheds its cheapest sessions down to N_j(L); the others absorb
the shed sessions and the waiting ones up to min(K, N_j(L)). Shedding the cheapest is never
worse (less cost, looser transient limit), so the best placement at level L costs
L + eta * sum(shed kappa), and the optimum is the minimum over the finite set of l_j(n).

Feasibility only grows with L (fewer sheds, more room), so the lowest feasible level is
found by bisection. A level is feasible when the room holds the sheds plus the waiting
sessions, the sheds fit the move budget, and (transient limit T) the shed sessions, largest
kappa first, find landing positions n on receiving GPUs with kappa + l(n - 1) + l(n) <= T:
a nested matching, checked by Hall's condition (the i-th largest kappa needs i positions it
fits). Pure numpy; no placement objects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["Level", "search", "landings"]

_TIE = 1e-12


@dataclass(frozen=True, slots=True)
class Level:
    """The chosen level: per-type keep (N) and receive (min(K, N)) bounds, sheds per GPU."""

    level: float
    keep: np.ndarray
    receive: np.ndarray
    shed: np.ndarray
    objective: float
    baseline: float  # objective of the best placement without moves


# Sums of latencies differ by a rounding as they are grouped (0.5 + 0.1 == 0.6, yet
# 0.6 - 0.1 < 0.5): a move exactly at the transient limit lands, however it is summed.
TRANSIENT_SLACK_S = 1e-9


def landings(curve: np.ndarray, cap: int, limit: float, kappa: np.ndarray | float) -> np.ndarray:
    """Highest landing position n <= cap with kappa + l(n - 1) + l(n) <= limit (0: none)."""
    if limit == math.inf:
        return np.full(np.shape(kappa), cap)
    pair = curve[:cap] + curve[1 : cap + 1]
    return np.searchsorted(pair, limit + TRANSIENT_SLACK_S - np.asarray(kappa), side="right")


class _Type:
    """Counting tables of one GPU type: sheds above a keep bound, room below a receive bound."""

    def __init__(self, curve: np.ndarray, cap: int, have: np.ndarray, have_usable: np.ndarray) -> None:
        top = len(curve) - 1
        self.curve, self.cap = curve, cap
        cnt = np.bincount(have, minlength=top + 1)
        tot = np.bincount(have, weights=have, minlength=top + 1)
        # above[N]: GPUs with more than N sessions; above_sum[N]: their sessions
        self.above = np.concatenate((np.cumsum(cnt[::-1])[::-1][1:], [0]))
        self.above_sum = np.concatenate((np.cumsum(tot[::-1])[::-1][1:], [0.0]))
        cnt_u = np.bincount(have_usable, minlength=top + 2)[: cap + 1]
        tot_u = np.bincount(have_usable, weights=have_usable, minlength=top + 2)[: cap + 1]
        # below[v]: usable GPUs with fewer than v sessions; below_sum[v]: their sessions
        self.below = np.concatenate(([0], np.cumsum(cnt_u)))[: cap + 1]
        self.below_sum = np.concatenate(([0.0], np.cumsum(tot_u)))[: cap + 1]

    def shed(self, keep: np.ndarray) -> np.ndarray:
        return self.above_sum[keep] - keep * self.above[keep]

    def room(self, receive: np.ndarray) -> np.ndarray:
        return receive * self.below[receive] - self.below_sum[receive]


def _lowest_within_limit(lo: int, hi: int, types: Sequence["_Type"], tidx: np.ndarray, have: np.ndarray,
                         kappa: np.ndarray, start: np.ndarray, keep: np.ndarray, receive: np.ndarray,
                         limit: float) -> int:
    """The lowest level from ``lo`` whose moves all land within the transient limit (a
    bisection: a higher level sheds fewer sessions, so passing is monotone)."""
    rank = np.arange(len(kappa)) - np.repeat(start[:-1], np.diff(start))
    owner = np.repeat(np.arange(len(have)), np.diff(start))

    def fits(k: int) -> bool:
        shed = np.maximum(0, have - keep[tidx, k])
        moved = np.sort(kappa[rank < shed[owner]])[::-1]
        if moved.size == 0:
            return True
        slots = np.zeros(moved.size)
        for t, ty in enumerate(types):
            v = np.minimum(landings(ty.curve, ty.cap, limit, moved), receive[t, k])
            slots += v * ty.below[v] - ty.below_sum[v]
        return bool(np.all(np.arange(1, moved.size + 1) <= slots))

    if lo >= hi or fits(lo):  # the common case: the bisection would end there
        return lo
    lo, top = lo + 1, hi
    while lo < top:
        mid = (lo + top) // 2
        if fits(mid):
            top = mid
        else:
            lo = mid + 1
    return lo


_TABLES: dict[tuple[tuple[bytes, int], ...], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}


def _table(curves: Sequence[np.ndarray], caps: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The candidate levels (every l_t(n)) and, per type and level, the keep bound N_t and
    the receive bound min(K_t, N_t); the same few pools recur at every decision, so kept."""
    key = tuple((c.tobytes(), int(k)) for c, k in zip(curves, caps))
    hit = _TABLES.get(key)
    if hit is None:
        levels = np.unique(np.concatenate([c for c in curves]))
        keep = np.stack([np.searchsorted(c, levels, side="right") - 1 for c in curves])
        receive = np.minimum(keep, np.asarray(caps)[:, None])
        for a in (levels, keep, receive):
            a.flags.writeable = False
        if len(_TABLES) >= 256:
            _TABLES.clear()
        hit = _TABLES[key] = (levels, keep, receive)
    return hit


def search(
    curves: Sequence[np.ndarray],
    caps: Sequence[int],
    tidx: np.ndarray,
    have: np.ndarray,
    usable: np.ndarray,
    kappa: np.ndarray,
    start: np.ndarray,
    waiting: int,
    eta: float,
    limit: float,
    budget: int,
) -> Level:
    """The min-max placement with migration cost; ``kappa`` holds each GPU's sessions sorted
    ascending from ``start[j]``; ``curves[t]`` holds l_t(0..top) with top >= K and every load."""
    types = []
    for t, (curve, cap) in enumerate(zip(curves, caps)):
        mine = tidx == t
        types.append(_Type(curve, cap, have[mine], have[mine & usable]))
    levels, keep, receive = _table(curves, caps)
    sheds = sum(ty.shed(keep[t]) for t, ty in enumerate(types))
    room = sum(ty.room(receive[t]) for t, ty in enumerate(types))
    placed = min(waiting, int(room[-1]))
    ok = (sheds + placed <= room) & (sheds <= budget)
    lo = int(np.argmax(ok))  # ok is monotone and holds at the top level (no sheds)
    hi = len(levels) - 1
    if limit != math.inf:
        lo = _lowest_within_limit(lo, hi, types, tidx, have, kappa, start, keep, receive, limit)
    cum = np.concatenate(([0.0], np.cumsum(kappa)))
    src = np.nonzero(have > keep[tidx, lo])[0]
    if src.size:
        shed = np.maximum(0, have[src, None] - keep[tidx[src], lo:])
        cost = (cum[start[src, None] + shed] - cum[start[src, None]]).sum(axis=0)
    else:
        cost = np.zeros(hi - lo + 1)
    obj = levels[lo:] + eta * cost
    best = obj.min()
    pick = lo + int(np.nonzero(obj <= best + _TIE)[0][-1])  # fewest moves among the best
    base = lo + int(np.argmax(sheds[lo:] == 0))
    return Level(
        float(levels[pick]),
        keep[:, pick],
        receive[:, pick],
        np.maximum(0, have - keep[tidx, pick]),
        float(obj[pick - lo]),
        float(obj[base - lo]),
    )
