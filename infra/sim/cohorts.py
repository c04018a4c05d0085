"""Trace families from a tenth workload model, written by a seventh outside reviewer from the
README alone and never used to choose a setting (``chunkserve evaluate --split cohorts``).

The model (the reviewer's, every parameter kept; its own random stream, numpy's generator
seeded with ``seed``, the same for both families). Sessions move in cohorts that open, idle,
wake and close together; families, 20 minutes each by default:

- ``classes`` (an online school's instructor-led workshops): classes start on a slot grid, one
  every 300 s (a compressed half hour), Poisson(7) of them per slot, a fifth of them doubles;
  each ends 20-60 s before its last slot does. A class's students (log-normal, median 38, 6 to
  220) join around its start (a quarter up to 60 s early, 60% on time within a few seconds, the
  rest late, exponential with mean 45 s) and alternate together: an opening lecture of 30-90 s,
  then labs of 60-140 s (each student active, with its own think-time pauses: exponential
  spells of mean 28 s, log-normal pauses of median 6 s) and lectures of 25-70 s (idle, a
  reaction of about 2.5 s after the switch; 12% inattentive keep generating). They close
  together within seconds of the class's end (10% drop out earlier, a tenth of the rest linger
  20-90 s). States log-normal, median 2.5 GB per class, growing 2-3% at each idle. Self-paced
  learners arrive beside them as a Poisson stream at 0.35/s (log-normal lives, median 200 s;
  exponential spells of mean 40 s, log-normal pauses of median 15 s). ``offset_s`` is the first
  slot's start: above 0 a slot that started 300 s earlier is running at 0 (the trace starts
  mid-stream); the reviewer ran 0 and 150.
- ``creators`` (creators live-streaming to audiences, a personalized stream per viewer):
  Poisson(26) creators go live at uniform times from 300 s before the trace to a minute before
  its end, each for 150-2,400 s (log-normal, median 10 minutes), with breaks of 25-90 s every
  150-400 s in which the whole audience idles with them (15% leave). A creator's audience
  (Pareto-like popularity, 8 to 600 expected) joins in a notification burst (45%, exponential,
  mean 25 s) or over the stream, and closes within seconds of the creator's end; at 35% of the
  ends the creator raids another live creator: about 30% of its expected audience opens there a
  few seconds later (log-normal, median 4 s) under new session ids. States log-normal, median
  3 GB per creator (its own session 1.5 times that).

``scale`` multiplies the classes per slot and the learners' rate, or the creators (1.0: the
reviewer's traces, 1,800-2,300 sessions in 20 minutes). Times are kept to the ms and sizes to
the MB as the reviewer's files keep them; a session still open at the end closes at the trace's
last instant, as a trace file's reader closes it. Session ids are the reviewer's:
``c{slot}-{class}-{student}`` (slot -1: the one running at 0), ``bg{n}`` (a learner),
``cr{creator}`` and ``v{creator}-{n}`` (``r`` at the end: a raid's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from processors.lifecycle import EventKind, SessionEvent
from schemas.errors import ConfigError

from infra.sim.draws import check_config, closed_at_end
from infra.sim.trace import MB

__all__ = ["COHORTS", "SLOT_S", "CohortsConfig", "generate_cohorts"]

COHORTS = ("classes", "creators")
SLOT_S = 300.0  # the classes' slot grid, the reviewer's

# a session's events as drawn: (time, event word, state MB or None)
Plan = list[tuple[float, str, Optional[float]]]


@dataclass(frozen=True, slots=True)
class CohortsConfig:
    """One trace of the tenth model (``offset_s``: the classes' first slot start, in [0, 300))."""

    family: str = "classes"
    duration_s: float = 1200.0
    scale: float = 1.0
    seed: int = 1
    offset_s: float = 0.0

    def __post_init__(self) -> None:
        check_config(COHORTS, self.family, self.duration_s, self.scale, self.seed)
        if not 0.0 <= self.offset_s < SLOT_S:  # NaN fails too
            raise ConfigError("offset", f"must be in [0, {SLOT_S:g}): the first slot starts within one slot", "trace gen")


class _Rows:
    """The rows drawn, each (time to the ms, its order, session, event, state MB or None)."""

    def __init__(self, end: float) -> None:
        self.end = end
        self.rows: list[tuple[float, int, str, str, Optional[float]]] = []

    def session(self, sid: str, plan: Plan) -> None:
        """A session's events in drawn order, none earlier than the one before; nothing past
        the trace's end, nothing after the close."""
        last = -1.0
        kept: Plan = []
        for t, event, mb in plan:
            t = max(t, last)
            if t > self.end:
                break
            kept.append((t, event, mb))
            last = t
            if event == "close":
                break
        for t, event, mb in kept:
            self.rows.append((round(t, 3), len(self.rows), sid, event, mb))

    def events(self) -> list[SessionEvent]:
        """In time order (then drawn order), sizes in whole MB; what is still open closes at the
        last row's time."""
        rows = sorted(self.rows, key=lambda r: (r[0], r[1]))
        out = [SessionEvent(float(f"{t:.3f}"), sid, EventKind(event), int(round(mb)) * MB if mb is not None else 0)
               for t, _, sid, event, mb in rows]
        return closed_at_end(out)


def _clip(x: float, lo: float, hi: float) -> float:
    return float(np.clip(x, lo, hi))


def _think(rng: np.random.Generator, t0: float, t1: float, state: list[float], grow: float, active_mean: float,
           idle_median: float) -> tuple[Plan, bool]:
    """Active from ``t0``, then alternating exponential spells and log-normal pauses (sigma 0.8)
    until ``t1``; each idle row offloads the state grown by ``grow``. The rows, and whether the
    session is active at ``t1``."""
    plan: Plan = []
    t, active = t0, True
    while True:
        t += rng.exponential(active_mean) if active else rng.lognormal(math.log(idle_median), 0.8)
        if t >= t1:
            return plan, active
        if active:
            state[0] *= grow
            plan.append((t, "idle", state[0]))
        else:
            plan.append((t, "active", None))
        active = not active


def _phases(rng: np.random.Generator, start: float, end: float) -> list[tuple[float, str]]:
    """A class's switches: an opening lecture of 30-90 s, then labs of 60-140 s and lectures of
    25-70 s until its end."""
    out = []
    t, kind = start + rng.uniform(30, 90), "lab"
    while t < end:
        out.append((t, kind))
        t += rng.uniform(60, 140) if kind == "lab" else rng.uniform(25, 70)
        kind = "lecture" if kind == "lab" else "lab"
    return out


def _student(rng: np.random.Generator, start: float, end: float, base_mb: float,
             phases: list[tuple[float, str]]) -> Plan | None:
    """One student's rows: a join around the class's start, the class's phases (a lab active,
    a lecture idle unless inattentive), a close with the class; None: joined too late."""
    u = rng.random()
    if u < 0.25:
        join = start - rng.uniform(0, 60)  # early birds
    elif u < 0.85:
        join = start + abs(rng.normal(0, 8))  # on time
    else:
        join = start + rng.exponential(45)  # late
    join = max(join, 0.0)
    if join >= end - 10:
        return None
    state = [base_mb * rng.lognormal(0, 0.15)]
    if rng.random() < 0.1:  # drops out early (at the class's end when it joined within 20 s of it)
        leave = rng.uniform(min(join + 20, end), end)
    else:
        leave = end + rng.exponential(6) if rng.random() < 0.9 else end + rng.uniform(20, 90)
    attentive = rng.random() > 0.12
    plan: Plan = [(join, "open", state[0])]
    executing = True
    timeline = [(join, "lecture")] + [(p, kind) for p, kind in phases if p > join]
    if phases and phases[0][0] <= join:  # joined mid-class: the phase in force
        timeline[0] = (join, [kind for p, kind in phases if p <= join][-1])
    for i, (p, kind) in enumerate(timeline):
        p_next = timeline[i + 1][0] if i + 1 < len(timeline) else leave
        if p >= leave:
            break
        react = p if i == 0 else p + rng.lognormal(math.log(2.5), 0.6)
        if kind == "lab" or not attentive:
            if not executing:
                plan.append((react, "active", None))
            spells, executing = _think(rng, react, min(p_next, leave), state, 1.03, 28.0, 6.0)
            plan.extend(spells)
        elif executing:
            state[0] *= 1.02
            plan.append((react if i else join + rng.uniform(1, 5), "idle", state[0]))
            executing = False
    plan.append((leave, "close", None))
    return plan


def _classes(rng: np.random.Generator, duration: float, scale: float, offset: float) -> _Rows:
    rows = _Rows(duration)
    first = -1 if offset > 0 else 0  # a slot already running at 0
    for k in range(first, int(duration // SLOT_S) + 1):
        start = offset + k * SLOT_S
        for c in range(rng.poisson(7 * scale)):
            double = rng.random() < 0.2
            end = start + (2 * SLOT_S if double else SLOT_S) - rng.uniform(20, 60)
            size = int(np.clip(rng.lognormal(math.log(38), 0.6), 6, 220))
            base_mb = _clip(rng.lognormal(math.log(2500), 0.5), 400, 12000)
            phases = _phases(rng, start, end)
            for s in range(size):
                plan = _student(rng, start, end, base_mb, phases)
                if plan is not None:
                    rows.session(f"c{k}-{c}-{s}", plan)
    rate, t, b = 0.35 * scale, 0.0, 0  # self-paced learners
    while True:
        t += rng.exponential(1 / rate)
        if t >= duration:
            return rows
        b += 1
        life = _clip(rng.lognormal(math.log(200), 0.9), 15, 2400)
        state = [_clip(rng.lognormal(math.log(1800), 0.6), 200, 10000)]
        plan: Plan = [(t, "open", state[0])]
        plan += _think(rng, t, t + life, state, 1.02, 40.0, 15.0)[0]
        plan.append((t + life, "close", None))
        rows.session(f"bg{b}", plan)


class _Creators:
    """Creators live at random times with synchronized breaks; their audiences join in a burst,
    idle with them, close with them, and sometimes follow a raid as new sessions."""

    def __init__(self, rng: np.random.Generator, duration: float, scale: float) -> None:
        self.rng, self.D = rng, duration
        self.rows = _Rows(duration)
        self.viewers = 0
        self.creators: list[dict[str, Any]] = [self.creator(i) for i in range(int(rng.poisson(26 * scale)))]

    def creator(self, i: int) -> dict[str, Any]:
        rng = self.rng
        go = rng.uniform(-300, self.D - 60)  # some live before the trace starts
        length = _clip(rng.lognormal(math.log(600), 0.5), 150, 2400)
        pop = _clip(rng.pareto(1.3) * 25 + 8, 8, 600)  # the expected audience
        breaks = []
        t = go + rng.uniform(90, 300)
        while t < go + length - 60:
            b = rng.uniform(25, 90)
            breaks.append((t, t + b))
            t += b + rng.uniform(150, 400)
        state = _clip(rng.lognormal(math.log(3000), 0.4), 800, 9000)
        return dict(i=i, go=go, end=go + length, pop=pop, breaks=breaks, state=state, raid_to=None)

    def viewer(self, c: dict[str, Any], join: float, leave: float, raid: bool = False) -> None:
        """One viewer's rows: idle through the creator's breaks (15% leave in one), a close
        within seconds of the creator's end."""
        rng = self.rng
        self.viewers += 1
        state = c["state"] * rng.lognormal(0, 0.2)
        plan: Plan = [(join, "open", state)]
        active = True
        leave = min(leave, c["end"] + rng.exponential(8))
        t = join
        for b0, b1 in c["breaks"]:
            if b1 <= join or b0 >= leave:
                continue
            if b0 > t and active:  # idle with the creator
                plan.append((b0 + rng.lognormal(math.log(1.5), 0.5), "idle", state))
                active = False
            elif b0 <= join:  # joined in a break
                plan.append((join + 0.5, "idle", state))
                active = False
            if rng.random() < 0.15:  # leaves during the break
                leave = min(leave, b0 + rng.uniform(5, b1 - b0))
                break
            back = b1 + rng.lognormal(math.log(2.0), 0.7)
            if back < leave:
                plan.append((back, "active", None))
                active = True
            t = back
        plan.sort(key=lambda e: e[0])
        plan.append((leave, "close", None))
        self.rows.session(f"v{c['i']}-{self.viewers}{'r' if raid else ''}", plan)

    def run(self) -> _Rows:
        rng = self.rng
        for c in self.creators:  # raids: some ends send part of the audience to another live creator
            if rng.random() < 0.35:
                live = [d for d in self.creators if d is not c and d["go"] < c["end"] - 5 and d["end"] > c["end"] + 120]
                if live:
                    c["raid_to"] = live[int(rng.integers(len(live)))]
        incoming: dict[int, list[tuple[float, int]]] = {c["i"]: [] for c in self.creators}  # (raid's time, raiders)
        for c in self.creators:
            mb = c["state"] * 1.5  # the creator's own session: an avatar, executing but in its breaks
            plan: Plan = [(max(c["go"], 0.0), "open", mb)]
            for b0, b1 in c["breaks"]:
                if b1 > 0:
                    plan += [(max(b0, 0.0), "idle", mb), (b1, "active", None)]
            plan.append((c["end"], "close", None))
            self.rows.session(f"cr{c['i']}", plan)
            for _ in range(rng.poisson(c["pop"])):
                if rng.random() < 0.45:
                    join = c["go"] + rng.exponential(25)  # the notification burst
                else:
                    join = c["go"] + rng.uniform(0, 1) ** 0.7 * (c["end"] - c["go"])
                watch = _clip(rng.lognormal(math.log(420), 0.9), 20, 3000)
                if join < 0:  # live before the trace: there at 0
                    if join + watch <= 0:
                        continue
                    join, watch = 0.0, join + watch
                if join >= c["end"] - 3:
                    continue
                self.viewer(c, join, join + watch)
            if c["raid_to"] is not None:  # the raiders close here (with the audience) and open there
                k = int(rng.binomial(max(1, int(c["pop"] * 0.6)), 0.5))
                incoming[c["raid_to"]["i"]].append((c["end"], k))
        for c in self.creators:
            for t_end, k in incoming[c["i"]]:
                for _ in range(k):
                    join = t_end + rng.lognormal(math.log(4), 0.5)
                    watch = _clip(rng.lognormal(math.log(200), 0.8), 10, 2000)
                    self.viewer(c, join, join + watch, raid=True)
        return self.rows


def generate_cohorts(cfg: CohortsConfig) -> list[SessionEvent]:
    """Events of one trace of the tenth model, in time order (seeded, reproducible)."""
    rng = np.random.default_rng(cfg.seed)
    if cfg.family == "classes":
        return _classes(rng, cfg.duration_s, cfg.scale, cfg.offset_s).events()
    return _Creators(rng, cfg.duration_s, cfg.scale).run().events()
