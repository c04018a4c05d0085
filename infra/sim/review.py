"""Trace families from a fifth workload model, written by a second outside reviewer from the
README alone and never used to choose a setting (``chunkserve evaluate --split review``).

The model (its own random streams; numpy's generator): state sizes log-normal, clipped to
0.1-40 GB. Families, 20 minutes each by default:

- ``office`` (mid-stream, "office hours"): the arrival rate a smooth sine over the trace,
  30% of its top at both ends and 100% halfway; sessions alternate Gamma active spells
  (mean 40 s) and Gamma idle spells (mean 21 s, many short), and a user abandons in a
  quarter of the idle spells, part-way into it; lifetimes Gamma (mean 240 s).
- ``viral`` (a launch): the arrival rate doubles every 4 minutes for 12 minutes (eightfold)
  and then holds; Weibull active spells, log-normal idle gaps and lifetimes; 15% of the
  sessions never idle (live avatars).
- ``batchy`` (mid-stream, classrooms and webinars): a small steady background of single
  users, and groups of 20-80 that start about every 50 s (Poisson), join within 30 s, stay
  together about 5 minutes mostly active and leave together within 10 s.

``scale`` multiplies every arrival rate and starting population (1.0: the reviewer's
traces, 1,750-2,100 sessions).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from processors.lifecycle import SessionEvent
from schemas.errors import ConfigError

from infra.sim.draws import poisson_arrivals, row_events

__all__ = ["REVIEW", "ReviewConfig", "generate_review"]

REVIEW = ("office", "viral", "batchy")
Draw = Callable[[], float]


@dataclass(frozen=True, slots=True)
class ReviewConfig:
    """One trace of the fifth model."""

    family: str = "batchy"
    duration_s: float = 1200.0
    scale: float = 1.0
    seed: int = 2024

    def __post_init__(self) -> None:
        if self.family not in REVIEW:
            raise ConfigError("family", f"one of {', '.join(REVIEW)}", "trace gen")
        if self.duration_s <= 0 or self.scale <= 0:
            raise ConfigError("family", "need duration > 0 and sessions >= 1", "trace gen")


class _Trace:
    """Sessions as drawn; events sorted by (time to the ms, session, its own order)."""

    def __init__(self, prefix: str, end: float) -> None:
        self.prefix, self.end, self.n = prefix, end, 0
        self.rows: list[tuple[float, int, int, str, str, float | None]] = []

    def session(self, events: list[tuple[float, str]], mb: float) -> None:
        if not events or events[0][0] > self.end:
            return
        sid, idx = f"{self.prefix}{self.n:05d}", self.n
        self.n += 1
        for k, (t, ev) in enumerate(e for e in events if e[0] <= self.end):
            self.rows.append((round(max(t, 0.0), 3), idx, k, sid, ev, mb if ev == "open" else None))

    def events(self) -> list[SessionEvent]:
        return row_events(self.rows)


def _alternate(rng: np.random.Generator, start: float, end: float, active: Draw, idle: Draw, start_active: bool = True,
               abandon: float = 0.0) -> list[tuple[float, str]]:
    """Open at ``start``, alternate active and idle spells until ``end`` (the close), or a
    close part-way into an idle spell with chance ``abandon``."""
    ev, t, on = [(start, "open")], start, start_active
    if not start_active:
        ev.append((start, "idle"))
    while True:
        spell = active() if on else idle()
        if not on and abandon and rng.random() < abandon:
            quit_at = t + spell * rng.uniform(0.2, 0.8)
            if quit_at < end:
                return ev + [(quit_at, "close")]
        t += spell
        if t >= end:
            return ev + [(end, "close")]
        on = not on
        ev.append((t, "active" if on else "idle"))


def _mb(rng: np.random.Generator, median: float, sigma: float) -> float:
    return float(np.clip(rng.lognormal(math.log(median), sigma), 100, 40000))


def _office(cfg: ReviewConfig, rng: np.random.Generator) -> _Trace:
    out, end, top = _Trace("o", cfg.duration_s), cfg.duration_s, 2.35 * cfg.scale
    rate = lambda t: top * (0.65 - 0.35 * math.cos(2 * math.pi * t / end))  # noqa: E731
    act, idl, life = (lambda: rng.gamma(2.0, 20.0)), (lambda: rng.gamma(0.7, 30.0)), (lambda: rng.gamma(1.5, 160.0))
    for _ in range(rng.poisson(rate(0.0) * 240.0 * 0.6)):  # open at the start (Little's law), residual lives
        rest = rng.uniform(0, 1) * life()
        out.session(_alternate(rng, 0.0, rest, act, idl, start_active=rng.random() < 0.65, abandon=0.25), _mb(rng, 2500, 0.6))
    for t0 in poisson_arrivals(rng, rate, top, 0.0, end):
        out.session(_alternate(rng, t0, t0 + life(), act, idl, abandon=0.25), _mb(rng, 2500, 0.6))
    return out


def _viral(cfg: ReviewConfig, rng: np.random.Generator) -> _Trace:
    out, end = _Trace("v", cfg.duration_s), cfg.duration_s
    rate = lambda t: 0.33 * cfg.scale * 2 ** (min(t, 720.0) / 240.0)  # noqa: E731
    act, idl = (lambda: 30.0 * rng.weibull(1.3)), (lambda: rng.lognormal(math.log(15.0), 1.0))
    for t0 in poisson_arrivals(rng, rate, rate(720.0), 2.0, end):
        life = rng.lognormal(math.log(150.0), 0.9)
        if rng.random() < 0.15:  # never idle
            out.session([(t0, "open"), (t0 + life, "close")], _mb(rng, 2000, 0.8))
        else:
            out.session(_alternate(rng, t0, t0 + life, act, idl), _mb(rng, 2000, 0.8))
    return out


def _batchy(cfg: ReviewConfig, rng: np.random.Generator) -> _Trace:
    out, end, bg = _Trace("b", cfg.duration_s), cfg.duration_s, 0.4 * cfg.scale
    act, idl = (lambda: rng.gamma(2.0, 25.0)), (lambda: rng.exponential(20.0))
    for _ in range(rng.poisson(bg * 220.0 * 0.7)):  # the background, open at the start
        out.session(_alternate(rng, 0.0, rng.exponential(220.0), act, idl, start_active=rng.random() < 0.6), _mb(rng, 1500, 0.7))
    for t0 in poisson_arrivals(rng, lambda t: bg, bg, 0.0, end):
        out.session(_alternate(rng, t0, t0 + rng.exponential(220.0), act, idl), _mb(rng, 1500, 0.7))
    g_act, g_idl = (lambda: rng.gamma(3.0, 40.0)), (lambda: rng.exponential(8.0))  # long watching, short pauses
    starts, t = list(rng.uniform(-250.0, -30.0, size=2)), 0.0  # two groups under way at the start
    while (t := t + rng.exponential(50.0)) < end:
        starts.append(t)
    for g0 in starts:
        size = max(1, round(int(rng.integers(20, 81)) * cfg.scale))
        leave_at = g0 + 30.0 + max(120.0, rng.normal(300.0, 60.0))
        if leave_at <= 0:
            continue
        for _ in range(size):
            join, leave = g0 + rng.uniform(0.0, 30.0), leave_at + rng.uniform(0.0, 10.0)
            out.session(_alternate(rng, max(0.0, join), leave, g_act, g_idl), _mb(rng, 3000, 0.4))
    return out


_FAMILY = {"office": _office, "viral": _viral, "batchy": _batchy}


def generate_review(cfg: ReviewConfig) -> list[SessionEvent]:
    """Events of one trace of the fifth model, sorted by time (seeded, reproducible)."""
    return _FAMILY[cfg.family](cfg, np.random.default_rng([cfg.seed, REVIEW.index(cfg.family)])).events()
