"""The burst reserve: slots held for a rise the pool cannot boot for in time.

The autoscaler's demand counts a burst reserve: the largest rise of executing sessions
within one boot time seen over the last ``burst_memory_s`` (0 turns it off), each rise
weighted down linearly with its age; a fall within one bucket counts as a rise of its size (sessions that
go idle together come back together: :func:`record_active`). A pool only grows a boot time
after a burst starts, so what covers a burst is capacity held before it; bursts come in
sessions, not in shares of the load, so the reserve is a count of slots added to A / u*
(held at full capacity: it only has to carry a burst until the boot that follows), not a
lower u*. Measured on the tuning traces
(``infra.sim.evaluate.TUNE``), holding the reserve at u* and undecayed cost 14-35% over
the oracle told the future; at full capacity and decayed, 5-15%, and lower worst chunks
at matched cost against every paper baseline. Only the part of a rise that would fill the
pool held at A / u* past ``burst_utilization`` of its slots counts (default 0.75: a GPU at
0.75 K still runs a chunk in l(0.75 K)): the headroom to K absorbs smaller rises. On the
tuning traces a reserve for every rise bought 0.02-0.2 s of worst chunk for 5-15% of cost,
and turboserve on a fixed pool sized to its worst chunk cost the same or less; counting
only rises past 0.75, turboserve costs 0.6-4.6% less than the oracle (whose foresight still
holds the coming peak; its worst chunk is 0.04-0.2 s lower) and the fixed pool at its worst
chunk costs 2-11% more on four of five (0.1% less on ``diurnal``).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from operator import itemgetter

from processors.latency import LatencyModel
from processors.scaling_config import AutoscalerConfig, AutoscalerState, Recent

__all__ = ["record_active", "burst_reserve", "held_demand", "absorbed_share"]

_FIRST = itemgetter(0)
_LOW = itemgetter(1)


def record_active(recent: Recent, now: float, active: int, config: AutoscalerConfig) -> Recent:
    """``recent`` with ``active`` seen at ``now``: per bucket of ``burst_bucket_s``, the
    fewest and most executing sessions and the rise to that most from the fewest within
    one boot time before; buckets older than ``burst_memory_s`` + ``boot_s`` (+ ``settle_s``)
    are dropped.

    Without an SLO, a rise counts only above the level held in the ``settle_s`` seconds
    before that boot time (the highest of those buckets' fewest): sessions coming back to a
    level the pool held moments ago are no burst to hold a reserve for; :func:`scale` keeps
    that level through a scale-in instead. Counted in full, ``mass-idle`` s1's return from a
    dip (146-169 sessions) stayed in the reserve on top of the load that had come back, 17
    GPUs at its peak where Kubernetes' HPA held 14 (docs/scheduling.md, "Tried and not kept:
    against the HPA", for the windows and levels measured). The SLO mode reads every rise in
    full: read this way it missed its SLO on two traces of 59 it meets otherwise. With no
    bucket in the ``settle_s`` seconds before the boot time, the boot time's first bucket
    stands for the level held: a controller that starts on a running load (a trace cut
    mid-stream, a state lost) did not see that load rise, and read from nothing a calm
    trace's noise in its first minute held a reserve of 18 sessions, fading over the next 15
    minutes.

    The fewest counts the bucket's own readings whichever came first, so a fall within one
    bucket counts as a rise of its size: sessions that go idle together can come back
    together, within a boot time. Read strictly (a fall is no rise), five traces of 59 cost
    0.3-7.1% less, four of them with a higher worst chunk (``mass-idle`` s1 1.58 -> 1.76 s),
    one cost 0.6% more (docs/scheduling.md, "Tried and not kept: against the HPA")."""
    bucket = config.burst_bucket_s
    b = math.floor(now / bucket)
    lo = hi = active
    if recent and recent[-1][0] == b:
        lo, hi = min(lo, recent[-1][1]), max(hi, recent[-1][2])
        recent = recent[:-1]
    span = b - math.ceil(config.boot_s / bucket - 1e-9)
    at_span = bisect_left(recent, span, key=_FIRST)
    low = min(min(map(_LOW, recent[at_span:]), default=lo), lo)
    rise = hi - low
    settle = config.settle_s if config.slo is None else 0.0
    if settle > 0:
        # with nothing seen before this boot time, its first reading was the level held
        before = (recent[bisect_left(recent, b - math.floor(settle / bucket + 1e-9), key=_FIRST):at_span]
                  or recent[at_span:at_span + 1])
        if before:
            rise = max(0, min(rise, hi - max(map(_LOW, before))))
    first = b - math.ceil((config.burst_memory_s + config.boot_s + settle) / bucket - 1e-9)
    return recent[bisect_left(recent, first, key=_FIRST):] + ((b, lo, hi, rise),)


def burst_reserve(recent: Recent, config: AutoscalerConfig | None = None) -> int:
    """The largest rise of executing sessions within one boot time that ``recent`` holds
    (with ``config.burst_decay``, each weighted down linearly with its age)."""
    if config is None or not config.burst_decay or not recent:
        return max((r[3] for r in recent), default=0)
    span = config.burst_memory_s / config.burst_bucket_s
    last = recent[-1][0]
    best = 0.0
    for at, _, _, rise in recent:  # a plain loop: this runs at every decision
        if rise > best:
            w = rise * max(0.0, 1.0 - (last - at) / span)
            if w > best:
                best = w
    return math.ceil(best - 1e-9)


def held_demand(state: AutoscalerState, now: float, config: AutoscalerConfig, reserve: int) -> int:
    """The demand a scale-in keeps: the peak since the load fell, and no less than the last
    ``settle_s`` seconds' most executing sessions plus the reserve (the level a rise back to
    it does not count above, :func:`record_active`)."""
    if config.settle_s <= 0 or not state.recent:
        return state.low_peak
    since = math.floor((now - config.settle_s) / config.burst_bucket_s)
    most = max((r[2] for r in state.recent[bisect_left(state.recent, since, key=_FIRST):]), default=0)
    return max(state.low_peak, most + reserve)


def absorbed_share(model: LatencyModel, config: AutoscalerConfig, state: AutoscalerState) -> float | None:
    """The share of K up to which a rise needs no burst reserve: ``burst_utilization``,
    and with an SLO no more than the most sessions per GPU whose first chunk (the running
    chunk, then its own) still meets the chunk deadline: past it each session that starts
    executing may miss (about 0.3 K under the paper profile at a 1 s chunk)."""
    u = config.burst_utilization
    if u is None or config.slo is None or state.deadline_s <= 0:
        return u
    p = model[config.gpu_type]
    return min(u, math.floor(p.first_chunk_load(state.deadline_s, 2 * p.capacity)) / p.capacity)
