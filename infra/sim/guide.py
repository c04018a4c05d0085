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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from processors.latency import GpuProfile
from processors.lifecycle import EventKind, SessionEvent

__all__ = ["MissGuide", "miss_guide"]


@dataclass(frozen=True, eq=False)
class MissGuide:
    """Executing sessions over time (``load`` for ``dt`` seconds each) and at each first
    chunk (``first``), with the latency curve tabulated on ``0..len(curve) - 1``."""

    first: np.ndarray
    load: np.ndarray
    dt: np.ndarray
    curve: np.ndarray
    deadline_s: float

    def _l(self, n: np.ndarray) -> np.ndarray:
        return np.interp(n, np.arange(len(self.curve)), self.curve)

    def rate(self, pool: int) -> float:
        """Estimated share of chunks past their deadline on ``pool`` GPUs."""
        if pool < 1 or not len(self.load):
            return 0.0
        n = np.maximum(self.first / pool, 1.0)
        before, own = self._l(n - 1.0), self._l(n)
        late = np.where(before > 0, np.clip((before + own - self.deadline_s) / np.maximum(before, 1e-12), 0.0, 1.0),
                        (own > self.deadline_s).astype(float))
        chunks = float((self.load / self._l(np.maximum(self.load / pool, 1.0)) * self.dt).sum())
        return float(late.sum()) / chunks if chunks > 0 else 0.0

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


def miss_guide(events: Sequence[SessionEvent], profile: GpuProfile, deadline_s: float) -> MissGuide:
    """:class:`MissGuide` of a trace for GPUs of ``profile``."""
    executing: set[str] = set()
    first: list[int] = []
    times: list[float] = []
    load: list[int] = []
    for ev in events:
        if ev.kind in (EventKind.OPEN, EventKind.ACTIVE):
            if ev.session_id not in executing:
                executing.add(ev.session_id)
                first.append(len(executing))
        else:
            executing.discard(ev.session_id)
        times.append(ev.t)
        load.append(len(executing))
    t = np.asarray(times, dtype=float)
    dt = np.diff(t, append=t[-1]) if len(t) else t
    top = max(load, default=0) + 2
    curve = np.asarray([profile.latency(n) for n in range(top + 1)], dtype=float)
    return MissGuide(np.asarray(first, dtype=float), np.asarray(load, dtype=float), dt, curve, deadline_s)
