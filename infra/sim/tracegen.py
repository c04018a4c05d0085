"""Synthetic traces shaped like the TurboServe workload (seeded, reproducible).

Knobs (see :class:`GenConfig`): a daily-like sinusoidal swing of the arrival rate; bursts
of arrivals and of synchronized idle->active flips whose share and size grow with the
volatility level (1 calm .. 10 bursty); heavy-tailed (log-normal) session lifetimes from
a few seconds to tens of minutes; active spells and heavy-tailed (Pareto) idle gaps;
log-normal per-session state size. :func:`fall` turns a generated trace into one whose load
rises and then falls (the demo's shape).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from processors.lifecycle import EventKind, SessionEvent, SessionState, moves
from schemas.errors import ConfigError

from infra.sim.trace import MB

__all__ = ["GenConfig", "generate", "fall"]


@dataclass(frozen=True, slots=True)
class GenConfig:
    """Generator knobs; ``sessions`` is the expected number of sessions over ``duration_s``."""

    level: int = 5
    duration_s: float = 3600.0
    sessions: int = 5000
    seed: int = 0
    swing: float = 0.5  # relative amplitude of the daily-like swing of the arrival rate
    period_s: float = 0.0  # swing period; 0 means the whole trace is one period
    life_median_s: float = 120.0  # session lifetime: log-normal median ...
    life_sigma: float = 1.3  # ... and log-sigma, clipped to [2 s, 40 min]
    active_mean_s: float = 45.0  # mean active spell (exponential)
    idle_scale_s: float = 8.0  # idle gap: Pareto scale ...
    idle_shape: float = 1.5  # ... and shape (heavier tail when smaller)
    state_median_mb: float = 2000.0  # per-session state: log-normal median, sigma 0.6

    def __post_init__(self) -> None:
        if not 1 <= self.level <= 10:
            raise ConfigError("level", "must be 1..10", "trace gen")
        if self.duration_s <= 0 or self.sessions < 1:
            raise ConfigError("duration", "need duration > 0 and sessions >= 1", "trace gen")
        if not 0 <= self.swing < 1:
            raise ConfigError("swing", "must be in [0, 1)", "trace gen")


def _arrivals(cfg: GenConfig, rng: np.random.Generator) -> np.ndarray:
    """Arrival times: thinned Poisson with the swing, plus bursts (share grows with level)."""
    burst_share = 0.08 * (cfg.level - 1)  # 0 at level 1, 0.72 at level 10
    n_total = cfg.sessions
    n_poisson = rng.poisson(n_total * (1 - burst_share))
    period = cfg.period_s or cfg.duration_s
    lam_max = n_poisson / cfg.duration_s * (1 + cfg.swing)
    lo = -_WARM_S  # start in steady state: sessions alive at 0 open at 0
    span = cfg.duration_s - lo
    cand = np.sort(rng.uniform(lo, cfg.duration_s, rng.poisson(lam_max * span)))
    rate = 1 + cfg.swing * np.sin(2 * math.pi * cand / period - math.pi / 2)
    keep = rng.uniform(0, 1 + cfg.swing, cand.size) < rate
    times = [cand[keep]]
    n_burst = n_total * burst_share
    if n_burst > 0:
        size = 3 + 4 * cfg.level  # mean arrivals per burst
        for c in rng.uniform(lo, cfg.duration_s, rng.poisson(n_burst / size * span / cfg.duration_s)):
            k = rng.poisson(size)
            times.append(c + rng.exponential(2.0, k))
    t = np.concatenate(times)
    return np.sort(t[t < cfg.duration_s])


_WARM_S = 900.0


def generate(cfg: GenConfig) -> list[SessionEvent]:
    """Events of one synthetic trace, sorted by time (ids ``s000001``...)."""
    rng = np.random.default_rng(cfg.seed)
    arrivals = _arrivals(cfg, rng)
    n = arrivals.size
    lives = np.clip(rng.lognormal(math.log(cfg.life_median_s), cfg.life_sigma, n), 2.0, 2400.0)
    sizes = np.clip(rng.lognormal(math.log(cfg.state_median_mb), 0.6, n), 50.0, 20000.0)
    # synchronized re-activation: bursty levels wake idle sessions at shared instants
    sync_share = 0.07 * (cfg.level - 1)
    wake_grid = 20.0
    events: list[tuple[float, int, str, EventKind, int]] = []
    for i in range(n):
        sid = f"s{i + 1:06d}"
        t0 = float(arrivals[i])
        end = min(t0 + float(lives[i]), cfg.duration_s)
        if end <= 0:
            continue
        t0 = max(t0, 0.0)
        events.append((t0, 0, sid, EventKind.OPEN, int(sizes[i] * MB)))
        t = t0 + rng.exponential(cfg.active_mean_s)
        while t < end:
            events.append((t, 1, sid, EventKind.IDLE, 0))
            gap = cfg.idle_scale_s * (1 + rng.pareto(cfg.idle_shape))
            wake = t + gap
            if rng.uniform() < sync_share:
                wake = math.ceil(wake / wake_grid) * wake_grid
            if wake >= end:
                break
            events.append((wake, 1, sid, EventKind.ACTIVE, 0))
            t = wake + rng.exponential(cfg.active_mean_s)
        events.append((end, 2, sid, EventKind.CLOSE, 0))
    events.sort(key=lambda e: (round(e[0], 3), e[1], e[2]))
    return [SessionEvent(round(t, 3), sid, kind, size) for t, _, sid, kind, size in events]


def fall(events: Sequence[SessionEvent], at_s: float, keep: int, end_s: float,
         over_s: float = 20.0) -> list[SessionEvent]:
    """``events`` before ``at_s``, then the load falls: every session still open closes
    within ``over_s`` (evenly spaced) but ``keep`` executing ones, which run on without a
    pause and close at ``end_s``; nothing opens after ``at_s``. The ones kept are picked
    evenly over the order they opened in (sessions that opened apart sit on different GPUs);
    idle ones are woken at ``at_s`` when too few execute."""
    before = [e for e in events if e.t < at_s]
    state = {e.session_id: now for e, _, now in moves(before)}  # in the order the sessions opened
    running = [s for s, st in state.items() if st is SessionState.EXECUTION]
    idle = [s for s, st in state.items() if st is SessionState.SUSPENDED]
    kept = _spread(running, keep)
    woken = _spread(idle, keep - len(kept))
    staying = set(kept + woken)
    gone = [s for s, st in state.items() if st is not SessionState.TERMINATED and s not in staying]
    over = max(0.0, min(over_s, end_s - at_s))
    after = ([SessionEvent(at_s, s, EventKind.ACTIVE) for s in woken]
             + [SessionEvent(at_s + over * i / len(gone), s, EventKind.CLOSE) for i, s in enumerate(gone)]
             + [SessionEvent(max(at_s, end_s), s, EventKind.CLOSE) for s in kept + woken])
    return before + sorted(after, key=lambda e: e.t)


def _spread(ids: list[str], k: int) -> list[str]:
    """``k`` of ``ids`` evenly apart, the first and the last among them (all when k >= len)."""
    if k >= len(ids):
        return list(ids)
    if k <= 1:
        return ids[:max(0, k)]
    return [ids[round(i * (len(ids) - 1) / (k - 1))] for i in range(k)]
