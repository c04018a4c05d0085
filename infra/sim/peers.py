"""Peer schedulers ported as plug-in policies, compared through the same simulator.

``TeleFuser``: the closed-loop cluster scheduler of TeleFuser's TurboServe port (its
``TurboServeClusterScheduler``), in this project's terms. Worker budget
max(ceil(A / K), ceil(A / (u K))) at target utilization u = 0.75 (A executing sessions);
scale out at once; scale in only after the same smaller budget has held for 5 s; waiting
sessions and those on drained GPUs go to the least-loaded GPU with room; then at most 3
rebalance moves per decision off the bottleneck GPU, each gaining more than 40 ms after a
0.01-weighted transfer cost. Idle sessions are offloaded; no volatility table.

``KubernetesHPA``: the Horizontal Pod Autoscaler's algorithm with its defaults, GPUs for pods
and the executing sessions' share of the pool's slots for the metric: every 15 s (its sync
period) desired = ceil(current x utilization / target), left alone within a 0.1 tolerance,
growth at most max(4, current) a period, and a smaller size taken only as the largest
recommendation of the last 300 s (its scale-down stabilization window). Sessions are placed as
TeleFuser places them, with no rebalance moves (pods are not moved). The target is no default
of Kubernetes: 0.6, the one an outside engineer chose porting it from the docs alone.

``RayServe``: Ray Serve's default autoscaling policy (``replica_queue_length_autoscaling_policy``
with its delay logic), GPUs for replicas and executing sessions for ongoing requests: the
executing sessions averaged over the last 30 s (``look_back_period_s``), desired =
ceil(average / (target K)), taken once the desired size has stayed above the pool's for 30 s
(``upscale_delay_s``) or below it for 600 s (``downscale_delay_s``), the counter starting
again whenever it meets the pool's size or turns; an empty pool opens at once. Its target is
the HPA port's, 0.6 of the slots, so that the two rules meet at one target; ``RayServeAuto``
takes Ray's own pairing for ``num_replicas="auto"``, 2 target ongoing requests of at most 5 a
replica: 0.4. Sessions are placed as the HPA's are, with no rebalance moves.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field, replace
from operator import itemgetter
from typing import Any

from processors.autoscaler import shutdowns
from processors.decisions import Command, Decision, Vacate, Migrate, Place, Restore, Boot
from processors.detector import Signal
from processors.latency import LatencyModel, load_profiles
from processors.lifecycle import SessionState
from processors.snapshot import GpuState, Snapshot
from processors.turboserve import apply_drains

__all__ = ["TeleFuser", "TeleFuserState", "KubernetesHPA", "HpaState", "RayServe", "RayServeAuto", "RayServeState"]


@dataclass(frozen=True, slots=True)
class TeleFuserState:
    """The smaller budget waiting out its hold, and since when it is due (None: none)."""

    scale_in_to: int | None = None
    due_at: float | None = None


@dataclass(frozen=True)
class TeleFuser:
    """TeleFuser's 0.75-target scheduler (see the module docstring)."""

    model: LatencyModel = field(default_factory=lambda: load_profiles("paper"))
    gpu_type: str = "b300"
    target_utilization: float = 0.75
    scale_in_hold_s: float = 5.0
    max_moves: int = 3
    eta: float = 0.01
    min_gain_s: float = 0.040
    alpha_s: float = 0.02
    beta_s_per_byte: float = 1.0 / 25e9
    min_gpus: int = 1
    max_gpus: int = 1024
    name: str = "telefuser"

    def initial_state(self) -> TeleFuserState:
        return TeleFuserState()

    def sized(self, load: float) -> int:
        """GPUs for ``load`` executing sessions at the target utilization, within the pool's bounds."""
        k = self.model[self.gpu_type].capacity
        return min(self.max_gpus, max(self.min_gpus, math.ceil(load / (k * self.target_utilization) - 1e-9)))

    def budget(self, active: int) -> int:
        k = self.model[self.gpu_type].capacity
        if active <= 0:
            return self.min_gpus
        need = max(math.ceil(active / k), math.ceil(active / (k * self.target_utilization) - 1e-9))
        return min(self.max_gpus, max(self.min_gpus, need))

    def decide(self, snapshot: Snapshot, signal: Signal | None, state: TeleFuserState) -> Decision:
        pool = [g for g in snapshot.gpus if g.state is not GpuState.DRAINING]
        target = self.budget(snapshot.active_count())
        scale: tuple[Command, ...] = ()
        if target > len(pool):
            scale, state = self._resize(snapshot, pool, target), TeleFuserState()
        elif target < len(pool):
            if state.scale_in_to != target or state.due_at is None:
                state = TeleFuserState(target, snapshot.now + self.scale_in_hold_s)
            if snapshot.now >= state.due_at:  # type: ignore[operator]
                scale, state = self._resize(snapshot, pool, target), TeleFuserState()
        else:
            state = TeleFuserState()
        return self._decision(snapshot, scale, state)

    def _resize(self, snapshot: Snapshot, pool: list, target: int) -> tuple[Command, ...]:
        """The pool (its GPUs not draining) brought to ``target``: the boots, or the drains of
        the GPUs still booting first, then of those with the fewest resident sessions."""
        if target >= len(pool):
            return (Boot(target - len(pool), self.gpu_type),) if target > len(pool) else ()
        loads = snapshot.resident()
        cut = sorted(pool, key=lambda g: (g.state is GpuState.READY, loads[g.id], g.id))[: len(pool) - target]
        return tuple(Vacate(g.id) for g in cut)

    def _decision(self, snapshot: Snapshot, scale: tuple[Command, ...], state: Any) -> Decision:
        """``scale``, then the sessions placed and moved on the pool it leaves, and the
        retirements of drained GPUs left empty."""
        view = apply_drains(snapshot, scale)
        moves = self._place(view)
        return Decision(scale + moves + shutdowns(_after(view, moves)), state)

    def _place(self, view: Snapshot) -> tuple[Command, ...]:
        """Waiting and drained-GPU sessions to the least-loaded GPU with room, then rebalance."""
        ready = {g.id: self.model[g.type] for g in view.gpus if g.state is GpuState.READY}
        draining = {g.id for g in view.gpus if g.state is GpuState.DRAINING}
        on: dict[str, list] = {g: [] for g in ready}
        out: list[Command] = []
        homeless = []
        for s in view.sessions:
            if s.lifecycle is not SessionState.EXECUTION:
                continue
            if s.gpu_id in on:
                on[s.gpu_id].append(s)
            elif s.gpu_id is None or s.gpu_id in draining:
                homeless.append(s)
        for s in sorted(homeless, key=lambda s: s.id):
            room = [g for g in on if len(on[g]) < ready[g].capacity]
            if not room:
                break
            g = min(room, key=lambda g: (len(on[g]), g))
            on[g].append(s)
            if s.gpu_id is None:
                out.append(Restore(s.id, g) if s.restore else Place(s.id, g))
            else:
                out.append(Migrate(s.id, s.gpu_id, g, 0.0, self._kappa(s.state_bytes), "drain"))
        for _ in range(self.max_moves):
            move = self._best_move(on, ready)
            if move is None:
                break
            s, src, dst, gain = move
            on[src].remove(s)
            on[dst].append(s)
            out.append(Migrate(s.id, src, dst, gain, self._kappa(s.state_bytes)))
        return tuple(out)

    def _kappa(self, state_bytes: int) -> float:
        return self.alpha_s + self.beta_s_per_byte * state_bytes

    def _best_move(self, on: dict[str, list], ready: dict) -> tuple | None:
        if len(on) < 2:
            return None
        lat = {g: ready[g].latency(len(ss)) for g, ss in on.items()}
        src = max(on, key=lambda g: (lat[g], len(on[g]), g))
        if not on[src]:
            return None
        before = lat[src]
        rest = max((v for g, v in lat.items() if g != src), default=0.0)
        best = None
        for dst, ss in on.items():
            if dst == src or len(ss) >= ready[dst].capacity:
                continue
            after = max(rest, ready[src].latency(len(on[src]) - 1), ready[dst].latency(len(ss) + 1))
            for s in on[src]:
                gain = before - after - self.eta * self._kappa(s.state_bytes)
                if gain > self.min_gain_s and (best is None or (gain, -s.state_bytes) > (best[3], -best[0].state_bytes)):
                    best = (s, src, dst, gain)
        return best


@dataclass(frozen=True, slots=True)
class HpaState:
    """The last sync and the recommendations of the stabilization window, (time, size)."""

    synced_at: float | None = None
    recommendations: tuple[tuple[float, int], ...] = ()


@dataclass(frozen=True)
class KubernetesHPA(TeleFuser):
    """The Horizontal Pod Autoscaler's rule (see the module docstring)."""

    target_utilization: float = 0.6
    tolerance: float = 0.1
    sync_s: float = 15.0
    scale_down_window_s: float = 300.0
    max_moves: int = 0
    name: str = "kubernetes-hpa"

    def initial_state(self) -> HpaState:  # type: ignore[override]
        return HpaState()

    def desired(self, current: int, active: int) -> int:
        """The rule's size for ``active`` executing sessions on ``current`` GPUs."""
        k = self.model[self.gpu_type].capacity
        if current > 0 and abs(active / (current * k) / self.target_utilization - 1.0) <= self.tolerance:
            return current
        return self.sized(active)

    def size(self, current: int, recommendations: tuple[tuple[float, int], ...]) -> int:
        """The pool's new size from the window's recommendations, this sync's last: growth at
        most max(4, current) (none from an empty pool, which opens at its size: a trace that
        starts mid-stream, as a Deployment's replicas are set), a smaller size only as the
        largest recommendation of the window."""
        desired = recommendations[-1][1]
        if desired > current:
            return desired if current == 0 else min(desired, current + max(4, current))
        return min(current, max(r for _, r in recommendations))

    def decide(self, snapshot: Snapshot, signal: Signal | None, state: HpaState) -> Decision:  # type: ignore[override]
        pool = [g for g in snapshot.gpus if g.state is not GpuState.DRAINING]
        scale: tuple[Command, ...] = ()
        if state.synced_at is None or snapshot.now >= state.synced_at + self.sync_s - 1e-9:
            recs = tuple((t, r) for t, r in state.recommendations if t > snapshot.now - self.scale_down_window_s)
            recs += ((snapshot.now, self.desired(len(pool), snapshot.active_count())),)
            scale, state = self._resize(snapshot, pool, self.size(len(pool), recs)), HpaState(snapshot.now, recs)
        return self._decision(snapshot, scale, state)


@dataclass(frozen=True, slots=True)
class RayServeState:
    """The executing sessions seen over the look-back period, (time, count), oldest first, and
    the delay counter: the way the desired size differs from the pool's (+1 above, -1 below,
    0 neither) and since when."""

    seen: tuple[tuple[float, int], ...] = ()
    direction: int = 0
    since: float | None = None


@dataclass(frozen=True)
class RayServe(TeleFuser):
    """Ray Serve's default autoscaling policy (see the module docstring)."""

    target_utilization: float = 0.6
    look_back_s: float = 30.0
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    max_moves: int = 0
    name: str = "ray-serve"

    def initial_state(self) -> RayServeState:  # type: ignore[override]
        return RayServeState()

    def decide(self, snapshot: Snapshot, signal: Signal | None, state: RayServeState) -> Decision:  # type: ignore[override]
        pool = [g for g in snapshot.gpus if g.state is not GpuState.DRAINING]
        now = snapshot.now
        seen = _look_back(state.seen, now - self.look_back_s) + ((now, snapshot.active_count()),)
        want, have = self.sized(_time_mean(seen, now - self.look_back_s)), len(pool)
        way = (want > have) - (want < have)
        since = state.since if way and way == state.direction else (now if way else None)
        scale: tuple[Command, ...] = ()
        if have == 0 or (since is not None and now - since >= (self.upscale_delay_s if way > 0 else self.downscale_delay_s)):
            scale, way, since = self._resize(snapshot, pool, want), 0, None
        return self._decision(snapshot, scale, RayServeState(seen, way, since))


@dataclass(frozen=True)
class RayServeAuto(RayServe):
    """Ray Serve's policy at the target of its own ``num_replicas="auto"``: 2 of 5, 0.4."""

    target_utilization: float = 0.4
    name: str = "ray-serve-auto"


def _look_back(seen: tuple[tuple[float, int], ...], start: float) -> tuple[tuple[float, int], ...]:
    """The readings that still count at ``start`` on: those after it and the one it falls in."""
    return seen[max(0, bisect_right(seen, start, key=itemgetter(0)) - 1):]


def _time_mean(seen: tuple[tuple[float, int], ...], start: float) -> float:
    """The time-weighted mean of the readings from ``start`` to the last (each holds until the
    next); the last reading alone when they span no time."""
    total = span = 0.0
    for (t, a), (t_next, _) in zip(seen, seen[1:]):
        width = t_next - max(t, start)
        if width > 0:
            total, span = total + a * width, span + width
    return total / span if span > 0 else float(seen[-1][1])


def _after(view: Snapshot, moves: tuple[Command, ...]) -> Snapshot:
    """The view with sessions migrated off drained GPUs counted where they go."""
    gone = {c.session_id: c.dst for c in moves if isinstance(c, Migrate)}
    if not gone:
        return view
    sessions = tuple(replace(s, gpu_id=gone[s.id]) if s.id in gone else s for s in view.sessions)
    return replace(view, sessions=sessions)
