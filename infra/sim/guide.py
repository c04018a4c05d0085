"""A fluid estimate of a fixed pool's deadline-miss rate, to aim the SLO searches' probes.

A search for the smallest fixed pool meeting an SLO needs at least one full run that
passes; each probe past that is a run of the whole trace. The estimate says where to
look first: with every executing session spread evenly over ``pool`` GPUs of one type, a
session that starts executing (an open, a return) joins a GPU running ``n - 1`` others;
it waits out the running chunk (uniform in ``[0, l(n - 1)]``) and then runs its own
(``l(n)``), so it misses its deadline ``D`` with probability
``(l(n - 1) + l(n) - D) / l(n - 1)`` (clipped to [0, 1]); the GPUs record ``E / l(E /
pool)`` chunk latencies a second. Real placement is uneven and resumes pay their restore,
so a policy's measured rate at ``p`` GPUs is the estimate's at about ``c * p`` (uneven
placement wastes a share of the pool): a search calibrates ``c`` on each of its runs
(:meth:`MissGuide.pool_at`) and aims where ``c`` says. It only aims probes: every answer
is a run.

The same model bounds what elasticity can buy at an SLO (:meth:`MissGuide.elastic_bound`):
the cheapest pool that changes size freely, with no boot time, fractional GPUs and the
run's whole error budget spent where it saves most, against the cheapest fixed pool.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from processors.latency import GpuProfile
from processors.lifecycle import SessionEvent, SessionState, moves

__all__ = ["MissGuide", "ElasticBound", "miss_guide"]


@dataclass(frozen=True, slots=True)
class ElasticBound:
    """The fluid model's cheapest fixed pool meeting a miss rate (``fixed_gpus``), the
    least mean size any elastic pool can have meeting it (``elastic_gpus``) and the saving
    that leaves (``saving_pct``, 100 (1 - elastic / fixed))."""

    fixed_gpus: float
    elastic_gpus: float
    saving_pct: float
    feasible: bool = True  # False: no pool up to the search's cap meets the rate in the model

    def no_bound(self) -> str | None:
        """Why the saving bounds nothing a user can read (None when it does): the load is a
        share of one GPU (any real pool holds a whole one), or no pool meets the rate."""
        if not self.feasible:
            return "no fixed pool meets the SLO in the fluid model"
        if self.fixed_gpus < 1.0:
            return f"the load is under one GPU's ({self.fixed_gpus:.2f} GPUs for a fixed pool in the fluid model)"
        return None


@dataclass(frozen=True, eq=False)
class MissGuide:
    """Executing sessions over time (``load`` for ``dt`` seconds each from ``t``) and at
    each first chunk (``first``, at ``first_t``), with the latency curve tabulated on
    ``0..len(curve) - 1``."""

    first: np.ndarray
    load: np.ndarray
    dt: np.ndarray
    curve: np.ndarray
    deadline_s: float
    t: np.ndarray
    first_t: np.ndarray

    def _late(self, n: np.ndarray) -> np.ndarray:
        """Chance that a first chunk joining a GPU of ``n`` executing sessions (itself
        counted) misses its deadline."""
        n = np.maximum(n, 1.0)
        before, own = self._l(n - 1.0), self._l(n)
        return np.where(before > 0, np.clip((before + own - self.deadline_s) / np.maximum(before, 1e-12), 0.0, 1.0),
                        (own > self.deadline_s).astype(float))

    def _chunks(self, pool: float) -> float:
        return float((self.load / self._l(np.maximum(self.load / pool, 1.0)) * self.dt).sum())

    def _l(self, n: np.ndarray) -> np.ndarray:
        return np.interp(n, np.arange(len(self.curve)), self.curve)

    def rate(self, pool: int) -> float:
        """Estimated share of chunks past their deadline on ``pool`` GPUs."""
        if pool < 1 or not len(self.load):
            return 0.0
        return self._rate_at(pool)

    def _rate_at(self, pool: float) -> float:
        """The estimate on ``pool`` GPUs, a real number above 0 (a fluid pool may be less than one)."""
        chunks = self._chunks(pool)
        return float(self._late(self.first / pool).sum()) / chunks if chunks > 0 else 0.0

    def pool_at(self, miss_rate: float, cap: int) -> float:
        """The pool (a real number in [1, ``cap``]) where the estimate is ``miss_rate``."""
        lo, hi = 1.0, float(max(1, cap))
        if self.rate(lo) <= miss_rate:
            return lo
        if self.rate(hi) >= miss_rate:
            return hi
        while hi - lo > 1e-3:
            mid = (lo + hi) / 2
            if self.rate(mid) > miss_rate:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    def pool_for(self, miss_rate: float, cap: int) -> int:
        """Smallest pool up to ``cap`` whose estimate is within ``miss_rate``
        (``cap`` when none is); the estimate falls as the pool grows."""
        lo, hi = 1, max(1, cap)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.rate(mid) <= miss_rate:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def elastic_bound(self, miss_rate: float, capacity: int, end_s: float, segment_s: float = 10.0,
                      step: float = 0.005) -> ElasticBound:
        """What a perfectly elastic pool could save against a fixed one at ``miss_rate``,
        in this model. The fixed pool is the smallest (a real number) whose estimate meets
        the rate and that holds the peak at ``capacity`` sessions per GPU. The elastic pool
        may take any size in each ``segment_s`` span from 0 to ``end_s`` (at least its
        executing sessions over ``capacity``: a session that runs back to back misses
        nothing up to K), with no boot time, and may miss as many first chunks as the fixed
        pool's chunks allow, wherever they save most. Its least mean size is the Lagrangian
        dual of that problem over sizes on a geometric grid of ``step`` from one session's
        share of a GPU: no elastic pool in the model can be smaller by more than the grid's
        step, so the saving is an upper bound to within it."""
        if not len(self.load) or end_s <= 0:
            return ElasticBound(0.0, 0.0, 0.0)
        cap = float(max(1.0, self.first.max(initial=1.0), self.load.max() / capacity))
        fixed = self._least_pool(miss_rate, float(self.load.max()) / capacity, cap)
        budget = miss_rate * self._chunks(fixed)
        nseg = max(1, math.ceil(end_s / segment_s - 1e-9))
        span = np.minimum(segment_s, end_s - segment_s * np.arange(nseg))  # the last one may be cut short
        peak = self._span_peaks(segment_s, nseg)
        lo = 1.0 / capacity  # one session at K: the least a span with any session needs
        sizes = np.concatenate(([0.0], lo * (1.0 + step) ** np.arange(math.ceil(math.log(cap * 2.0 / lo) / math.log1p(step)) + 1)))
        late = np.zeros((nseg, len(sizes)))  # first chunks expected late per span and size (none: every one late)
        seg_of = np.minimum((self.first_t // segment_s).astype(int), nseg - 1)
        order = np.argsort(seg_of, kind="stable")
        bounds = np.searchsorted(seg_of[order], np.arange(nseg + 1))
        for s_ in range(nseg):
            # each executing count once, weighed by how many first chunks met it
            f, times = np.unique(self.first[order[bounds[s_]:bounds[s_ + 1]]], return_counts=True)
            late[s_, 0] = times.sum()
            for i in range(0, len(f), 256):  # in blocks: a mass return meets thousands of counts
                late[s_, 1:] += times[i:i + 256] @ self._late(f[i:i + 256, None] / sizes[None, 1:])
        gpu_s = np.where(sizes[None, :] >= peak[:, None] / capacity - 1e-12, sizes[None, :] * span[:, None], np.inf)

        def dual(lam: float) -> tuple[float, float]:  # (the dual's value, late chunks of its choice)
            obj = gpu_s + lam * late
            j = obj.argmin(axis=1)
            rows = np.arange(nseg)
            return float(obj[rows, j].sum()) - lam * budget, float(late[rows, j].sum())

        best, a, b = dual(0.0)[0], 1e-9, 1e9
        for _ in range(80):  # the dual is concave in lam; its slope (late - budget) falls through 0
            mid = math.sqrt(a * b)
            value, missed = dual(mid)
            best = max(best, value)
            a, b = (mid, b) if missed > budget else (a, mid)
        elastic = min(fixed, max(0.0, best) / end_s)
        # the model counts first chunks only: a deadline below one session's chunk (every chunk
        # late on any pool) is none that a pool meets either
        feasible = self._rate_at(fixed) <= miss_rate and float(self.curve[1]) <= self.deadline_s
        return ElasticBound(fixed, elastic, 100.0 * (1.0 - elastic / fixed) if fixed > 0 else 0.0, feasible=feasible)

    def _least_pool(self, miss_rate: float, lo: float, cap: float) -> float:
        """The smallest pool (a real number from ``lo`` up to ``cap``) whose estimate is within
        ``miss_rate`` (0 included: where no first chunk misses)."""
        hi = cap
        if self._rate_at(lo) <= miss_rate:
            return lo
        if self._rate_at(hi) > miss_rate:
            return hi
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if self._rate_at(mid) > miss_rate else (lo, mid)
        return hi

    def _span_peaks(self, segment_s: float, nseg: int) -> np.ndarray:
        """The most sessions executing for any time in each span: the load in force at its
        start and each load that lasts that begins in it (not the passing counts of several
        events at one instant)."""
        lasting = self.dt > 0
        at = np.minimum((self.t[lasting] // segment_s).astype(int), nseg - 1)
        peak = np.zeros(nseg)
        np.maximum.at(peak, at, self.load[lasting])
        before = np.searchsorted(self.t, segment_s * np.arange(nseg), side="right") - 1
        return np.maximum(peak, np.where(before >= 0, self.load[np.maximum(before, 0)], 0.0))


def miss_guide(events: Sequence[SessionEvent], profile: GpuProfile, deadline_s: float) -> MissGuide:
    """:class:`MissGuide` of a trace for GPUs of ``profile``."""
    executing: set[str] = set()
    first: list[int] = []
    first_t: list[float] = []
    times: list[float] = []
    load: list[int] = []
    for ev, _, now in moves(events):  # each session through the lifecycle table, as the simulator moves it
        if now is SessionState.EXECUTION:
            if ev.session_id not in executing:
                executing.add(ev.session_id)
                first.append(len(executing))
                first_t.append(ev.t)
        else:
            executing.discard(ev.session_id)
        times.append(ev.t)
        load.append(len(executing))
    t = np.asarray(times, dtype=float)
    dt = np.diff(t, append=t[-1]) if len(t) else t
    top = max(max(load, default=0), profile.capacity) + 2  # a fluid pool of less than one GPU may hold K
    curve = np.asarray([profile.latency(n) for n in range(top + 1)], dtype=float)
    return MissGuide(np.asarray(first, dtype=float), np.asarray(load, dtype=float), dt, curve, deadline_s, t,
                     np.asarray(first_t, dtype=float))
