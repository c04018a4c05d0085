"""Trace families from a sixth workload model, written by a third outside reviewer from the
README alone and never used to choose a setting (``chunkserve evaluate --split surge``).

The model (the reviewer's, every parameter kept; its own random streams, numpy's generator):
Poisson arrivals (thinned where the rate changes), lifetimes and idle gaps log-normal,
active spells exponential or log-normal. Each family is a surge that arrives or leaves
within seconds. Families, 20 minutes each by default:

- ``failover`` (mid-stream, a regional service): 250 sessions open at the start (30% of
  them idle) and arrivals at 1.1/s throughout; lifetimes median 240 s, active spells
  exponential (mean 60 s), idle gaps median 20 s, states median 2 GB (0.2-16 GB). At
  10:00 another region fails over: 500 of its live users open already executing, 70% of
  them within 4 s and the rest (reconnect retries) within 20 s. At 16:00 it fails back:
  60% of the failover sessions still open close within 10 s.
- ``heavyvid`` (a launch of heavy-state video generation; starts empty): arrivals at
  1.0/s, states log-uniform 5-20 GB that grow by up to 15% at each return (the ``active``
  row carries the new size; at most 20 GB), generation spells median 25 s, lifetimes
  median 600 s; idle gaps of minutes, 65% of them ending at the next review wave (every
  150 s, within 6 s of it, after at least 60 s idle), the others median 150 s. A return
  that would come after the session's end is a close while idle.
- ``liveevent`` (a scheduled live show with interactive avatars; starts empty): a lobby
  from 0 to 5:00 with arrivals ramping from 0.2/s to 1.0/s, 70% of them opening idle (the
  rest idle after a preview of about 15 s); at 5:00 the show starts, the lobby wakes within
  3 s and 900 more arrive (exponentially decaying, 15 s), then 0.8/s; in the show active
  spells of about 90 s and tab-away idles of about 10 s, and each user leaves early after
  about 15 minutes (exponential). At half-time (12:00) 80% of those executing go idle
  within 2 s, 15% of the sessions close before the return and arrivals drop to 0.2/s; at
  the return (14:00) 85% come back within 5 s, the rest later (about 30 s); the show ends
  at 19:00 and every session closes within 30 s.

``duration_s`` stretches the instants the reviewer fixed in seconds (the failover at 600 s,
the failback at 960 s, the show's start at 300 s, half-time at 720 s, the return at 840 s,
its end at 1,140 s, the 150 s review waves) by ``duration_s / 1200``, so a shorter trace
keeps the same shape; spells, lifetimes and the windows of a surge stay in seconds, and a
session still open at the trace's end closes there. ``scale`` multiplies every arrival rate
and every population (the sessions open at the start, the failover's arriving users, the
show's surge; 1.0: the reviewer's traces, roughly 1,150-2,100 sessions).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping

import numpy as np

from processors.lifecycle import SessionEvent

from infra.sim.draws import check_config, poisson_arrivals, row_events

__all__ = ["SURGES", "SurgeConfig", "generate_surge"]

SURGES = ("failover", "heavyvid", "liveevent")
DUR = 1200.0  # the reviewer's trace length: the instants below are for it
Draw = Callable[[], float]
Event = tuple[float, str, float | None]  # (time, event, state in MB or None)

# ---------------------------------------------------------------- parameters (the reviewer's)
FAILOVER: Mapping[str, float] = MappingProxyType(dict(
    alive_at_start=250,      # sessions open at t=0 (mid-stream)
    open_idle_share=0.3,     # of those, share that open idle
    base_rate=1.1,           # Poisson arrivals / s, whole run
    t_fail=600.0,            # failover instant
    fail_n=500,              # other region's live users arriving
    fail_fast_share=0.7,     # share arriving within fail_fast_s
    fail_fast_s=4.0,
    fail_slow_s=20.0,        # the rest (reconnect retries) within this
    t_back=960.0,            # failback instant
    back_share=0.6,          # share of surviving failover sessions leaving
    back_window_s=10.0,
    life_median=240.0, life_sigma=0.8, life_min=10.0,
    active_mean=60.0,        # exponential active spells
    idle_median=20.0, idle_sigma=1.0,   # log-normal idle gaps
    state_median=2000.0, state_sigma=0.7, state_min=200.0, state_max=16000.0,
))
HEAVYVID: Mapping[str, float] = MappingProxyType(dict(
    rate=1.0,                # Poisson arrivals / s (trace starts empty)
    state_lo=5000.0, state_hi=20000.0,   # log-uniform MB at open
    grow_lo=1.0, grow_hi=1.15, state_cap=20000.0,  # growth factor per return
    life_median=600.0, life_sigma=0.6, life_min=60.0,
    gen_median=25.0, gen_sigma=0.5,      # generation (active) spell, log-normal
    wave_period=150.0, wave_jitter=6.0,  # review waves every 150 s, +U(0,6) s
    wave_share=0.65,         # idle gaps that end at a wave
    wave_min_gap=60.0,       # a wave return needs at least this much idle
    idle_median=150.0, idle_sigma=0.7,   # the other idle gaps (minutes)
))
LIVEEVENT: Mapping[str, float] = MappingProxyType(dict(
    pre_rate0=0.2, pre_rate1=1.0,        # lobby arrival rate ramp over [0, t_start)
    lobby_idle_share=0.7,    # lobby arrivals that open idle (else a preview spell)
    preview_mean=15.0,
    t_start=300.0, wake_s=3.0,            # lobby wakes within 3 s
    surge_n=900, surge_tau=15.0,          # surge arrivals, exp-decaying over the start
    show_rate=0.8,           # steady arrivals during the show
    half_rate=0.2,           # arrivals during half-time
    active_mean=90.0, idle_median=10.0, idle_sigma=0.8,  # tab-away idles in the show
    leave_mean=900.0,        # exponential time to leave early
    t_half=720.0, half_idle_share=0.8, half_idle_s=2.0,
    half_close_share=0.15,   # of open sessions, close during half-time
    t_return=840.0, return_share=0.85, return_s=5.0, late_mean=30.0,
    t_end=1140.0, end_s=30.0,
    state_median=1500.0, state_sigma=0.5, state_min=300.0, state_max=6000.0,
))


@dataclass(frozen=True, slots=True)
class SurgeConfig:
    """One trace of the sixth model."""

    family: str = "failover"
    duration_s: float = 1200.0
    scale: float = 1.0
    seed: int = 7

    def __post_init__(self) -> None:
        check_config(SURGES, self.family, self.duration_s, self.scale, self.seed)


class _Trace:
    """Sessions as drawn; events sorted by (time to the ms, session, its own order)."""

    def __init__(self, end: float) -> None:
        self.end, self.n = round(end, 3), 0
        self.rows: list[tuple[float, int, int, str, str, float | None]] = []

    def session(self, prefix: str, events: list[Event]) -> None:
        """One session's events in its own order, the close last. As the reviewer's
        ``emit_session``: times to the ms, each after the one before (an idle may share its
        open's instant); past the trace's end only the close is kept, at the end."""
        if round(max(events[0][0], 0.0), 3) >= self.end:
            return
        self.n += 1
        sid, idx, last, k = f"{prefix}{self.n:05d}", self.n, -1.0, 0
        for i, (t, ev, mb) in enumerate(events):
            t = round(max(t, 0.0), 3)
            if i and t <= last and not (ev == "idle" and events[i - 1][1] == "open" and t == round(events[i - 1][0], 3)):
                t = round(last + 0.001, 3)
            if ev == "close":
                t = min(t, self.end)
            elif t >= self.end:
                continue
            self.rows.append((t, idx, k, sid, ev, mb))
            last, k = t, k + 1

    def events(self) -> list[SessionEvent]:
        return row_events(self.rows)


def _alternate(start: float, end: float, executing: bool, active: Draw, idle: Draw) -> list[tuple[float, str]]:
    """Alternating spells from ``start`` (executing or idle) until ``end``; the transitions
    strictly inside (start, end)."""
    tr, t = [], start
    while True:
        t += active() if executing else idle()
        if t >= end:
            return tr
        executing = not executing
        tr.append((t, "active" if executing else "idle"))


def _lognormal(rng: np.random.Generator, median: float, sigma: float) -> float:
    return float(rng.lognormal(math.log(median), sigma))


def _state(rng: np.random.Generator, p: Mapping[str, float]) -> float:
    """A state size in MB: log-normal, clipped to the family's bounds."""
    return float(np.clip(_lognormal(rng, p["state_median"], p["state_sigma"]), p["state_min"], p["state_max"]))


def _failover(cfg: SurgeConfig, rng: np.random.Generator, p: Mapping[str, float] = FAILOVER) -> _Trace:
    out, dur, s = _Trace(cfg.duration_s), cfg.duration_s, cfg.scale
    t_fail, t_back = p["t_fail"] * dur / DUR, p["t_back"] * dur / DUR
    life = lambda: max(p["life_min"], _lognormal(rng, p["life_median"], p["life_sigma"]))  # noqa: E731
    state = lambda: _state(rng, p)  # noqa: E731
    act = lambda: float(rng.exponential(p["active_mean"]))  # noqa: E731
    idl = lambda: _lognormal(rng, p["idle_median"], p["idle_sigma"])  # noqa: E731

    def session(prefix: str, t0: float, close_t: float, open_idle: bool) -> None:
        ev: list[Event] = [(t0, "open", state())]
        if open_idle:
            ev.append((t0, "idle", None))
        close_t = min(close_t, dur)
        ev += [(t, e, None) for t, e in _alternate(t0, close_t, not open_idle, act, idl)]
        out.session(prefix, ev + [(close_t, "close", None)])

    for _ in range(round(p["alive_at_start"] * s)):
        # residual lifetime of a session alive at 0 (length-biased: uniform share)
        rest = life() * (0.2 + 0.8 * rng.random()) + 1.0
        session("a", 0.0, rest, rng.random() < p["open_idle_share"])
    rate = p["base_rate"] * s
    for t in poisson_arrivals(rng, lambda t: rate, rate, 0.0, dur):
        if t > 0:
            session("r", t, t + life(), False)
    for _ in range(round(p["fail_n"] * s)):
        if rng.random() < p["fail_fast_share"]:
            t0 = t_fail + rng.uniform(0, p["fail_fast_s"])
        else:
            t0 = t_fail + rng.uniform(p["fail_fast_s"], p["fail_slow_s"])
        c = t0 + life()
        if c > t_back and rng.random() < p["back_share"]:
            c = t_back + rng.uniform(0, p["back_window_s"])
        session("f", t0, c, False)
    return out


def _heavyvid(cfg: SurgeConfig, rng: np.random.Generator, p: Mapping[str, float] = HEAVYVID) -> _Trace:
    out, dur, rate = _Trace(cfg.duration_s), cfg.duration_s, p["rate"] * cfg.scale
    period = p["wave_period"] * dur / DUR
    for t0 in poisson_arrivals(rng, lambda t: rate, rate, 0.0, dur):
        st = math.exp(rng.uniform(math.log(p["state_lo"]), math.log(p["state_hi"])))
        end = t0 + max(p["life_min"], _lognormal(rng, p["life_median"], p["life_sigma"]))
        ev: list[Event] = [(t0, "open", st)]
        t = t0
        while True:
            t += _lognormal(rng, p["gen_median"], p["gen_sigma"])
            if t >= end or t >= dur:
                break
            ev.append((t, "idle", None))
            if rng.random() < p["wave_share"]:
                k = math.ceil((t + p["wave_min_gap"]) / period)
                r = k * period + rng.uniform(0, p["wave_jitter"])
            else:
                r = t + _lognormal(rng, p["idle_median"], p["idle_sigma"])
            if r >= end or r >= dur:
                t = min(end, dur)  # abandons while idle
                break
            t = r
            st = min(p["state_cap"], st * rng.uniform(p["grow_lo"], p["grow_hi"]))
            ev.append((t, "active", st))  # the grown state, on the return
        out.session("v", ev + [(min(max(t, end), dur), "close", None)])
    return out


def _liveevent(cfg: SurgeConfig, rng: np.random.Generator, p: Mapping[str, float] = LIVEEVENT) -> _Trace:
    out, dur, s = _Trace(cfg.duration_s), cfg.duration_s, cfg.scale
    state = lambda: _state(rng, p)  # noqa: E731
    act = lambda: float(rng.exponential(p["active_mean"]))  # noqa: E731
    idl = lambda: _lognormal(rng, p["idle_median"], p["idle_sigma"])  # noqa: E731
    Ts, Th, Tr, Te = (p[k] * dur / DUR for k in ("t_start", "t_half", "t_return", "t_end"))

    arrivals: list[tuple[float, str]] = []
    r0, r1 = p["pre_rate0"] * s, p["pre_rate1"] * s
    pre = lambda t: r0 + (r1 - r0) * t / Ts  # noqa: E731
    arrivals += [(t, "lobby") for t in poisson_arrivals(rng, pre, r1, 0.0, Ts)]
    for _ in range(round(p["surge_n"] * s)):
        arrivals.append((Ts + min(float(rng.exponential(p["surge_tau"])), Th - Ts - 1), "show"))
    show, half = p["show_rate"] * s, p["half_rate"] * s
    rate = lambda t: half if Th <= t < Tr else show  # noqa: E731
    arrivals += [(t, "show") for t in poisson_arrivals(rng, rate, show, Ts, Te)]

    for t0, kind in arrivals:
        leave = t0 + rng.exponential(p["leave_mean"])
        end_t = Te + rng.uniform(0, p["end_s"])
        half_close = rng.random() < p["half_close_share"]
        ev: list[Event] = [(t0, "open", state())]
        # phases: [t0, Ts) lobby, [Ts, Th) show, [Th, Tr) half-time, [Tr, Te) show
        executing = True
        t = t0
        if kind == "lobby":
            if rng.random() < p["lobby_idle_share"]:
                ev.append((t0, "idle", None))
                executing = False
            else:
                tp = t0 + rng.exponential(p["preview_mean"])
                if tp < Ts:
                    ev.append((tp, "idle", None))
                    executing = False
            if leave < Ts:  # left the lobby
                out.session("e", ev + [(max(leave, ev[-1][0] + 0.01), "close", None)])
                continue
            t = Ts + rng.uniform(0, p["wake_s"])
            if not executing:
                ev.append((t, "active", None))
                executing = True
        first_half_end = min(leave, Th)
        if t < first_half_end:
            for tt, e in _alternate(t, first_half_end, executing, act, idl):
                ev.append((tt, e, None))
                executing = e == "active"
        if leave < Th:
            out.session("e", ev + [(leave, "close", None)])
            continue
        # half-time
        if t < Th:
            th = Th + rng.uniform(0, p["half_idle_s"])
            if executing and rng.random() < p["half_idle_share"]:
                ev.append((th, "idle", None))
                executing = False
            t = th
        if half_close:
            # Python's random.uniform(a, b), a + (b - a) * U, as the reviewer drew it: for one who
            # arrives after the return (a > b) this lands before a, and the close follows the open
            lo = max(t, Th) + 0.01
            out.session("e", ev + [(lo + (Tr - lo) * rng.random(), "close", None)])
            continue
        # (arrivals during half-time just run)
        if t < Tr:
            if executing:
                # sessions that stayed executing (or arrived) alternate through half-time
                for tt, e in _alternate(t, Tr, True, act, idl):
                    ev.append((tt, e, None))
                    executing = e == "active"
            if rng.random() < p["return_share"]:
                tr = Tr + rng.uniform(0, p["return_s"])
            else:
                tr = Tr + p["return_s"] + rng.exponential(p["late_mean"])
            if not executing:
                ev.append((tr, "active", None))
                executing = True
            t = tr
        stop = min(leave, end_t)
        if t < stop:
            ev += [(tt, e, None) for tt, e in _alternate(t, stop, executing, act, idl)]
        out.session("e", ev + [(max(stop, ev[-1][0] + 0.01), "close", None)])
    return out


_FAMILY = {"failover": _failover, "heavyvid": _heavyvid, "liveevent": _liveevent}


def generate_surge(cfg: SurgeConfig) -> list[SessionEvent]:
    """Events of one trace of the sixth model, sorted by time (seeded, reproducible)."""
    return _FAMILY[cfg.family](cfg, np.random.default_rng([cfg.seed, SURGES.index(cfg.family)])).events()
