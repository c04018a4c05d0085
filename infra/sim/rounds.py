"""Trace families of an eleventh workload model: sessions in rounds, whose users go idle for a
break and come back together when the next round starts.

Written to probe the SLO mode on returns that come on a schedule (a quiz show, a match, a
lesson with breaks), a load no other model draws: most of the returns of a run come in a few
bursts, each far faster than a boot, at a pool that saw the same burst a few minutes before.

The model: ``scale`` times 600 users, one a seat, sit from the first instant (the trace starts
mid-round: every seat's session open and executing at 0). Rounds and breaks alternate, each
15% shorter or longer than its family's length, drawn per phase. Within ``jitter_s`` (10 s) of
a break's start each executing session goes idle with the family's ``idle_share``; within
``jitter_s`` of the next round's start every idle one comes back. A seat's user stays for an
exponential time (mean 15 minutes), closes, and a new user takes the seat 0-20 s later (opening
executing, as every user joins into play); sessions still open at the trace's end close there.
State sizes are log-normal (median 2 GB, sigma 0.5, within 50 MB and 20 GB). Families:

- ``quiz``: rounds of 120 s, breaks of 60 s, 55% idle through a break (a break shorter than a
  boot and a scale-in delay together).
- ``match``: rounds of 240 s, breaks of 150 s, 55% idle.
- ``lesson``: rounds of 180 s, breaks of 300 s, 70% idle (a pool may let GPUs go in a break and
  must boot them back for the next round).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from processors.lifecycle import EventKind, SessionEvent
from schemas.errors import ConfigError

from infra.sim.trace import MB

__all__ = ["ROUNDS", "RoundsConfig", "generate_rounds"]

ROUNDS = ("quiz", "match", "lesson")
# per family: (round s, break s, share of the executing sessions idle through a break)
_SHAPE = {"quiz": (120.0, 60.0, 0.55), "match": (240.0, 150.0, 0.55), "lesson": (180.0, 300.0, 0.7)}
_SEATS = 600
_STAY_S = 900.0


@dataclass(frozen=True, slots=True)
class RoundsConfig:
    """One rounds trace: ``scale`` times 600 seats over ``duration_s``."""

    family: str = "quiz"
    duration_s: float = 1200.0
    scale: float = 1.0
    seed: int = 0
    jitter_s: float = 10.0

    def __post_init__(self) -> None:
        if self.family not in ROUNDS:
            raise ConfigError("family", f"one of {', '.join(ROUNDS)}", "trace gen")
        if not (self.duration_s > 0 and self.scale > 0 and self.jitter_s >= 0 and self.seed >= 0):
            raise ConfigError("family", "need duration > 0, sessions >= 1, seed >= 0, jitter >= 0", "trace gen")


def _phases(cfg: RoundsConfig, rng: np.random.Generator) -> list[tuple[float, bool]]:
    """Each phase's start and whether it is a round, from 0 (a round) to the trace's end."""
    round_s, break_s, _ = _SHAPE[cfg.family]
    phases, t, playing = [], 0.0, True
    while t < cfg.duration_s:
        phases.append((t, playing))
        t += (round_s if playing else break_s) * float(rng.uniform(0.85, 1.15))
        playing = not playing
    return phases


def generate_rounds(cfg: RoundsConfig) -> list[SessionEvent]:
    """Events of one rounds trace, sorted by time (ids ``r000001``...)."""
    rng = np.random.default_rng([cfg.seed, ROUNDS.index(cfg.family), 11])
    phases = _phases(cfg, rng)
    idle_share = _SHAPE[cfg.family][2]
    rows: list[tuple[float, int, str, EventKind, int]] = []
    n = 0
    for _ in range(max(1, round(_SEATS * cfg.scale))):
        t = 0.0
        while t < cfg.duration_s:
            n += 1
            sid = f"r{n:06d}"
            end = min(t + float(rng.exponential(_STAY_S)), cfg.duration_s)
            mb = min(20000.0, max(50.0, float(rng.lognormal(math.log(2000.0), 0.5))))
            rows.append((t, 0, sid, EventKind.OPEN, int(round(mb, 1) * MB)))  # a trace file's 0.1 MB
            idle = False
            for start, playing in phases:
                if start <= t:
                    continue
                at = start + float(rng.uniform(0.0, cfg.jitter_s))
                if at >= end:
                    break
                if playing and idle:
                    rows.append((at, 1, sid, EventKind.ACTIVE, 0))
                    idle = False
                elif not playing and not idle and rng.uniform() < idle_share:
                    rows.append((at, 1, sid, EventKind.IDLE, 0))
                    idle = True
            rows.append((end, 2, sid, EventKind.CLOSE, 0))
            t = end + float(rng.uniform(0.0, 20.0))
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    return [SessionEvent(round(t, 3), sid, kind, size) for t, _, sid, kind, size in rows]
