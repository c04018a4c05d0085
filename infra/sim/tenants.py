"""Trace families from an eighth workload model, written by a fifth outside reviewer from the
README alone and never used to choose a setting (``chunkserve evaluate --split tenants``).

The model (the reviewer's, every parameter kept; its own random stream, numpy's generator
seeded with ``[seed, 11 | 23 | 37]`` per family). The trace's length compresses the macro
schedule (shifts, bells, outages); the micro dynamics (calls, rounds, retries) run in real
seconds. Families, 20 minutes each by default:

- ``desk`` (an avatar help desk across time zones): each seat is a long-lived session for an
  agent's shift, active during a customer call (log-normal, median 45 s) and idle between
  calls (exponential gaps, mean 35 s at the region's busy hour, up to 140 s off-peak).
  Region A (600 seats) is there at 0 (half of them mid-call); at 0.375 of the trace its shift
  changes: the old shift logs off after its call while the new one logs in, each new seat
  opening with a 4-10 s greeting. Three lunch groups 45 s apart idle 60-110 s each; region B
  (450 seats) logs in at 0.25-0.33 of the trace with its own lunch at 0.8; 40% of region A
  winds down from 0.88; 5% of seats relog mid-shift. States log-normal, median 1.8 GB. A
  trace of 3,000 s or more adds a third region (C, 350 seats, from 0.55) and region B's shift
  change at 0.7.
- ``lobby`` (tenants going active together): classrooms of 15-35 (12 per bell, a bell every
  quarter of the trace, states about 600 MB) and game lobbies (Poisson, an evening bump,
  Pareto sizes 2-100, 250-700 s of rounds, members dropping out and joining between rounds).
  All members of a tenant open executing, then go idle, active and idle again together
  within a few seconds; a lobby's state is 1 GB (75%), 4 GB (20%) or 15 GB (5%).
- ``outage`` (an edge outage and a retry storm): 700 sessions there at 0 and Poisson arrivals
  at 1/s, 20% of them "returners" (Pareto idles of 200 s or more); at 0.38-0.46 of the trace
  80% of the connected clients drop within 3 s and the service is back 40 s later; they
  retry with capped exponential backoff and full jitter (base 1 s, cap 30 s, 70% of attempts
  after the recovery succeed), a reconnect being a new session id that opens executing (one
  idle before goes idle again 15-40 s later); arrivals during the outage join the storm. An
  aftershock (40%, 10 s) a quarter of the trace later. States log-normal, median 2 GB.

``scale`` multiplies the seats, classrooms per bell, the lobbies' and the arrivals' rates and
the sessions there at 0 (1.0: the reviewer's traces, 1,700-2,300 sessions in 20 minutes).
Times are kept to the 10 ms and sizes to the MB as the reviewer's files keep them; a session
still open at the end closes at the trace's last instant, as a trace file's reader closes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from processors.lifecycle import EventKind, SessionEvent

from infra.sim.draws import check_config, closed_at_end
from infra.sim.trace import MB

__all__ = ["TENANTS", "TenantsConfig", "generate_tenants"]

TENANTS = ("desk", "lobby", "outage")
_SALT = {"desk": 11, "lobby": 23, "outage": 37}  # the reviewer's, per family


@dataclass(frozen=True, slots=True)
class TenantsConfig:
    """One trace of the eighth model."""

    family: str = "desk"
    duration_s: float = 1200.0
    scale: float = 1.0
    seed: int = 1

    def __post_init__(self) -> None:
        check_config(TENANTS, self.family, self.duration_s, self.scale, self.seed)


class _Rows:
    """The rows drawn, each (time to the 10 ms, its order, session, event, state)."""

    def __init__(self, end: float) -> None:
        self.end = end
        self.rows: list[tuple[float, int, str, str, str]] = []

    def emit(self, t: float, sid: str, event: str, mb: str = "") -> None:
        self.rows.append((round(t, 2), len(self.rows), sid, event, mb))

    def events(self) -> list[SessionEvent]:
        """In time order (then drawn order); what is still open closes at the last row's time."""
        rows = sorted(self.rows, key=lambda r: (r[0], r[1]))
        out = [SessionEvent(float(f"{t:.2f}"), sid, EventKind(event), int(float(mb) * MB) if mb else 0)
               for t, _, sid, event, mb in rows]
        return closed_at_end(out)


class _Session:
    """One session's rows; nothing past the trace's end is kept."""

    def __init__(self, rows: _Rows, sid: str, t_open: float, state_mb: float) -> None:
        self.rows, self.sid = rows, sid
        self.t = max(0.0, t_open)
        self.closed = self.t >= rows.end
        self.executing = True
        if not self.closed:
            rows.emit(self.t, sid, "open", f"{state_mb:.0f}")

    def _at(self, t: float) -> bool:
        t = max(t, self.t)
        if self.closed or t >= self.rows.end:
            self.closed = True
            return False
        self.t = t
        return True

    def idle(self, t: float) -> None:
        if self.executing and self._at(t):
            self.rows.emit(self.t, self.sid, "idle")
            self.executing = False

    def active(self, t: float) -> None:
        if not self.executing and self._at(t):
            self.rows.emit(self.t, self.sid, "active")
            self.executing = True

    def close(self, t: float) -> None:
        if self._at(t):
            self.rows.emit(self.t, self.sid, "close")
        self.closed = True


def _lognorm(rng: np.random.Generator, median: float, sigma: float, lo: float | None = None, hi: float | None = None) -> float:
    x = median * math.exp(sigma * rng.standard_normal())
    if lo is not None:
        x = max(lo, x)
    if hi is not None:
        x = min(hi, x)
    return x


class _Desk:
    """Seats in two (three, from 3,000 s) regions: calls, lunches, a shift change, a wind-down."""

    def __init__(self, rng: np.random.Generator, duration: float, scale: float) -> None:
        self.rng, self.D, self.f = rng, duration, duration / 1200.0  # f: the macro schedule's stretch
        self.rows = _Rows(duration)
        # seats, login window, busy hour, lunch, shift change, wind-down (fractions of the trace)
        self.regions = [
            dict(name="A", seats=int(600 * scale), login=(0.0, 0.0), busy=0.25, lunch=0.60, change=0.375, wind=0.88),
            dict(name="B", seats=int(450 * scale), login=(0.25, 0.33), busy=0.55, lunch=0.80, change=None, wind=None),
        ]
        if duration >= 3000:  # a third zone, and region B's own shift change
            self.regions.append(dict(name="C", seats=int(350 * scale), login=(0.55, 0.62), busy=0.8, lunch=0.92,
                                     change=None, wind=None))
            self.regions[1]["change"] = 0.7

    def gap_mean(self, reg: dict, t: float) -> float:
        """The idle gap between calls: 35 s at the busy hour, up to 140 s off-peak."""
        x = (t / self.D - reg["busy"]) / 0.25
        return 35.0 + 105.0 * (1 - math.exp(-x * x))

    def seat(self, reg: dict, sid: str, t_open: float, t_end_shift: float, greet: bool, lunch_t: float | None) -> None:
        rng, D = self.rng, self.D
        s = _Session(self.rows, sid, t_open, _lognorm(rng, 1800, 0.35, 300, 6000))
        t = t_open
        if greet:  # a warm-up greeting of a few seconds, then the wait for the first call
            t += rng.uniform(4, 10)
        elif rng.random() < 0.5:  # there at the start: mid-call or between calls
            t += rng.uniform(0, 45)
        s.idle(t)
        lunch_done = lunch_t is None
        while t < min(t_end_shift, D):
            nxt = t + rng.exponential(self.gap_mean(reg, t))
            if not lunch_done and nxt >= lunch_t:
                t = max(t, lunch_t) + rng.uniform(60, 110)  # idle through lunch
                lunch_done = True
                continue
            if nxt >= t_end_shift:
                break
            s.active(nxt)
            t = nxt + _lognorm(rng, 45, 0.7, 5, 600)
            s.idle(t)
            t += rng.uniform(2, 8)  # wrap-up
        if t_end_shift < D:
            s.close(max(t, t_end_shift) + rng.uniform(0, 20))

    def run(self) -> _Rows:
        rng, D, f = self.rng, self.D, self.f
        for reg in self.regions:
            lunch_groups = [reg["lunch"] * D + g * 45 * f for g in range(3)]
            change = reg["change"] * D if reg["change"] else None
            name = reg["name"]
            for i in range(reg["seats"]):
                lunch = lunch_groups[i % 3] + rng.uniform(0, 15)
                a0, a1 = reg["login"]
                t_open = rng.uniform(a0 * D, a1 * D) if a1 > a0 else 0.0
                greet = a1 > a0
                wind = reg["wind"] * D + rng.uniform(0, 0.07 * D) if reg["wind"] and rng.random() < 0.4 else D + 1
                if change is not None and t_open < change:
                    end1 = change + rng.uniform(-30, 30) * f
                    self.seat(reg, f"{name}1-{i}", t_open, end1, greet, lunch if lunch < end1 else None)
                    t2 = change + rng.uniform(-40, 20) * f  # the next shift logs in, overlapping the handover
                    self.seat(reg, f"{name}2-{i}", t2, wind, True, lunch if lunch > t2 else None)
                else:
                    self.seat(reg, f"{name}1-{i}", t_open, wind, greet, lunch)
                if rng.random() < 0.05:  # an agent's relog mid-shift: a fresh seat session
                    t_r = rng.uniform(0.1 * D, 0.95 * D)
                    self.seat(reg, f"{name}r-{i}", t_r, min(D + 1, t_r + rng.uniform(60, 300)), True, None)
        return self.rows


class _Lobby:
    """Classrooms on a bell schedule and game lobbies, each tenant's members moving together."""

    def __init__(self, rng: np.random.Generator, duration: float, scale: float) -> None:
        self.rng, self.D, self.scale = rng, duration, scale
        self.rows = _Rows(duration)
        self.tid = 0

    def tenant_state(self) -> float:
        u = self.rng.random()
        if u < 0.75:
            return 1000.0
        if u < 0.95:
            return 4000.0
        return 15000.0

    def tenant(self, kind: str, t0: float, size: int, t_end: float) -> None:
        rng = self.rng
        self.tid += 1
        tid = self.tid
        median = 600.0 if kind == "class" else self.tenant_state()
        members = []
        for m in range(size):
            join = t0 + (rng.uniform(0, 25) if kind == "class" else rng.exponential(6))
            members.append(_Session(self.rows, f"{kind[0]}{tid}-{m}", join, _lognorm(rng, median, 0.25, 50, 60000)))
        # every member opens executing (the warm-up), then they go idle together
        t = max(s.t for s in members) + rng.uniform(3, 8)
        for s in members:
            s.idle(t + rng.uniform(0, 2))
        extra = 0
        while t < t_end:
            t += _lognorm(rng, 45 if kind == "class" else 30, 0.5, 5, 300)
            if t >= t_end:
                break
            for s in members:  # activated together within 4 s; some stay idle
                if not s.closed and rng.random() < 0.92:
                    s.active(t + rng.uniform(0, 4))
            t += _lognorm(rng, 60 if kind == "class" else 120, 0.5, 10, 600)
            for s in members:
                s.idle(t + rng.uniform(0, 3))
            if kind == "lobby":  # churn between rounds: drop-outs and a few joiners
                for s in members:
                    if not s.closed and rng.random() < 0.1:
                        s.close(t + rng.uniform(0, 5))
                for _ in range(rng.binomial(max(1, size // 4), 0.3)):
                    extra += 1
                    s = _Session(self.rows, f"l{tid}-j{extra}", t + rng.uniform(0, 10), _lognorm(rng, median, 0.25, 50, 60000))
                    s.idle(s.t + rng.uniform(1, 3))
                    members.append(s)
        for s in members:
            s.close(t_end + rng.uniform(0, 8))

    def run(self) -> _Rows:
        rng, D = self.rng, self.D
        period = D / 4.0  # a bell every quarter of the trace
        per_bell = max(1, int(12 * self.scale))
        for p in range(int(math.ceil(D / period))):
            bell = p * period
            for _ in range(per_bell):
                self.tenant("class", bell + rng.uniform(0, 30), int(rng.integers(15, 36)), bell + 0.9 * period + rng.uniform(0, 20))
        # game lobbies: Poisson, the rate swinging (an evening bump in the second half), Pareto sizes
        rate0 = 0.10 * self.scale
        t = 0.0
        while t < D:
            lam = rate0 * (0.6 + 0.9 * math.exp(-(((t / D) - 0.65) / 0.18) ** 2))
            t += rng.exponential(1.0 / lam)
            if t >= D:
                break
            size = int(min(100, math.floor(2 * (1 - rng.random()) ** (-1 / 1.2))))
            rounds = rng.uniform(250, 700)
            self.tenant("lobby", t, size, t + rounds)
        return self.rows


class _Outage:
    """A steady service hit by an outage and an aftershock; dropped clients retry as new ids."""

    def __init__(self, rng: np.random.Generator, duration: float, scale: float) -> None:
        self.rng, self.D, self.scale = rng, duration, scale
        self.rows = _Rows(duration)
        t_o = rng.uniform(0.38, 0.46) * duration
        self.shocks = [(t_o, 0.80, 40.0), (t_o + 0.25 * duration, 0.40, 10.0)]  # (instant, share dropped, down for)

    def plan(self, t_open: float, returner: bool) -> tuple[list[tuple[float, float]], float]:
        """A session's active spells and end, before any outage."""
        rng = self.rng
        life = _lognorm(rng, 400, 1.0, 20, 5000)
        spells = []
        t, end = t_open, t_open + life
        while t < end:
            a = _lognorm(rng, 30 if not returner else 40, 0.6, 3, 400)
            spells.append((t, min(end, t + a)))
            t += a
            t += (200 * (1 - rng.random()) ** (-1 / 1.1)) if returner else _lognorm(rng, 40, 0.9, 2, 900)
        return spells, end

    def reconnect(self, t_drop: float, recovered: float) -> float | None:
        """Capped exponential backoff with full jitter (base 1 s, cap 30 s); None: gave up."""
        k, t = 0, t_drop
        while k < 8:
            t += self.rng.uniform(0, min(30.0, 1.0 * 2 ** k))
            if t >= recovered and self.rng.random() < 0.7:
                return t
            k += 1
        return None

    def replay(self, sid: str, t_open: float, spells: list[tuple[float, float]], end: float, mb: float,
               start_idle: bool = False, gen: int = 0, idle_after: tuple[float, float] = (0.0, 0.0)) -> None:
        """Play the spells from ``t_open``; a shock may drop the session, which reconnects as a new id."""
        rng = self.rng
        s = _Session(self.rows, sid, t_open, mb)
        if start_idle:
            s.idle(s.t + rng.uniform(*idle_after))
        events = [(t, ev) for a, b in spells for t, ev in ((a, "active"), (b, "idle"))] + [(end, "close")]
        events.sort(key=lambda e: e[0])
        first = True
        for t, ev in events:
            if t < s.t and not first:
                t = s.t
            for ts, frac, down in self.shocks:  # a shock between the last event and this one
                if s.t <= ts < t and rng.random() < frac:
                    td = ts + rng.uniform(0, 3)
                    s.close(td)
                    if td >= self.D:
                        return
                    if rng.random() < 0.9:
                        back = self.reconnect(td, ts + down)
                        if back is not None:
                            rest = [(max(a, back), b) for a, b in spells if b > back]
                            self.replay(f"{sid.split('~')[0]}~r{gen + 1}", back, rest, max(end, back + 5), mb,
                                        start_idle=not s.executing, gen=gen + 1, idle_after=(15.0, 40.0))  # re-syncs first
                    return
            if ev == "active":
                s.active(t)  # nothing when it opened executing
            elif ev == "idle":
                s.idle(t)
            else:
                s.close(t)
            first = False
            if s.closed:
                return

    def run(self) -> _Rows:
        rng, D = self.rng, self.D
        n0 = int(700 * self.scale)
        for i in range(n0):  # there at 0, mid-stream (an idle one opens idle)
            returner = rng.random() < 0.2
            spells, end = self.plan(-rng.uniform(0, 300), returner)
            spells = [(max(0.0, a), b) for a, b in spells if b > 0]
            mb = _lognorm(rng, 2000, 0.8, 100, 40000)
            if spells:
                self.replay(f"s{i}", 0.0, spells, max(end, 1.0), mb, start_idle=spells[0][0] > 0)
        rate = 1.0 * self.scale  # Poisson arrivals; one inside an outage waits and joins the storm
        t, i = 0.0, n0
        while t < D:
            t += rng.exponential(1.0 / rate)
            if t >= D:
                break
            t_arr = t
            for ts, _, down in self.shocks:
                if ts <= t_arr < ts + down:
                    t_arr = self.reconnect(t_arr, ts + down) or (ts + down + rng.uniform(0, 60))
            returner = rng.random() < 0.2
            spells, end = self.plan(t_arr, returner)
            mb = _lognorm(rng, 2000, 0.8, 100, 40000)
            self.replay(f"s{i}", t_arr, spells, end, mb)
            i += 1
        return self.rows


_FAMILY = {"desk": _Desk, "lobby": _Lobby, "outage": _Outage}


def generate_tenants(cfg: TenantsConfig) -> list[SessionEvent]:
    """Events of one trace of the eighth model, in time order (seeded, reproducible)."""
    rng = np.random.default_rng([cfg.seed, _SALT[cfg.family]])
    return _FAMILY[cfg.family](rng, cfg.duration_s, cfg.scale).run().events()
