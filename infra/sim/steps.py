"""Trace families from a seventh workload model, written by a fourth outside reviewer from the
README alone and never used to choose a setting (``chunkserve evaluate --split steps``).

The model (the reviewer's, every parameter kept; its own random stream, numpy's generator):

- **Heterogeneous users.** A session is short (lifetime exponential, mean 150 s) or, with
  chance ``p_long``, long (``U(0.75, 3.0)`` times the trace's length: it usually outlives
  the trace). Each has an activity propensity ``a ~ Beta(0.6, 0.6)`` (U-shaped: many users
  nearly always active, many nearly always idle), opens active with chance ``a`` (else open
  and idle at once), and alternates Pareto spells: active ``Pareto(alpha_act)`` with scale
  ``15 (0.5 + 2a)`` s, idle ``Pareto(alpha_idle)`` with scale ``10 (0.5 + 2 (1 - a))`` s, each
  capped at twice the trace's length.
- **State** bimodal log-normal: median 800 MB (70%) or 6,000 MB, log-sigma 0.5, clipped to
  50 MB - 20 GB, given once at the open.
- **Arrivals** Poisson (thinned) at a base rate times a plateau multiplier (spans of
  ``U(180, 480)`` s, each at 0.45, 0.8, 1.2 or 1.7 times, never the previous one's) times a
  swing ``1 + A sin(2 pi t / T - pi / 2)`` over the trace's length ``T``.
- **Churn waves** at Poisson instants (mean gap ``wave_gap``): each open short session closes
  with chance ``wave_frac`` within 5 s, and 90% of those are replaced by an arrival 20-60 s
  later (arrivals that follow departures).
- The process runs from 600 s before the trace; what is open at 0 opens at 0 (idle ones
  idle at once), and what is open at the end closes there.

Families (the reviewer's variants; its seed draws on its own names, kept): ``plateau``
(plateaus; reviewer's ``plateau``), ``waves`` (churn waves every 150 s on average, 35% of
short sessions; ``churn``), ``pareto`` (heavier spells, alpha 1.15 / 1.1, 8% long, a 60%
swing; ``heavy``) and ``mixed`` (plateaus, a 30% swing and waves every 200 s, 30%; alpha
1.3 / 1.2; ``combo``). Their base rates are the reviewer's (3,000, 2,800, 2,800 and 2,200
expected arrivals in 20 minutes before the multipliers), times ``scale``.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

from processors.lifecycle import EventKind, SessionEvent

from infra.sim.draws import check_config

__all__ = ["STEPS", "StepsConfig", "generate_steps"]

STEPS = ("plateau", "waves", "pareto", "mixed")
_REVIEWER_NAME = {"plateau": "plateau", "waves": "churn", "pareto": "heavy", "mixed": "combo"}  # its seeds
_VARIANTS: Mapping[str, Mapping[str, Any]] = MappingProxyType({
    "plateau": dict(plateaus=True, swing=0.0, waves=False, alpha_act=1.5, alpha_idle=1.3, p_long=0.05, per_20min=3000),
    "waves": dict(plateaus=False, swing=0.0, waves=True, wave_gap=150.0, wave_frac=0.35, alpha_act=1.5,
                  alpha_idle=1.3, p_long=0.05, per_20min=2800),
    "pareto": dict(plateaus=False, swing=0.6, waves=False, alpha_act=1.15, alpha_idle=1.1, p_long=0.08, per_20min=2800),
    "mixed": dict(plateaus=True, swing=0.3, waves=True, wave_gap=200.0, wave_frac=0.3, alpha_act=1.3, alpha_idle=1.2,
                  p_long=0.05, per_20min=2200),
})
LEVELS = (0.45, 0.8, 1.2, 1.7)
LIFE_SHORT, XM_ACT, XM_IDLE, WARMUP = 150.0, 15.0, 10.0, 600.0
MB = 1_000_000


@dataclass(frozen=True, slots=True)
class StepsConfig:
    """One trace of the seventh model."""

    family: str = "plateau"
    duration_s: float = 1200.0
    scale: float = 1.0
    seed: int = 1

    def __post_init__(self) -> None:
        check_config(STEPS, self.family, self.duration_s, self.scale, self.seed)


class _Model:
    """The reviewer's generator: arrivals and waves first, then one event queue."""

    def __init__(self, cfg: StepsConfig) -> None:
        self.v, self.T = _VARIANTS[cfg.family], cfg.duration_s
        self.rng = np.random.default_rng([cfg.seed, sum(map(ord, _REVIEWER_NAME[cfg.family]))])
        self.base = self.v["per_20min"] / 1200.0 * cfg.scale
        self.cuts = self._plateaus()
        self.rows: list[tuple[float, int, str, str, str]] = []  # (t, order, session, event, state)
        self.info: dict[str, dict[str, Any]] = {}

    def _plateaus(self) -> list[tuple[float, float]]:
        cuts: list[tuple[float, float]] = []
        if self.v["plateaus"]:
            t, prev = -WARMUP, None
            while t < self.T:
                m = prev
                while m == prev:
                    m = float(self.rng.choice(LEVELS))
                cuts.append((t, m))
                prev = m
                t += float(self.rng.uniform(180, 480))
        return cuts

    def mult(self, t: float) -> float:
        m = 1.0
        for start, level in self.cuts:
            if start > t:
                break
            m = level
        if self.v["swing"]:
            m *= 1 + self.v["swing"] * math.sin(2 * math.pi * t / self.T - math.pi / 2)
        return m

    def instants(self) -> tuple[list[float], list[float]]:
        top = (1.7 if self.v["plateaus"] else 1.0) * (1 + self.v["swing"])
        arrivals, t = [], -WARMUP
        while True:
            t += float(self.rng.exponential(1 / (self.base * top)))
            if t >= self.T:
                break
            if self.rng.uniform() < self.mult(t) / top:
                arrivals.append(t)
        waves, t = [], -WARMUP
        while self.v["waves"]:
            t += float(self.rng.exponential(self.v["wave_gap"]))
            if t >= self.T:
                break
            waves.append(t)
        return arrivals, waves

    def spell(self, active: bool, a: float) -> float:
        alpha, xm = ((self.v["alpha_act"], XM_ACT * (0.5 + 2 * a)) if active
                     else (self.v["alpha_idle"], XM_IDLE * (0.5 + 2 * (1 - a))))
        return min(xm * (1 + self.rng.pareto(alpha)), 2 * self.T)

    def emit(self, t: float, sid: str, event: str, state: str = "") -> None:
        self.rows.append((t, len(self.rows), sid, event, state))

    def run(self) -> None:
        arrivals, waves = self.instants()
        heap: list[tuple[float, int, int, tuple[str, Any]]] = []
        for a in arrivals:
            heapq.heappush(heap, (a, 0, len(heap), ("arrive", None)))
        for w in waves:
            heapq.heappush(heap, (w, 1, len(heap), ("wave", None)))
        order, nid = len(heap) + 1, 0
        while heap:
            t, _, _, (what, arg) = heapq.heappop(heap)
            if t >= self.T:
                break
            pushed: list[tuple[float, int, tuple[str, Any]]] = []
            if what == "arrive":
                nid += 1
                pushed = self._arrive(t, f"p{nid:06d}")
            elif what == "flip":
                pushed = self._flip(t, *arg)
            elif what == "close":
                info = self.info[arg]
                if not info["closed"]:
                    info["closed"] = True
                    self.emit(t, arg, "close")
            else:
                pushed = self._wave(t)
            for at, kind, item in pushed:
                heapq.heappush(heap, (at, kind, order, item))
                order += 1

    def _arrive(self, t: float, sid: str) -> list[tuple[float, int, tuple[str, Any]]]:
        rng = self.rng
        a = float(rng.beta(0.6, 0.6))
        long_ = rng.uniform() < self.v["p_long"]
        life = max(float(rng.uniform(0.75, 3.0) * self.T) if long_ else float(rng.exponential(LIFE_SHORT)), 2.0)
        median = 800.0 if rng.uniform() < 0.7 else 6000.0
        state = float(np.clip(median * math.exp(rng.normal(0, 0.5)), 50, 20000))
        active = bool(rng.uniform() < a)
        self.info[sid] = dict(a=a, long=long_, active=active, closed=False, gen=0)
        self.emit(t, sid, "open", f"{state:.1f}")
        if not active:
            self.emit(t, sid, "idle")
        return [(t + life, 2, ("close", sid)), (t + self.spell(active, a), 3, ("flip", (sid, 0)))]

    def _flip(self, t: float, sid: str, gen: int) -> list[tuple[float, int, tuple[str, Any]]]:
        info = self.info[sid]
        if info["closed"] or gen != info["gen"]:
            return []
        info["gen"] += 1
        info["active"] = not info["active"]
        self.emit(t, sid, "active" if info["active"] else "idle")
        return [(t + self.spell(info["active"], info["a"]), 3, ("flip", (sid, info["gen"])))]

    def _wave(self, t: float) -> list[tuple[float, int, tuple[str, Any]]]:
        out: list[tuple[float, int, tuple[str, Any]]] = []
        for sid, info in list(self.info.items()):
            if info["closed"] or info["long"] or self.rng.uniform() >= self.v["wave_frac"]:
                continue
            at = t + float(self.rng.uniform(0, 5))
            out.append((at, 2, ("close", sid)))
            if self.rng.uniform() < 0.9:
                out.append((at + float(self.rng.uniform(20, 60)), 0, ("arrive", None)))
        return out

    def trace_rows(self) -> list[tuple[float, str, str, str]]:
        """The rows from 0 on: what the warm-up left open opens at 0, what is open at the end
        closes there."""
        self.rows.sort(key=lambda r: (r[0], r[1]))
        open_at_0: dict[str, list[Any]] = {}
        later: list[tuple[float, str, str, str]] = []
        for t, _, sid, event, state in self.rows:
            if t >= 0:
                later.append((t, sid, event, state))
            elif event == "open":
                open_at_0[sid] = [True, state]
            elif event in ("idle", "active"):
                open_at_0[sid][0] = event == "active"
            else:
                del open_at_0[sid]
        head = [row for sid, (active, state) in open_at_0.items()
                for row in [(0.0, sid, "open", state)] + ([] if active else [(0.0, sid, "idle", "")])]
        alive = set(open_at_0)
        for _, sid, event, _ in later:
            if event == "open":
                alive.add(sid)
            elif event == "close":
                alive.discard(sid)
        return head + later + [(self.T, sid, "close", "") for sid in sorted(alive)]


def generate_steps(cfg: StepsConfig) -> list[SessionEvent]:
    """Events of one trace of the seventh model, in the reviewer's order (time order), times
    to the millisecond and sizes to the 0.1 MB as its trace files keep them."""
    model = _Model(cfg)
    model.run()
    return [SessionEvent(float(f"{t:.3f}"), sid, EventKind(event), int(float(state) * MB) if state else 0)
            for t, sid, event, state in model.trace_rows()]
