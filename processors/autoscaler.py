"""Autoscaler with hysteresis, tuned by workload volatility.

u_max = max_j n_j / K_j (unplaced demand counts too) is compared with a target u* and a
tolerance delta looked up by volatility level. Above u* + delta the pool grows until its
capacity reaches A / u* (A = executing sessions; ceil(A / (u* K)) GPUs for one type); below
u* - delta it shrinks to the same bound by draining the least-loaded GPUs, but only once
u_max has stayed below the band for ``scale_in_delay_s`` (default: one boot time, the
break-even of shutting a GPU down and booting it again); scale-in then sizes for the peak
demand seen while waiting, and when that peak drains nothing but the load now would, the
wait starts again from now (a peak older than one wait no longer holds the pool). A full
GPU on a pool below the band as a whole (u_max 1.0, A over the slots under u* - delta)
counts as below the band too: sessions that never idle can fill a few GPUs in a burst and
stay there (a move rarely pays its transfer), more GPUs cannot cool them, and the band
held such a pool at its peak size for good. Actions are spaced by a minimum dwell time. Scale-out boots first (booting GPUs are not usable, the
placement controller migrates onto them once ready); scale-in drains first and shuts a
GPU down only once it holds no session.

Demand also counts a burst reserve: the largest rise of executing sessions within one
boot time seen over the last ``burst_memory_s`` (0 turns it off), each rise weighted down
linearly with its age; a fall within one bucket counts as a rise of its size (sessions that
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

With an SLO configured (``AutoscalerConfig.slo``: a deadline-miss rate and a worst chunk)
the autoscaler follows measured chunk latency instead of the band: u* is the table's times
a headroom factor that the chunks measured since the last decision move against the SLO's
error budget (:func:`slo_feedback`), the pool holds A / u* plus the burst reserve at full
capacity (the reserve only bridges a boot), grows as soon as it is short and shrinks once
it has held a spare GPU for the scale-in delay. The reserve then counts the part of a rise
past the most sessions per GPU whose first chunk still meets the chunk deadline (the
deadline comes with the measured chunks), not past ``burst_utilization``: at u* near 0.3-0.4
K, a rise the pool absorbs up to 0.75 K is a rise whose first chunks miss. Measured on 28
traces in no split: 9.8% dearer than the fixed pool meeting the SLO on average instead of
12.8%, and none missing the SLO (3 did); checked on the four splits (SLO met on all 24).

Without an SLO, u* follows the worst chunk measured over the burst memory
(``follow_worst``): the matched comparisons and users of this mode judge a run by its
worst chunk, and once one has been measured a GPU may run the load whose first chunk (a
running chunk, then its own: l(n - 1) + l(n)) ends within it at no cost to that figure, so
u* rises to that n / K less delta, up to ``follow_worst`` (0.75, the burst utilization).
Measured on the tuning traces (one run each): the same worst chunks, cost 3.1-4.2% lower on
three of five (the other two unchanged), the deadline-miss rate up by up to 18% of itself.
The live control processor turns it off: its ``worst_s`` is a chunk's compute time (l(n)),
not the wait a first chunk sees.

All of it is state as data (:class:`AutoscalerState`), so a new leader resumes it.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, replace
from operator import itemgetter
from typing import Any

from processors.decisions import Command, Vacate, Boot, Retire
from processors.latency import LatencyModel
from processors.lifecycle import SessionState
from processors.snapshot import GpuState, Snapshot
from processors.volatility import DEFAULT_VOLATILITY_TABLE, VolatilityTable
from schemas.errors import ConfigError

__all__ = [
    "Slo",
    "AutoscalerConfig",
    "AutoscalerState",
    "utilization",
    "execution_counts",
    "autoscale",
    "shutdowns",
    "resize",
    "record_active",
    "burst_reserve",
    "slo_feedback",
    "band",
]

Recent = tuple[tuple[int, int, int, int], ...]
_EXEC = SessionState.EXECUTION
_FIRST = itemgetter(0)


@dataclass(frozen=True, slots=True)
class Slo:
    """A service level users state: at most ``miss_rate`` of chunks past their deadline and
    no chunk slower than ``worst_s`` seconds."""

    miss_rate: float = 0.001
    worst_s: float = 3.0

    def __post_init__(self) -> None:
        if not (0 <= self.miss_rate < 1 and self.worst_s > 0):
            raise ConfigError("slo", "need 0 <= miss_rate < 1 and worst_s > 0", "slo")

    def met(self, miss_rate: float, worst_s: float) -> bool:
        """Whether a run with this miss rate and worst chunk latency meets the SLO."""
        return miss_rate <= self.miss_rate + 1e-12 and worst_s <= self.worst_s + 1e-9


@dataclass(frozen=True, slots=True)
class AutoscalerConfig:
    """Pool bounds, the GPU type to add, dwell between actions, boot time and scale-in delay (s),
    and how long the burst reserve remembers a rise (0: no reserve).

    ``scale_in_delay_s`` None means ``boot_s``.
    """

    gpu_type: str = "b300"
    # two, not one: a pool of one has nowhere to put its sessions while its GPU fails and
    # another boots, and no room for a crowd the burst reserve has not yet seen (N + 1)
    min_gpus: int = 2
    max_gpus: int = 1024
    dwell_s: float = 30.0
    boot_s: float = 60.0
    scale_in_delay_s: float | None = None
    burst_memory_s: float = 900.0  # 0: no burst reserve
    burst_bucket_s: float = 5.0
    reserve_at_capacity: bool = True  # the reserve takes full GPUs' slots, not slots at u*
    burst_decay: bool = True  # a rise counts less as it ages (linearly, to 0 at burst_memory_s)
    burst_utilization: float | None = 0.75  # a rise filling GPUs up to this needs no reserve (None: any rise does)
    slo: Slo | None = None  # SLO feedback on measured chunks (None: off)
    slo_step_s: float = 60.0
    headroom_start: float = 0.6
    headroom_down: float = 0.9
    headroom_up: float = 1.03
    headroom_min: float = 0.3
    headroom_max: float = 1.6
    # without an SLO: u* may rise to the load per GPU the worst chunk of the last burst
    # memory already allows (less delta), up to this (None: off)
    follow_worst: float | None = 0.75
    # without an SLO: a rise counts only above the level the load held (each bucket's fewest
    # executing sessions, the highest of them) in the settle_s seconds before the boot time it
    # rose within, and a scale-in keeps the last settle_s seconds' peak plus the reserve
    # (0: every rise counts in full and a scale-in keeps the peak since the load fell)
    settle_s: float = 120.0

    def __post_init__(self) -> None:
        if (not (0 <= self.min_gpus <= self.max_gpus) or self.dwell_s < 0 or self.boot_s < 0 or self.scale_in_delay < 0
                or self.burst_memory_s < 0 or self.burst_bucket_s <= 0 or self.settle_s < 0
                or (self.burst_utilization is not None and not 0 < self.burst_utilization <= 1)
                or (self.follow_worst is not None and not 0 < self.follow_worst <= 1)):
            raise ConfigError("autoscaler", "need 0 <= min_gpus <= max_gpus, dwell_s, boot_s, scale_in_delay_s, burst_memory_s, settle_s >= 0, "
                              "burst_bucket_s > 0, 0 < burst_utilization <= 1, 0 < follow_worst <= 1", "autoscaler")

    @property
    def scale_in_delay(self) -> float:
        """Seconds u_max must stay below the band before a scale-in."""
        return self.boot_s if self.scale_in_delay_s is None else self.scale_in_delay_s


@dataclass(frozen=True, slots=True)
class AutoscalerState:
    """When the last scale action was taken, since when u_max is below the band, and the
    peak executing sessions seen since then (None: never / not below)."""

    last_action_at: float | None = None
    low_since: float | None = None
    low_peak: int = 0
    # per bucket, oldest first: (index, fewest, most executing sessions, rise into it)
    recent: tuple[tuple[int, int, int, int], ...] = ()
    # SLO feedback: u* is multiplied by ``headroom``; chunks and misses so far, then in the
    # current step, chunks over the worst bound in it, and the step's index
    headroom: float | None = None  # None: the config's headroom_start
    measured: tuple[int, int, int, int, int, int] | None = None
    # without an SLO: per minute of the last burst memory, the worst chunk measured in it
    worst_seen: tuple[tuple[int, float], ...] = ()
    deadline_s: float = 0.0  # the chunk deadline measured chunks were last judged against (read with an SLO)


def execution_counts(snapshot: Snapshot) -> tuple[int, dict[str, int]]:
    """(A, executing sessions per GPU id): ``active_count()`` and ``loads()`` in one
    counting pass (the sessions loop is the hot path of a large pool)."""
    count = Counter([s.gpu_id for s in snapshot.sessions if s.lifecycle is _EXEC])  # a list comprehension: the fastest here
    return sum(count.values()), {g.id: count[g.id] for g in snapshot.gpus}


def utilization(snapshot: Snapshot, model: LatencyModel, reserve: int = 0, active: int | None = None,
                loads: dict[str, int] | None = None) -> tuple[float, int]:
    """(u_max, A): worst n_j / K_j over ready GPUs, raised to the unplaced demand's share
    (A plus ``reserve`` sessions over the ready capacity); ``active`` and ``loads`` are A
    and the per-GPU executing counts when known."""
    if loads is None:
        a, loads = execution_counts(snapshot)
        active = a if active is None else active
    elif active is None:
        active = snapshot.active_count()
    ready = [g for g in snapshot.gpus if g.state is GpuState.READY]
    cap = sum(model[g.type].capacity for g in ready)
    u = max((loads[g.id] / model[g.type].capacity for g in ready), default=0.0)
    if active + reserve:
        u = max(u, (active + reserve) / cap if cap else math.inf)
    return u, active


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
    full: read this way it missed its SLO on two traces of 59 it meets otherwise.

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
        before = recent[bisect_left(recent, b - math.floor(settle / bucket + 1e-9), key=_FIRST):at_span]
        if before:
            rise = max(0, min(rise, hi - max(map(_LOW, before))))
    first = b - math.ceil((config.burst_memory_s + config.boot_s + settle) / bucket - 1e-9)
    return recent[bisect_left(recent, first, key=_FIRST):] + ((b, lo, hi, rise),)


_LOW = itemgetter(1)


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


def slo_feedback(state: AutoscalerState, snapshot: Snapshot, config: AutoscalerConfig) -> AutoscalerState:
    """Fold the chunks measured since the last decision; when a step of ``slo_step_s``
    closes, adjust the headroom on u* against the SLO's error budget: down
    (``headroom_down``) when the step had a chunk over the worst bound or missed deadlines
    more often than the SLO allows (twice as often while the run so far is within its
    budget); up (``headroom_up``) when the step stayed under 70% of the rate and the run
    within its budget."""
    slo, c = config.slo, snapshot.chunks
    if slo is None:
        return state
    step = math.floor(snapshot.now / config.slo_step_s)
    total, missed, s_total, s_missed, over, at = state.measured or (0, 0, 0, 0, 0, step)
    headroom = config.headroom_start if state.headroom is None else state.headroom
    if step > at:  # the step closed: judge it (on the step, so early misses do not wind it up)
        spent = missed > slo.miss_rate * total  # the run so far is over its budget
        if over or s_missed > slo.miss_rate * s_total * (1.0 if spent else 2.0):
            headroom *= config.headroom_down
        elif not spent and s_missed < 0.7 * slo.miss_rate * s_total:
            headroom *= config.headroom_up
        headroom = min(config.headroom_max, max(config.headroom_min, headroom))
        s_total = s_missed = over = 0
    measured = (total + c.count, missed + c.missed, s_total + c.count, s_missed + c.missed, over + int(c.worst_s > slo.worst_s), step)
    return replace(state, headroom=headroom, measured=measured)


def shutdowns(snapshot: Snapshot) -> tuple[Retire, ...]:
    """Retire for each draining GPU no session (in any lifecycle state) still names;
    never for an external one (chunkserve cannot stop it)."""
    if not any(g.state is GpuState.DRAINING for g in snapshot.gpus):
        return ()
    held = {s.gpu_id for s in snapshot.sessions if s.gpu_id is not None and s.lifecycle is not SessionState.TERMINATED}
    return tuple(Retire(g.id) for g in sorted(snapshot.gpus, key=lambda g: g.id)
                 if g.state is GpuState.DRAINING and not g.external and g.id not in held)


def autoscale(snapshot: Snapshot, level: int, model: LatencyModel, config: AutoscalerConfig = AutoscalerConfig(),
              table: VolatilityTable = DEFAULT_VOLATILITY_TABLE, state: AutoscalerState = AutoscalerState(),
              foresight: int | None = None) -> tuple[tuple[Command, ...], AutoscalerState]:
    """:func:`scale`, then up to ``min_gpus``: a pool below its floor (none booted yet, or
    GPUs lost) boots the rest at once, with or without sessions, dwell or not."""
    cmds, state = scale(snapshot, level, model, config, table, state, foresight)
    after = (sum(1 for g in snapshot.gpus if g.state is not GpuState.DRAINING)
             + sum(c.count for c in cmds if isinstance(c, Boot)) - sum(1 for c in cmds if isinstance(c, Vacate)))
    short = min(config.min_gpus, config.max_gpus) - after
    return (cmds + (Boot(short, config.gpu_type),) if short > 0 else cmds), state


def scale(
    snapshot: Snapshot,
    level: int,
    model: LatencyModel,
    config: AutoscalerConfig = AutoscalerConfig(),
    table: VolatilityTable = DEFAULT_VOLATILITY_TABLE,
    state: AutoscalerState = AutoscalerState(),
    foresight: int | None = None,
) -> tuple[tuple[Command, ...], AutoscalerState]:
    """One autoscaling decision: Boot, or Vacate of the GPUs to empty, or nothing.

    ``foresight`` (an oracle's): the peak executing sessions of the coming boot time,
    known in advance; it replaces the burst reserve.

    Retire commands are not issued here (see :func:`shutdowns`): they depend on the
    migrations the placement controller issues for the drained GPUs.
    """
    now = snapshot.now
    u_target, delta, state = _band(snapshot, level, model, config, table, state)
    reserve = 0
    executing, loads = execution_counts(snapshot)
    if foresight is not None:  # an oracle: the peak of the next boot time is known
        reserve = max(0, foresight - executing)
    elif config.burst_memory_s > 0:
        recent = record_active(state.recent, now, executing, config)
        reserve = burst_reserve(recent, config)
        state = replace(state, recent=recent, deadline_s=snapshot.chunks.deadline_s or state.deadline_s)
        absorbs = _absorbs(model, config, state)
        if absorbs is not None:  # the pool at A / u* absorbs a rise up to this
            reserve = max(0, reserve - max(0, math.floor((absorbs - u_target) / u_target * executing)))
    if config.slo is not None:
        return _slo_scale(snapshot, model, config, state, u_target, reserve, executing)
    u_max, active = utilization(snapshot, model, reserve, executing, loads)
    demand = active + reserve
    low = u_max < u_target - delta or (u_max >= 1.0 and _imbalanced(snapshot, model, demand, u_target - delta))
    if low:
        since = state.low_since if state.low_since is not None else now
        peak = max(demand, state.low_peak) if state.low_since is not None else demand
        state = replace(state, low_since=since, low_peak=peak)
    elif state.low_since is not None:
        state = replace(state, low_since=None, low_peak=0)
    # a growth waits the dwell or a boot time, whichever is shorter: once the last boot has
    # landed its effect is in the snapshot, and a short boot must not idle behind a long dwell
    dwell = min(config.dwell_s, config.boot_s) if u_max > u_target + delta else config.dwell_s
    if state.last_action_at is not None and now - state.last_action_at < dwell:
        return (), state
    extra = reserve - reserve * u_target if config.reserve_at_capacity else 0.0  # in demand units at u*
    cmds: tuple[Command, ...] = ()
    if u_max > u_target + delta:
        cmds = resize(snapshot, model, (demand - extra) / u_target, config, grow=True)  # session slots to have
    if not cmds and low and now - state.low_since >= config.scale_in_delay:  # type: ignore[operator]
        cmds = resize(snapshot, model, (_held(state, now, config, reserve) - extra) / u_target, config, grow=False)
        if not cmds:
            state = _wait_again(snapshot, model, config, state, (demand - extra) / u_target, demand)
    return (cmds, replace(state, last_action_at=now, low_since=None, low_peak=0)) if cmds else ((), state)


def _held(state: AutoscalerState, now: float, config: AutoscalerConfig, reserve: int) -> int:
    """The demand a scale-in keeps: the peak since the load fell, and no less than the last
    ``settle_s`` seconds' most executing sessions plus the reserve (the level a rise back to
    it does not count above, :func:`record_active`)."""
    if config.settle_s <= 0 or not state.recent:
        return state.low_peak
    since = math.floor((now - config.settle_s) / config.burst_bucket_s)
    most = max((r[2] for r in state.recent[bisect_left(state.recent, since, key=_FIRST):]), default=0)
    return max(state.low_peak, most + reserve)


def _absorbs(model: LatencyModel, config: AutoscalerConfig, state: AutoscalerState) -> float | None:
    """The share of K up to which a rise needs no burst reserve: ``burst_utilization``,
    and with an SLO no more than the most sessions per GPU whose first chunk (the running
    chunk, then its own) still meets the chunk deadline: past it each session that starts
    executing may miss (about 0.3 K under the paper profile at a 1 s chunk)."""
    u = config.burst_utilization
    if u is None or config.slo is None or state.deadline_s <= 0:
        return u
    p = model[config.gpu_type]
    return min(u, math.floor(p.first_chunk_load(state.deadline_s, 2 * p.capacity)) / p.capacity)


def _band(snapshot: Snapshot, level: int, model: LatencyModel, config: AutoscalerConfig, table: VolatilityTable,
          state: AutoscalerState) -> tuple[float, float, AutoscalerState]:
    """(u*, delta) for this decision (:func:`band`), and the state with what was measured
    folded in."""
    if config.slo is not None:
        state = slo_feedback(state, snapshot, config)
    elif config.follow_worst is not None:
        state = replace(state, worst_seen=_fold_worst(state.worst_seen, snapshot.now, snapshot.chunks.worst_s, config))
    return (*band(level, model, config, table, state), state)


def band(level: int, model: LatencyModel, config: AutoscalerConfig, table: VolatilityTable,
         state: AutoscalerState) -> tuple[float, float]:
    """(u*, delta) a decision that left ``state`` held the pool to: the table's at ``level``,
    moved by the SLO feedback when an SLO is set, else raised to the load the worst chunk
    measured lately allows (``follow_worst``)."""
    u_target, delta = table.lookup(level)
    if config.slo is not None:
        h = state.headroom if state.headroom is not None else config.headroom_start
        return min(0.98, u_target * h), delta * min(1.0, h)
    if config.follow_worst is not None and state.worst_seen:
        p = model[config.gpu_type]
        load = math.floor(p.first_chunk_load(max(w for _, w in state.worst_seen), 2 * p.capacity)) / p.capacity
        u_target = max(u_target, min(config.follow_worst, load - delta))
    return u_target, delta


def _fold_worst(seen: tuple[tuple[int, float], ...], now: float, worst: float, config: AutoscalerConfig) -> tuple[tuple[int, float], ...]:
    """``seen`` (per minute, the worst chunk measured in it) with ``worst`` measured at
    ``now``; minutes older than ``burst_memory_s`` are dropped."""
    m = math.floor(now / 60.0)
    keep = tuple(x for x in seen if x[0] > m - config.burst_memory_s / 60.0)
    if keep and keep[-1][0] == m:
        return keep[:-1] + ((m, max(keep[-1][1], worst)),)
    return keep + ((m, worst),)


def _wait_again(snapshot: Snapshot, model: LatencyModel, config: AutoscalerConfig, state: AutoscalerState,
                need: float, demand: int) -> AutoscalerState:
    """After a wait whose peak drains nothing: a new wait from now at ``demand`` when the
    load now (``need`` slots) would drain a GPU, else the same one. Otherwise a pool that
    stays below the band keeps the size of the peak it first went below at, however far the
    load falls after (the demo's fall from 12 executing sessions to 4 held 3 of 4 workers)."""
    if resize(snapshot, model, need, config, grow=False):
        return replace(state, low_since=snapshot.now, low_peak=demand)
    return state


def _imbalanced(snapshot: Snapshot, model: LatencyModel, demand: int, low_u: float) -> bool:
    """Whether the pool is hot only where sessions sit: some GPU is past the band while the
    pool as a whole is below it (``demand`` over its non-draining slots). More GPUs cannot
    cool a GPU whose sessions stay (a move rarely pays its transfer), so that does not hold
    off scale-in; new sessions go to the least-loaded GPUs either way."""
    slots = sum(model[g.type].capacity for g in snapshot.gpus if g.state is not GpuState.DRAINING)
    return slots > 0 and demand / slots < low_u


def _slo_scale(snapshot: Snapshot, model: LatencyModel, config: AutoscalerConfig, state: AutoscalerState, u: float,
               reserve: int, active: int) -> tuple[tuple[Command, ...], AutoscalerState]:
    """SLO mode: hold A / u (u from the SLO feedback) plus the burst reserve at full
    capacity: the reserve only has to absorb a burst until the boot that follows it. Grow
    as soon as the pool is short; shrink once it has had a GPU more than it needs for a
    scale-in delay, to the most it needed meanwhile."""
    now = snapshot.now
    need = active / u + reserve  # session slots
    have = sum(model[g.type].capacity for g in snapshot.gpus if g.state is not GpuState.DRAINING)
    slots = math.ceil(need - 1e-9)
    if have - model[config.gpu_type].capacity >= need:
        since = state.low_since if state.low_since is not None else now
        state = replace(state, low_since=since, low_peak=max(slots, state.low_peak) if state.low_since is not None else slots)
    elif state.low_since is not None:
        state = replace(state, low_since=None, low_peak=0)
    if need > have:
        cmds = resize(snapshot, model, need, config, grow=True)
    elif state.low_since is not None and now - state.low_since >= config.scale_in_delay and (
            state.last_action_at is None or now - state.last_action_at >= config.dwell_s):
        cmds = resize(snapshot, model, state.low_peak, config, grow=False)
        if not cmds:
            state = _wait_again(snapshot, model, config, state, need, slots)
    else:
        cmds = ()
    if not cmds:
        return (), state
    return cmds, replace(state, last_action_at=now, low_since=None, low_peak=0)


def resize(snapshot: Snapshot, model: LatencyModel, need: float, config: AutoscalerConfig, *, grow: bool) -> tuple[Command, ...]:
    """Grow the non-draining pool to ``need`` session slots, or shrink it towards them.

    Growing counts booting GPUs as capacity (no double boot). Shrinking waits while any GPU
    boots, drains the least-loaded GPUs first (then the dearest per slot, then by id) and
    never drops below ``need`` slots, the executing sessions, or ``min_gpus``. External GPUs
    count as capacity but are never drained: shutting them down is not chunkserve's to do.
    """
    pool = [g for g in snapshot.gpus if g.state is not GpuState.DRAINING]
    have = sum(model[g.type].capacity for g in pool)
    if grow:
        if have >= need:
            return ()
        k = model[config.gpu_type].capacity
        count = min(math.ceil((need - have) / k - 1e-9), config.max_gpus - len(pool))
        return (Boot(count, config.gpu_type),) if count > 0 else ()
    if any(g.state is GpuState.BOOTING for g in pool):
        return ()
    active, loads = execution_counts(snapshot)

    def order(g: Any) -> tuple[int, float, str]:
        p = model[g.type]
        return (loads[g.id], -p.cost_per_hour / p.capacity, g.id)

    drains: list[Command] = []
    left = len(pool)
    for g in sorted(pool, key=order):
        k = model[g.type].capacity
        if g.external or left <= config.min_gpus or have - k < need or have - k < active:
            continue
        drains.append(Vacate(g.id))
        have -= k
        left -= 1
    return tuple(drains)
