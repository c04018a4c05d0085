"""Trace families from a second workload model, for judging policies on traces they were
not tuned on (``infra.sim.tracegen`` is the project's own model).

The model: a non-homogeneous Poisson arrival rate shaped per family; session lifetimes
log-normal (Pareto in ``longtail``); a semi-Markov active/idle alternation with Weibull
active spells (shape 0.8: many short, some long) and log-normal idle gaps; log-normal
state sizes. Families add what a reactive autoscaler finds hard:

- ``calm``: a steady rate, nothing correlated.
- ``flash``: flash crowds, each 30% of the mean concurrent sessions arriving within
  ``flash_rise_s`` (10 s, far faster than a 60 s boot).
- ``mass-idle``: at a few instants half the active sessions go idle within 2 s and come
  back together 1-3 minutes later (a shared pause).
- ``longtail``: Pareto lifetimes (shape 1.1) and idle gaps: most sessions short, a few
  lasting the whole trace.
- ``diurnal``: two compressed days, the rate swinging between 5% and 100% of its peak.
- ``scale4x``: ``calm`` with a mild swing at four times the sessions.

Sessions alive at time 0 open at 0 (the trace starts mid-stream), and those idle then go
idle at 0: the trace starts in the warmed-up mix of active and idle sessions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from processors.lifecycle import EventKind, SessionEvent
from schemas.errors import ConfigError

from infra.sim.trace import MB

__all__ = ["FAMILIES", "FamilyConfig", "generate_family"]

FAMILIES = ("calm", "flash", "mass-idle", "longtail", "diurnal", "scale4x")
_WARM_S = 1200.0


@dataclass(frozen=True, slots=True)
class FamilyConfig:
    """One family trace: ``sessions`` expected over ``duration_s`` (times 4 for ``scale4x``)."""

    family: str = "calm"
    duration_s: float = 1800.0
    sessions: int = 2500
    seed: int = 0
    flash_rise_s: float = 10.0
    events: int = 4  # flash crowds / mass-idle instants per trace

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ConfigError("family", f"one of {', '.join(FAMILIES)}", "trace gen")
        if self.duration_s <= 0 or self.sessions < 1 or self.flash_rise_s <= 0 or self.events < 0:
            raise ConfigError("family", "need duration > 0, sessions >= 1, flash_rise_s > 0, events >= 0", "trace gen")


_LIFE_MEDIAN_S = 240.0
_ACTIVE_MEAN_S = 60.0
_IDLE_MEDIAN_S = 20.0


def _rate_shape(cfg: FamilyConfig, t: np.ndarray) -> np.ndarray:
    if cfg.family == "diurnal":
        return 0.525 + 0.475 * np.sin(2 * math.pi * t / (cfg.duration_s / 2) - math.pi / 2)
    if cfg.family == "scale4x":
        return 1 + 0.3 * np.sin(2 * math.pi * t / cfg.duration_s - math.pi / 2)
    return np.ones_like(t)


def _arrivals(cfg: FamilyConfig, rng: np.random.Generator, n: int) -> np.ndarray:
    lo = -_WARM_S
    grid = _rate_shape(cfg, np.linspace(0.0, cfg.duration_s, 721))
    peak = float(grid.max())
    cand = np.sort(rng.uniform(lo, cfg.duration_s, rng.poisson(n * peak / float(grid.mean()) * (cfg.duration_s - lo) / cfg.duration_s)))
    keep = rng.uniform(0, peak, cand.size) < _rate_shape(cfg, cand)  # thinning: n expected over the trace
    times = [cand[keep]]
    if cfg.family == "flash":
        concurrent = n / cfg.duration_s * _LIFE_MEDIAN_S * 1.3  # mean sessions open at once
        for c in _instants(cfg, rng):
            times.append(c + rng.uniform(0, cfg.flash_rise_s, rng.poisson(0.3 * concurrent)))
    t = np.concatenate(times)
    return np.sort(t[t < cfg.duration_s])


def _instants(cfg: FamilyConfig, rng: np.random.Generator) -> np.ndarray:
    """``events`` instants spread over the trace (one per equal slice, away from its ends)."""
    k = cfg.events
    if k == 0:
        return np.zeros(0)
    edges = np.linspace(0.1 * cfg.duration_s, 0.85 * cfg.duration_s, k + 1)
    return np.sort(rng.uniform(edges[:-1], edges[1:]))


def _lives(cfg: FamilyConfig, rng: np.random.Generator, n: int) -> np.ndarray:
    if cfg.family == "longtail":
        return np.clip(40.0 * (1 + rng.pareto(1.1, n)), 2.0, 4 * cfg.duration_s)
    return np.clip(rng.lognormal(math.log(_LIFE_MEDIAN_S), 0.9, n), 5.0, 3600.0)


def _idle_gap(cfg: FamilyConfig, rng: np.random.Generator) -> float:
    if cfg.family == "longtail":
        return float(5.0 * (1 + rng.pareto(1.3)))
    return float(rng.lognormal(math.log(_IDLE_MEDIAN_S), 0.8))


def generate_family(cfg: FamilyConfig) -> list[SessionEvent]:
    """Events of one family trace, sorted by time (ids ``f000001``...)."""
    rng = np.random.default_rng([cfg.seed, FAMILIES.index(cfg.family)])
    n = cfg.sessions * (4 if cfg.family == "scale4x" else 1)
    arrivals = _arrivals(cfg, rng, n)
    lives = _lives(cfg, rng, arrivals.size)
    sizes = np.clip(rng.lognormal(math.log(1500.0), 0.8, arrivals.size), 50.0, 20000.0)
    weib_scale = _ACTIVE_MEAN_S / math.gamma(1 + 1 / 0.8)
    pauses = _instants(cfg, rng) if cfg.family == "mass-idle" else np.zeros(0)
    pause_back = [float(p + rng.uniform(60.0, 180.0)) for p in pauses]
    rows: list[tuple[float, int, str, EventKind, int]] = []
    for i in range(arrivals.size):
        sid = f"f{i + 1:06d}"
        t0 = float(arrivals[i])
        end = min(t0 + float(lives[i]), cfg.duration_s)
        if end <= 0:
            continue
        own: list[tuple[float, int, str, EventKind, int]] = []
        t = t0
        while True:  # an active spell from t, then an idle gap
            nxt = t + weib_scale * float(rng.weibull(0.8))
            back = None
            for k, p in enumerate(pauses):
                if t < p < min(nxt, end) and rng.uniform() < 0.5:  # paused with the crowd, back with it
                    nxt, back = float(p + rng.uniform(0, 2.0)), pause_back[k] + float(rng.uniform(0, 10.0))
                    break
            if nxt >= end:
                break
            own.append((nxt, 1, sid, EventKind.IDLE, 0))
            wake = back if back is not None else nxt + _idle_gap(cfg, rng)
            if wake >= end:
                break
            own.append((wake, 1, sid, EventKind.ACTIVE, 0))
            t = wake
        # alive at 0: open at 0 in the state the warm-up left it in (idle sessions too)
        idle_at_0 = sum(1 if k is EventKind.IDLE else -1 for x, _, _, k, _ in own if x <= 0) > 0
        rows.append((max(t0, 0.0), 0, sid, EventKind.OPEN, int(sizes[i] * MB)))
        if t0 < 0 and idle_at_0:
            rows.append((0.0, 1, sid, EventKind.IDLE, 0))
        rows.extend(r for r in own if r[0] > 0)
        rows.append((end, 2, sid, EventKind.CLOSE, 0))
    rows.sort(key=lambda e: (round(e[0], 3), e[2] if e[0] == 0 else "", e[1], e[2]))  # at 0: each open, then its idle
    return [SessionEvent(round(t, 3), sid, kind, size) for t, _, sid, kind, size in rows]
