"""Oracles: exhaustive placement for small instances; offline autoscaling with future demand.

Exhaustive placement minimises L + eta * sum(kappa of migrated sessions) over every
feasible placement (move budget and transient limit included). Sessions on one GPU differ
only by kappa, so a placement's best cost is fixed by its per-GPU counts (the cheapest
sessions leave a GPU that shrinks, which also loosens the transient limit; waiting sessions
are free to go anywhere): the search enumerates count vectors exactly, with
branch-and-bound, rather than the M**N assignments.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from processors.autoscaler import AutoscalerConfig, resize, shutdowns
from processors.decisions import Decision, Migrate
from processors.detector import Signal
from processors.latency import LatencyModel, load_profiles
from processors.lifecycle import SessionEvent, SessionState, transition
from processors.placement import PlacementPlan, RebalanceConfig, plan_placement
from processors.snapshot import GpuState, Snapshot
from processors.turboserve import TURBOSERVE_REBALANCE, apply_drains

__all__ = [
    "OracleResult",
    "exhaustive_placement",
    "plan_objective",
    "future_active",
    "oracle_need",
    "OracleAutoscale",
]


@dataclass(frozen=True, slots=True)
class OracleResult:
    """Best objective L + eta * migration cost, its parts, and the per-GPU counts."""

    objective: float
    worst: float
    migration_s: float
    loads: dict[str, int]


def _lands(moved: list[float], slots: list[tuple[float, float]], config: RebalanceConfig) -> bool:
    """Whether the moved sessions (kappas) can land on the receiving positions, each position
    given as (l(n - 1), l(n)): the largest kappa takes the fastest position, and so on."""
    if config.max_transient_s == math.inf:
        return True
    slots = sorted(slots, key=lambda ab: ab[0] + ab[1])
    moved = sorted(moved, reverse=True)
    return all(config.within(config.transient(k, a, b)) for k, (a, b) in zip(moved, slots))


def _kappas(snapshot: Snapshot, gpus: list[Any], config: RebalanceConfig) -> tuple[list[list[float]], int]:
    """Each GPU's executing sessions' migration costs, ascending, and how many executing
    sessions wait for a GPU."""
    index = {g.id: i for i, g in enumerate(gpus)}
    kappas: list[list[float]] = [[] for _ in gpus]
    free = 0
    for s in snapshot.sessions:
        if s.lifecycle is not SessionState.EXECUTION:
            continue
        i = index.get(s.gpu_id) if s.gpu_id is not None else None
        if i is None:
            free += 1
        else:
            kappas[i].append(config.kappa(s.state_bytes))
    for ks in kappas:
        ks.sort()
    return kappas, free


def exhaustive_placement(snapshot: Snapshot, model: LatencyModel, config: RebalanceConfig = RebalanceConfig()) -> OracleResult:
    """Exact minimum of L + eta * sum(kappa) over placements (small instances only).

    It enforces what the controller enforces: at most ``max_moves`` migrations, and the
    transient limit on each move (its kappa + l(n - 1) + l(n) at the position n it lands
    on, the round's moves onto a GPU landing before its new sessions). A GPU either sends
    or receives, which per-GPU counts model by construction.
    """
    gpus = sorted(snapshot.gpus, key=lambda g: g.id)
    kappas, free = _kappas(snapshot, gpus, config)
    prefix = [[0.0, *itertools.accumulate(ks)] for ks in kappas]
    have = [len(k) for k in kappas]
    profiles = [model[g.type] for g in gpus]
    usable = [g.state is GpuState.READY for g in gpus]
    hi = [max(p.capacity, h) if u else h for p, h, u in zip(profiles, have, usable)]
    room = sum(max(0, p.capacity - h) for p, h, u in zip(profiles, have, usable) if u)
    total = sum(have) + min(free, room)  # waiting sessions beyond free capacity stay waiting
    suffix = [0] * (len(gpus) + 1)
    for i in range(len(gpus) - 1, -1, -1):
        suffix[i] = suffix[i + 1] + hi[i]
    eta = config.eta
    best = [math.inf, math.inf, 0.0, ()]
    counts = [0] * len(gpus)

    def feasible() -> bool:
        moved: list[float] = []
        slots: list[tuple[float, float]] = []
        for i, c in enumerate(counts):
            moved.extend(kappas[i][: max(0, have[i] - c)])
            slots.extend((profiles[i].latency(n - 1), profiles[i].latency(n)) for n in range(have[i] + 1, c + 1))
        return _lands(moved, slots, config)

    def dfs(i: int, left: int, worst: float, cost: float, moves: int) -> None:
        if max(worst, 0.0) + eta * cost >= best[0] - 1e-15 or moves > config.max_moves:
            return
        if i == len(gpus):
            if left == 0 and feasible():
                best[:] = [worst + eta * cost, worst, cost, tuple(counts)]
            return
        if suffix[i] < left:
            return
        for c in range(min(hi[i], left), -1, -1):
            out = have[i] - c
            counts[i] = c
            dfs(i + 1, left - c, max(worst, profiles[i].latency(c)), cost + (prefix[i][out] if out > 0 else 0.0), moves + max(0, out))
        counts[i] = 0

    dfs(0, total, 0.0, 0.0, 0)
    return OracleResult(best[0], best[1], best[2], {g.id: c for g, c in zip(gpus, best[3])})


def plan_objective(plan: PlacementPlan, config: RebalanceConfig = RebalanceConfig()) -> float:
    """The oracle's objective evaluated on a placement plan: L after + eta * sum(kappa)."""
    cost = sum(c.cost_s for c in plan.commands if isinstance(c, Migrate))
    return plan.worst_after + config.eta * cost


def future_active(events: Iterable[SessionEvent], window_s: float) -> tuple[int, ...]:
    """Peak executing sessions per window [k * window_s, (k + 1) * window_s), from events."""
    states: dict[str, SessionState] = {}
    peaks: list[int] = []
    active = 0
    for ev in events:
        k = int(ev.t // window_s)
        while len(peaks) <= k:
            peaks.append(active)
        old = states.get(ev.session_id)
        new, _ = transition(old, ev.kind)
        states[ev.session_id] = new
        active += (new is SessionState.EXECUTION) - (old is SessionState.EXECUTION)
        peaks[k] = max(peaks[k], active)
    return tuple(peaks)


def oracle_need(future: Sequence[int], window_s: float, now: float, lookahead_s: float) -> int:
    """Peak executing sessions over the windows that overlap [now, now + lookahead_s]."""
    lo = int(now // window_s)
    hi = int((now + lookahead_s) // window_s)
    seen = [future[k] for k in range(max(0, lo), min(hi, len(future) - 1) + 1)]
    return max(seen, default=0)


@dataclass(frozen=True)
class OracleAutoscale:
    """Offline autoscaling that knows future demand; TurboServe placement underneath.

    It grows the pool for the peak of the windows it cannot boot ahead of (now .. now +
    boot_s) and shrinks it only to the peak of now .. now + boot_s + ``hold_s`` (default
    boot_s: a GPU needed again within a boot time is cheaper kept than rebooted), at
    ``u_target`` (1.0: full capacity K, which meets the deadline), with no dwell.
    """

    future: tuple[int, ...]
    window_s: float = 30.0
    model: LatencyModel = field(default_factory=lambda: load_profiles("paper"))
    rebalance: RebalanceConfig = TURBOSERVE_REBALANCE
    autoscaler: AutoscalerConfig = AutoscalerConfig()
    u_target: float = 1.0
    hold_s: float | None = None
    name: str = "oracle-autoscale"

    def initial_state(self) -> None:
        return None

    def decide(self, snapshot: Snapshot, signal: Signal | None, state: None) -> Decision:
        boot, now, active = self.autoscaler.boot_s, snapshot.now, snapshot.active_count()
        hold = boot if self.hold_s is None else self.hold_s
        grow = max(oracle_need(self.future, self.window_s, now, boot), active) / self.u_target
        scale = resize(snapshot, self.model, grow, self.autoscaler, grow=True)
        if not scale:
            keep = max(oracle_need(self.future, self.window_s, now, boot + hold), active) / self.u_target
            scale = resize(snapshot, self.model, keep, self.autoscaler, grow=False)
        view = apply_drains(snapshot, scale)
        plan = plan_placement(view, self.model, self.rebalance)
        return Decision(scale + plan.commands + shutdowns(view), None)
