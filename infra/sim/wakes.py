"""Trace families from a ninth workload model, written by a sixth outside reviewer from the
README alone and never used to choose a setting (``chunkserve evaluate --split wakes``).

The model (the reviewer's, every parameter kept; its own random stream, the standard
library's ``random.Random(seed)``, the same for every family). Arrivals are Poisson (thinned
where the rate moves); families, 20 minutes each by default:

- ``turns`` (the reviewer's ``avatars``: turn-taking conversational avatars): an active reply
  of U(3, 12) s, then idle while the user speaks for U(2, 10) s, over and over; lifetimes
  log-uniform 5-30 minutes; a fifth of the expected sessions alive at 0 (55% of them
  executing); arrivals swinging by 25% over the trace; states U(0.8, 3) GB.
- ``nightshift`` (a very small load with rare crowds): 5 sessions alive at 0 and Poisson
  arrivals (log-normal lifetimes, median 4 minutes; exponential spells, 60 s active, 40 s
  idle); each crowd is 40-90 sessions arriving within 12 s, somewhere in 0.15-0.85 of the
  trace, each 60-300 s long. ``crowds`` sets how many (the reviewer's default: 2).
- ``heavystate`` (states of several GB): log-uniform 2-16 GB, 5% 24-64 GB; every ``idle``
  row offloads a state grown by 0-15% (at most 64 GB); log-normal spells (active median
  40 s, idle 35 s); a fifth alive at 0; the arrival rate rising from 0.7 to 1.3 times.
- ``lurkers`` (most sessions open and stay idle): 75% run for 0.5-4 s (half of them) or not
  at all, then idle with a solo spell of 5-30 s about every 700 s; 25% alternate 45 s active
  and 60 s idle (exponential); 30% of the expected sessions alive at 0; twice per trace (at
  0.3-0.45 and 0.7-0.85 of it) 45% of the open sessions wake within 4 s for 30-120 s.

``scale`` is sessions / 1,600 (the reviewer's ``--sessions``, default 1,600: the expected
arrivals; for ``nightshift`` the background arrivals alone: the reviewer ran 40 and 60). The
reviewer's traces: ``turns`` and ``heavystate`` at 1,600, ``lurkers`` at 1,500, ``nightshift``
at 40 with one crowd (seed 1) and 60 with two (seed 2). Times are kept as the reviewer's
files keep them (to the ms, then six significant digits) and sizes in whole MB.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable

from processors.lifecycle import EventKind, SessionEvent
from schemas.errors import ConfigError

from infra.sim.draws import check_config
from infra.sim.trace import MB

__all__ = ["WAKES", "WakesConfig", "generate_wakes"]

WAKES = ("turns", "nightshift", "heavystate", "lurkers")
SESSIONS = 1600  # the reviewer's default --sessions: scale 1.0
Draw = Callable[[], float]


@dataclass(frozen=True, slots=True)
class WakesConfig:
    """One trace of the ninth model (``crowds``: the night shift's, the reviewer's --spikes)."""

    family: str = "turns"
    duration_s: float = 1200.0
    scale: float = 1.0
    seed: int = 1
    crowds: int = 2

    def __post_init__(self) -> None:
        check_config(WAKES, self.family, self.duration_s, self.scale, self.seed)
        if self.crowds < 0:
            raise ConfigError("crowds", "must be >= 0", "trace gen")


def _arrivals(rng: random.Random, rate: Callable[[float], float], top: float, t0: float, t1: float) -> list[float]:
    """Thinning: inhomogeneous Poisson arrivals on [t0, t1) under ``top``."""
    t, out = t0, []
    while True:
        t += rng.expovariate(top)
        if t >= t1:
            return out
        if rng.random() * top <= rate(t):
            out.append(t)


class _Rows:
    """The rows drawn (time to the ms, session, event, state MB or ""), and the session ids."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, str, str, int | str]] = []
        self.n = 0

    def new_id(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n:05d}"

    def add(self, t: float, sid: str, event: str, state: int | str = "") -> None:
        self.rows.append((round(t, 3), sid, event, state))

    def events(self) -> list[SessionEvent]:
        """Stably sorted by time; a time as the reviewer's files write it (``%g``)."""
        order = sorted(range(len(self.rows)), key=lambda i: (self.rows[i][0], i))
        return [SessionEvent(float(f"{t:g}"), sid, EventKind(event), state * MB if state != "" else 0)
                for t, sid, event, state in (self.rows[i] for i in order)]


def _alternate(w: _Rows, sid: str, t_open: float, t_close: float, active: Draw, idle: Draw,
               start_active: bool, state: int, grow: Callable[[int], int] | None = None) -> None:
    """Open, alternating spells strictly inside (t_open, t_close), close; ``grow`` (given the
    state so far) sizes the state each idle row offloads (None: the rows give no size)."""
    w.add(t_open, sid, "open", state)
    t, executing = t_open, True
    if not start_active:
        w.add(t_open, sid, "idle")
        executing = False
    while True:
        t += active() if executing else idle()
        if t >= t_close - 1e-3:
            break
        if executing and grow is not None:
            state = grow(state)
            w.add(t, sid, "idle", state)
        else:
            w.add(t, sid, "idle" if executing else "active")
        executing = not executing
    w.add(t_close, sid, "close")


def _turns(rng: random.Random, dur: float, sessions: float, crowds: int) -> _Rows:
    w = _Rows()
    life = lambda: math.exp(rng.uniform(math.log(300), math.log(1800)))  # noqa: E731
    act = lambda: rng.uniform(3, 12)  # noqa: E731
    idl = lambda: rng.uniform(2, 10)  # noqa: E731
    state = lambda: int(rng.uniform(800, 3000))  # noqa: E731
    for _ in range(int(sessions * 0.2)):  # mid-stream: alive at 0
        sid = w.new_id("av")
        rem = life() * rng.random()
        start_active = rng.random() < 0.55
        _alternate(w, sid, 0.0, min(dur, max(rem, 5.0)), act, idl, start_active, state())
    mean_rate = sessions / dur
    rate = lambda t: mean_rate * (1 + 0.25 * math.sin(2 * math.pi * t / dur))  # noqa: E731
    for t in _arrivals(rng, rate, mean_rate * 1.25, 0.0, dur):
        sid = w.new_id("av")
        _alternate(w, sid, t, min(dur, t + life()), act, idl, True, state())
    return w


def _nightshift(rng: random.Random, dur: float, sessions: float, crowds: int) -> _Rows:
    w = _Rows()
    life = lambda: min(1200.0, rng.lognormvariate(math.log(240), 0.8))  # noqa: E731
    act = lambda: rng.expovariate(1 / 60)  # noqa: E731
    idl = lambda: rng.expovariate(1 / 40)  # noqa: E731
    state = lambda: int(rng.uniform(500, 3000))  # noqa: E731
    for _ in range(5):  # a handful alive at 0
        sid = w.new_id("ns")
        t_close = min(dur, life())
        start_active = rng.random() < 0.6
        _alternate(w, sid, 0.0, t_close, act, idl, start_active, state())
    rate = sessions / dur
    for t in _arrivals(rng, lambda t: rate, rate, 0.0, dur):
        sid = w.new_id("ns")
        _alternate(w, sid, t, min(dur, t + life()), act, idl, True, state())
    for _ in range(crowds):  # 40-90 sessions within 12 s, short ones
        t0 = rng.uniform(0.15 * dur, 0.85 * dur)
        for _ in range(rng.randint(40, 90)):
            sid = w.new_id("sp")
            t = t0 + rng.uniform(0, 12)
            t_close = min(dur, t + rng.uniform(60, 300))
            _alternate(w, sid, t, t_close, lambda: rng.uniform(20, 90), lambda: rng.uniform(5, 30), True, state())
    return w


def _heavy_state(rng: random.Random) -> int:
    if rng.random() < 0.05:
        return int(rng.uniform(24000, 64000))
    return int(math.exp(rng.uniform(math.log(2000), math.log(16000))))


def _heavy_session(w: _Rows, rng: random.Random, sid: str, t_open: float, t_close: float, start_active: bool) -> None:
    """As :func:`_alternate`, each idle row offloading a state grown by 0-15% (64 GB at most)."""
    _alternate(w, sid, t_open, t_close, lambda: rng.lognormvariate(math.log(40), 0.6),
               lambda: rng.lognormvariate(math.log(35), 0.8), start_active, _heavy_state(rng),
               grow=lambda st: min(64000, int(st * rng.uniform(1.0, 1.15))))


def _heavystate(rng: random.Random, dur: float, sessions: float, crowds: int) -> _Rows:
    w = _Rows()
    life = lambda: min(3 * dur, rng.lognormvariate(math.log(420), 0.7))  # noqa: E731
    for _ in range(int(sessions * 0.2)):
        sid = w.new_id("hs")
        t_close = min(dur, max(5.0, life() * rng.random()))
        _heavy_session(w, rng, sid, 0.0, t_close, rng.random() < 0.55)
    rate = sessions / dur
    for t in _arrivals(rng, lambda t: rate * (0.7 + 0.6 * (t / dur)), rate * 1.3, 0.0, dur):  # a slow rise
        sid = w.new_id("hs")
        _heavy_session(w, rng, sid, t, min(dur, t + life()), True)
    return w


def _intervals(w: _Rows, sid: str, t_open: float, t_close: float, spans: list[tuple[float, float]], state: int) -> None:
    """Active spans, clipped and merged, as open / idle / active / close rows."""
    merged: list[list[float]] = []
    for a, b in sorted((max(a, t_open), min(b, t_close)) for a, b in spans):
        if b <= a:
            continue
        if merged and a <= merged[-1][1] + 1e-3:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    w.add(t_open, sid, "open", state)
    if not merged or merged[0][0] > t_open + 1e-3:
        w.add(t_open, sid, "idle")
    for a, b in merged:
        if a > t_open + 1e-3:
            w.add(a, sid, "active")
        if b < t_close - 1e-3:
            w.add(b, sid, "idle")
    w.add(t_close, sid, "close")


def _lurker_spans(rng: random.Random, t_open: float, t_close: float) -> list[tuple[float, float]]:
    """A lurker's (75%): a short first spell half the time, then rare solo spells; else a
    participant's: about 45 s active, 60 s idle."""
    spans = []
    if rng.random() < 0.75:
        if rng.random() < 0.5:
            spans.append((t_open, t_open + rng.uniform(0.5, 4)))
        t = t_open
        while True:
            t += rng.expovariate(1 / 700)
            if t >= t_close:
                break
            d = rng.uniform(5, 30)
            spans.append((t, t + d))
            t += d
    else:
        t, active = t_open, True
        while t < t_close:
            d = rng.expovariate(1 / 45) if active else rng.expovariate(1 / 60)
            if active:
                spans.append((t, t + d))
            t += d
            active = not active
    return spans


def _lurkers(rng: random.Random, dur: float, sessions: float, crowds: int) -> _Rows:
    w = _Rows()
    rate = sessions / dur
    arrivals = _arrivals(rng, lambda t: rate, rate, 0.0, dur)
    opens = [0.0] * int(sessions * 0.3) + arrivals
    wakes = sorted([rng.uniform(0.3 * dur, 0.45 * dur), rng.uniform(0.7 * dur, 0.85 * dur)])
    for t_open in opens:
        sid = w.new_id("lk")
        t_close = min(dur, t_open + max(5.0, rng.lognormvariate(math.log(900), 0.6)))
        spans = _lurker_spans(rng, t_open, t_close)
        for tm in wakes:  # a mass wake: 45% of the open sessions within 4 s, active 30-120 s
            if t_open < tm < t_close and rng.random() < 0.45:
                ta = tm + rng.uniform(0, 4)
                spans.append((ta, ta + rng.uniform(30, 120)))
        _intervals(w, sid, t_open, t_close, spans, int(rng.uniform(300, 2500)))
    return w


_FAMILY = {"turns": _turns, "nightshift": _nightshift, "heavystate": _heavystate, "lurkers": _lurkers}


def generate_wakes(cfg: WakesConfig) -> list[SessionEvent]:
    """Events of one trace of the ninth model, in time order (seeded, reproducible)."""
    rows = _FAMILY[cfg.family](random.Random(cfg.seed), cfg.duration_s, cfg.scale * SESSIONS, cfg.crowds)
    return rows.events()
