"""Trace families from a fourth workload model, written by an outside reviewer from the
README alone and never used to choose a setting (``chunkserve evaluate --split outside``).

The model (its own random streams, none of the other three models' shapes): state sizes a
mixture of log-normals (60% around 1.5 GB, 30% around 6 GB, 10% around 20 GB, at most
60 GB); in ``weekly`` and ``bimodal`` a fifth of the sessions grow their state by 5-30% on
some activations (the ``active`` event carries the new size). Families, 20 minutes each by
default:

- ``hawkes`` (a launch): self-exciting arrivals (base rate 0.22/s, branching ratio 0.85,
  15 s decay), log-normal lifetimes (median 200 s), active spells Gamma(2, 15 s), idle
  spells exponential (40 s), and wake-ups that cluster: a second self-exciting process ends
  a quarter of the pending idle spells at its next event.
- ``weekly`` (mid-stream): a week compressed into the trace from Wednesday 14:00; nights at
  8% of the peak rate, a morning ramp from 8% to 100% within 6 s, a lunch dip, an evening
  decay, weekends at 45%; lifetimes median 110 s, 260 sessions open at the start.
- ``bimodal`` (mid-stream): half "watchers" (active about 90 s, idle about 10 s), half
  "tinkerers" flipping every 5-20 s; a steady rate with a 15% swing; 380 open at the start.
- ``recall`` (a launch): idle-heavy sessions (active about 20 s, idle about 70 s) and, at
  0.6 of the trace, 70% of the sessions idle then come back within 3 s.

``scale`` multiplies every arrival rate and starting population (1.0: the reviewer's
traces, 2,000-2,400 sessions).
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass
from typing import Callable

from processors.lifecycle import EventKind, SessionEvent
from schemas.errors import ConfigError

from infra.sim.trace import MB

__all__ = ["OUTSIDE", "OutsideConfig", "generate_outside"]

OUTSIDE = ("hawkes", "weekly", "bimodal", "recall")
_MAX_LIFE_S = 1800.0
_MAX_MB = 60000.0
Spell = Callable[[random.Random], float]


@dataclass(frozen=True, slots=True)
class OutsideConfig:
    """One trace of the fourth model."""

    family: str = "hawkes"
    duration_s: float = 1200.0
    scale: float = 1.0
    seed: int = 11

    def __post_init__(self) -> None:
        if self.family not in OUTSIDE:
            raise ConfigError("family", f"one of {', '.join(OUTSIDE)}", "trace gen")
        if self.duration_s <= 0 or self.scale <= 0:
            raise ConfigError("family", "need duration > 0 and sessions >= 1", "trace gen")


class _Rows:
    """Events in the order they were drawn; sorted by (time to the ms, draw order)."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, int, str, EventKind, int]] = []

    def add(self, t: float, sid: str, kind: EventKind, mb: float | None = None) -> None:
        # times to the ms and sizes to the 0.1 MB, as a trace file keeps them (the reviewer's
        # files and these events are the same, event for event)
        size = int(float(f"{mb:.1f}") * MB) if mb is not None else 0
        self.rows.append((round(t, 3), len(self.rows), sid, kind, size))

    def events(self) -> list[SessionEvent]:
        return [SessionEvent(t, sid, kind, size) for t, _, sid, kind, size in sorted(self.rows, key=lambda r: (r[0], r[1]))]


def _state_mb(rng: random.Random) -> float:
    u = rng.random()
    median = 1500 if u < 0.6 else (6000 if u < 0.9 else 20000)
    return min(_MAX_MB, median * math.exp(rng.gauss(0, 0.4)))


def _lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return median * math.exp(rng.gauss(0, sigma))


def _alternate(out: _Rows, rng: random.Random, sid: str, t0: float, t_end: float, end: float, active_s: Spell, idle_s: Spell,
               start_active: bool, grow: bool, mb: float) -> None:
    """Active/idle spells of an open session from ``t0`` to ``t_end`` (at most ``end``), then
    its close; a growing session's activation grows its state by 5-30% three times in ten."""
    t, t_end, active = t0, min(t_end, end), start_active
    if not start_active:
        out.add(t0, sid, EventKind.IDLE)
    while True:
        t += active_s(rng) if active else idle_s(rng)
        if t >= t_end:
            break
        active = not active
        if active and grow and rng.random() < 0.3:
            mb = min(_MAX_MB, mb * (1 + rng.uniform(0.05, 0.3)))
            out.add(t, sid, EventKind.ACTIVE, mb)
        else:
            out.add(t, sid, EventKind.ACTIVE if active else EventKind.IDLE)
    out.add(t_end, sid, EventKind.CLOSE)


def _hawkes_times(rng: random.Random, mu: float, branching: float, tau: float, end: float) -> list[float]:
    """Event times of a self-exciting process (exponential kernel), by thinning."""
    times, t, excited = [], 0.0, 0.0
    while True:
        bound = mu + excited
        dt = rng.expovariate(bound)
        t += dt
        if t >= end:
            return times
        excited *= math.exp(-dt / tau)
        if rng.random() <= (mu + excited) / bound:
            times.append(t)
            excited += branching / tau


def _hawkes(cfg: OutsideConfig, rng: random.Random) -> _Rows:
    out, end = _Rows(), cfg.duration_s
    arrivals = _hawkes_times(rng, 0.22 * cfg.scale, 0.85, 15.0, end)
    wakes = _hawkes_times(rng, 0.01, 0.7, 6.0, end)
    for i, opened in enumerate(arrivals):
        sid = f"hk{i:05d}"
        out.add(opened, sid, EventKind.OPEN, _state_mb(rng))
        t_end = min(end, opened + min(_MAX_LIFE_S, _lognormal(rng, 200, 1.0)))
        t, active = opened, True
        while True:
            if active:
                d = rng.gammavariate(2.0, 15.0)
            else:
                d = rng.expovariate(1 / 40.0)
                k = bisect.bisect_right(wakes, t)
                if k < len(wakes) and wakes[k] - t < d and rng.random() < 0.25:
                    d = wakes[k] - t + rng.uniform(0, 0.5)
            t += d
            if t >= t_end:
                break
            active = not active
            out.add(t, sid, EventKind.ACTIVE if active else EventKind.IDLE)
        out.add(t_end, sid, EventKind.CLOSE)
    return out


def _weekly_rate(t: float, end: float) -> float:
    """The arrival rate at ``t`` as a share of the peak (a week in ``end`` seconds)."""
    day_s = end / 7.0
    x = t / day_s + 2 + 14 / 24  # t = 0 is Wednesday 14:00
    day, h = int(x) % 7, (x - int(x)) * 24
    ramp_h = 6.0 / day_s * 24  # the morning ramp takes 6 s of the trace
    if h < 7:
        r = 0.08
    elif h < 7 + ramp_h:
        r = 0.08 + 0.92 * (h - 7) / ramp_h
    elif h < 12:
        r = 1.0
    elif h < 13.5:
        r = 0.7
    elif h < 18:
        r = 0.95
    else:
        r = 0.95 * math.exp(-(h - 18) / 2.0) + 0.08
    return 0.08 + (r - 0.08) * 0.45 if day in (5, 6) else r


def _weekly(cfg: OutsideConfig, rng: random.Random) -> _Rows:
    out, end, n = _Rows(), cfg.duration_s, 0
    active_s: Spell = lambda r: r.expovariate(1 / 50.0)  # noqa: E731
    idle_s: Spell = lambda r: r.expovariate(1 / 15.0)  # noqa: E731
    for _ in range(int(260 * cfg.scale)):  # open at the start, from the afternoon before
        sid, n = f"wk{n:05d}", n + 1
        mb = _state_mb(rng)
        out.add(0.0, sid, EventKind.OPEN, mb)
        life = min(_MAX_LIFE_S, _lognormal(rng, 110, 0.9))
        _alternate(out, rng, sid, 0.0, life, end, active_s, idle_s, rng.random() < 0.75, rng.random() < 0.2, mb)
    t = 0.0
    while True:
        t += rng.expovariate(3.0 * cfg.scale)
        if t >= end:
            return out
        if rng.random() > _weekly_rate(t, end):
            continue
        sid, n = f"wk{n:05d}", n + 1
        mb = _state_mb(rng)
        out.add(t, sid, EventKind.OPEN, mb)
        life = min(_MAX_LIFE_S, _lognormal(rng, 110, 0.9))
        _alternate(out, rng, sid, t, t + life, end, active_s, idle_s, True, rng.random() < 0.2, mb)


def _bimodal(cfg: OutsideConfig, rng: random.Random) -> _Rows:
    out, end, n = _Rows(), cfg.duration_s, 0
    watch_on: Spell = lambda r: r.expovariate(1 / 90.0)  # noqa: E731
    watch_off: Spell = lambda r: r.expovariate(1 / 10.0)  # noqa: E731
    tinker: Spell = lambda r: r.uniform(5.0, 20.0)  # noqa: E731

    def one(t0: float, life: float, warm: bool) -> None:
        nonlocal n
        sid, n = f"bm{n:05d}", n + 1
        mb = _state_mb(rng)
        out.add(t0, sid, EventKind.OPEN, mb)
        watcher = rng.random() < 0.5
        start_active = (rng.random() < (0.9 if watcher else 0.5)) if warm else True
        on, off = (watch_on, watch_off) if watcher else (tinker, tinker)
        _alternate(out, rng, sid, t0, t0 + life, end, on, off, start_active, rng.random() < 0.2, mb)

    for _ in range(int(380 * cfg.scale)):  # the steady state's population at the start
        one(0.0, min(_MAX_LIFE_S, _lognormal(rng, 200, 0.8)), warm=True)
    t = 0.0
    while True:
        t += rng.expovariate(1.5 * cfg.scale * (1 + 0.15 * math.sin(2 * math.pi * t / 400)))
        if t >= end:
            return out
        one(t, min(_MAX_LIFE_S, _lognormal(rng, 200, 0.8)), warm=False)


def _recall(cfg: OutsideConfig, rng: random.Random) -> _Rows:
    out, end, at = _Rows(), cfg.duration_s, 0.6 * cfg.duration_s
    t, n = 0.0, 0
    while True:
        t += rng.expovariate(1.7 * cfg.scale)
        if t >= end:
            return out
        sid, n = f"rc{n:05d}", n + 1
        out.add(t, sid, EventKind.OPEN, _state_mb(rng))
        t_end = min(end, t + min(_MAX_LIFE_S, _lognormal(rng, 420, 0.7)))
        now, active, recalled = t, True, False
        while True:
            nxt = now + (rng.expovariate(1 / 20.0) if active else rng.expovariate(1 / 70.0))
            if not active and not recalled and now <= at < nxt and nxt > at + 3:
                if rng.random() < 0.7:  # idle across the recall: 70% come back within 3 s of it
                    nxt = at + rng.uniform(0.0, 3.0)
                recalled = True
            now = nxt
            if now >= t_end:
                break
            active = not active
            out.add(now, sid, EventKind.ACTIVE if active else EventKind.IDLE)
        out.add(t_end, sid, EventKind.CLOSE)


_FAMILY = {"hawkes": _hawkes, "weekly": _weekly, "bimodal": _bimodal, "recall": _recall}


def generate_outside(cfg: OutsideConfig) -> list[SessionEvent]:
    """Events of one trace of the fourth model, sorted by time (seeded, reproducible)."""
    return _FAMILY[cfg.family](cfg, random.Random(f"{cfg.family}-{cfg.seed}")).events()
