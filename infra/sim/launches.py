"""Trace families from a third workload model: services that launch, for judging policies
on traces neither of the other two models (``infra.sim.tracegen``, ``infra.sim.families``)
produces.

The model: the trace starts empty (a launch: no session is alive at 0, so an elastic pool
opens on its first minute's demand, see ``infra.sim.report.Runner``); arrivals Poisson at a
rate shaped per family; session lifetimes log-normal (median 6 min, sigma 1.0; exponential
with a 4 min mean for ``avatar``); a two-state Markov active/idle alternation with
exponential spells (45 s active, 30 s idle); state sizes uniform per family. Families:

- ``mmpp``: a Markov-modulated rate, switching between 2.5 and 0.6 of the mean with mean
  sojourns of 2 and 4 minutes (regime switches far larger than a boot absorbs).
- ``avatar``: sessions that never idle (a real-time avatar talks until it closes), the
  rate doubling for six minutes mid-trace.
- ``flicker``: spells of 10 s active and 5 s idle: offload and restore at every turn.
- ``ramp``: the rate rising linearly from 0 for three quarters of the trace, then no
  arrival at all (an event that fills up and ends).
- ``bigstate``: ``mmpp`` with 5-40 GB of state per session (moves and restores dear).
- ``spiky``: a steady rate plus crowds of ``crowd`` sessions within 5 s every 2.5-6.5
  minutes.

Two more families (``PROBES``, the ``probe`` split), written later to probe the burst
reserve, whose sessions never idle and live about half a minute (exponential lifetimes), so
the executing load follows the arrival rate closely:

- ``churn``: a steady rate of eight times the mean (a few hundred sessions executing, each
  for 30 s on average): the load swings only by chance.
- ``periodic``: a rate of 2.5 times the mean, swinging by 90% of itself with a period of
  150 s (two and a half boot times); sessions live 40 s on average.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from processors.lifecycle import EventKind, SessionEvent
from schemas.errors import ConfigError

from infra.sim.trace import MB

__all__ = ["LAUNCHES", "PROBES", "LaunchConfig", "generate_launch"]

LAUNCHES = ("mmpp", "avatar", "flicker", "ramp", "bigstate", "spiky")
PROBES = ("churn", "periodic")
_NEVER_IDLE = ("avatar", *PROBES)


@dataclass(frozen=True, slots=True)
class LaunchConfig:
    """One launch trace: about ``sessions`` arrivals over ``duration_s`` at the mean rate."""

    family: str = "mmpp"
    duration_s: float = 1200.0
    sessions: int = 1600
    seed: int = 0
    crowd: int = 60

    def __post_init__(self) -> None:
        if self.family not in LAUNCHES + PROBES:
            raise ConfigError("family", f"one of {', '.join(LAUNCHES + PROBES)}", "trace gen")
        if self.duration_s <= 0 or self.sessions < 1 or self.crowd < 0:
            raise ConfigError("family", "need duration > 0, sessions >= 1, crowd >= 0", "trace gen")


def _arrivals(cfg: LaunchConfig, rng: np.random.Generator) -> np.ndarray:
    mean, end = cfg.sessions / cfg.duration_s, cfg.duration_s
    if cfg.family in ("mmpp", "bigstate"):  # piecewise-constant rate, exponential sojourns
        times, t, high = [], 0.0, False
        while t < end:
            stay = float(rng.exponential(120.0 if high else 240.0))
            span = min(stay, end - t)
            times.append(t + np.sort(rng.uniform(0.0, span, rng.poisson(mean * (2.5 if high else 0.6) * span))))
            t, high = t + stay, not high
        return np.sort(np.concatenate(times))
    if cfg.family == "ramp":  # density rising linearly to 0.75 of the trace, then nothing
        stop = 0.75 * end
        return np.sort(stop * np.sqrt(rng.uniform(0.0, 1.0, rng.poisson(mean * end))))
    if cfg.family == "churn":
        return np.sort(rng.uniform(0.0, end, rng.poisson(8.0 * mean * end)))
    if cfg.family == "periodic":  # thinned from the top rate, 2.5 x 1.9 of the mean
        top = 2.5 * 1.9 * mean
        t = rng.uniform(0.0, end, rng.poisson(top * end))
        keep = rng.uniform(0.0, 1.9, t.size) < 1.0 + 0.9 * np.sin(2.0 * np.pi * t / 150.0)
        return np.sort(t[keep])
    n = rng.poisson(mean * end)
    base = rng.uniform(0.0, end, n)
    if cfg.family == "avatar":  # doubled from 40% to 70% of the trace
        lo, hi = 0.4 * end, 0.7 * end
        base = np.concatenate([base, rng.uniform(lo, hi, rng.poisson(mean * (hi - lo)))])
    if cfg.family == "spiky":
        crowds, c = [], float(rng.uniform(60.0, 200.0))
        while c < end:
            crowds.append(c + rng.uniform(0.0, 5.0, cfg.crowd))
            c += float(rng.uniform(150.0, 400.0))
        base = np.concatenate([base, *crowds])
    return np.sort(base[base < end])


def generate_launch(cfg: LaunchConfig) -> list[SessionEvent]:
    """Events of one launch trace, sorted by time (ids ``m000001``...)."""
    rng = np.random.default_rng([cfg.seed, (LAUNCHES + PROBES).index(cfg.family), 3])
    arrivals = _arrivals(cfg, rng)
    n = arrivals.size
    mean_life = {"avatar": 240.0, "churn": 30.0, "periodic": 40.0}.get(cfg.family)
    lives = rng.exponential(mean_life, n) if mean_life is not None else rng.lognormal(math.log(360.0), 1.0, n)
    lo_mb, hi_mb = (5000.0, 40000.0) if cfg.family == "bigstate" else (500.0, 8000.0)
    sizes = rng.uniform(lo_mb, hi_mb, n)
    active_s, idle_s = (10.0, 5.0) if cfg.family == "flicker" else (45.0, 30.0)
    rows: list[tuple[float, int, str, EventKind, int]] = []
    for i in range(n):
        sid, t = f"m{i + 1:06d}", float(arrivals[i])
        end = min(t + float(lives[i]), cfg.duration_s)
        rows.append((t, 0, sid, EventKind.OPEN, int(sizes[i] * MB)))
        while cfg.family not in _NEVER_IDLE:
            t += float(rng.exponential(active_s))
            if t >= end:
                break
            rows.append((t, 1, sid, EventKind.IDLE, 0))
            t += float(rng.exponential(idle_s))
            if t >= end:
                break
            rows.append((t, 1, sid, EventKind.ACTIVE, 0))
        rows.append((end, 2, sid, EventKind.CLOSE, 0))
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    return [SessionEvent(round(t, 3), sid, kind, size) for t, _, sid, kind, size in rows]
