"""The pool as the autoscaler reads and changes it: executing sessions per GPU, u_max,
and the commands that grow, drain and shut it down."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from typing import Any

from processors.decisions import Boot, Command, Reinstate, Retire, Vacate
from processors.latency import LatencyModel
from processors.lifecycle import SessionState
from processors.scaling_config import AutoscalerConfig, AutoscalerState
from processors.snapshot import Gpu, GpuState, Snapshot

__all__ = ["execution_counts", "utilization", "resize", "shutdowns", "wait_again"]

_EXEC = SessionState.EXECUTION


def execution_counts(snapshot: Snapshot) -> tuple[int, dict[str, int]]:
    """(A, executing sessions per GPU id): ``active_count()`` and ``loads()`` in one
    counting pass (the sessions loop is the hot path of a large pool)."""
    count = Counter([s.gpu_id for s in snapshot.sessions if s.lifecycle is _EXEC])  # a list comprehension: the fastest here
    return sum(count.values()), {g.id: count[g.id] for g in snapshot.gpus}


def utilization(snapshot: Snapshot, model: LatencyModel, reserve: int = 0, active: int | None = None,
                loads: dict[str, int] | None = None) -> tuple[float, int]:
    """(u_max, A): worst n_j / K_j over ready GPUs, raised to the unplaced demand's share
    (A plus ``reserve`` sessions over the ready capacity); ``active`` and ``loads`` are A
    and the per-GPU executing counts when known."""
    if loads is None:
        a, loads = execution_counts(snapshot)
        active = a if active is None else active
    elif active is None:
        active = snapshot.active_count()
    ready = [g for g in snapshot.gpus if g.state is GpuState.READY]
    cap = sum(model[g.type].capacity for g in ready)
    u = max((loads[g.id] / model[g.type].capacity for g in ready), default=0.0)
    if active + reserve:
        u = max(u, (active + reserve) / cap if cap else math.inf)
    return u, active


def shutdowns(snapshot: Snapshot) -> tuple[Retire, ...]:
    """Retire for each draining GPU no session (in any lifecycle state) still names;
    never for an external one (chunkserve cannot stop it)."""
    if not any(g.state is GpuState.DRAINING for g in snapshot.gpus):
        return ()
    held = {s.gpu_id for s in snapshot.sessions if s.gpu_id is not None and s.lifecycle is not SessionState.TERMINATED}
    return tuple(Retire(g.id) for g in sorted(snapshot.gpus, key=lambda g: g.id)
                 if g.state is GpuState.DRAINING and not g.external and g.id not in held)


def wait_again(snapshot: Snapshot, model: LatencyModel, config: AutoscalerConfig, state: AutoscalerState,
                need: float, demand: int) -> AutoscalerState:
    """After a wait whose peak drains nothing: a new wait from now at ``demand`` when the
    load now (``need`` slots) would drain a GPU, else the same one. Otherwise a pool that
    stays below the band keeps the size of the peak it first went below at, however far the
    load falls after (the demo's fall from 12 executing sessions to 4 held 3 of 4 workers)."""
    if resize(snapshot, model, need, config, grow=False):
        return replace(state, low_since=snapshot.now, low_peak=demand)
    return state


def _reinstated(snapshot: Snapshot, model: LatencyModel, short: float, room: int) -> list[Gpu]:
    """The draining GPUs a growth by ``short`` session slots takes back before it boots any
    (at most ``room``): those still holding a session, the fullest first (then by id). They
    are up and billed already; a boot serves a boot time later. An empty one may be on its way
    out (its Shutdown sent), and is left to it; so is an external one (an operator drained it)."""
    draining = [g for g in snapshot.gpus if g.state is GpuState.DRAINING and not g.external]
    if not draining:
        return []
    held = snapshot.resident()
    draining = [g for g in draining if held[g.id]]
    back: list[Gpu] = []
    for g in sorted(draining, key=lambda g: (-held[g.id], g.id)):
        if short <= 0 or len(back) >= room:
            break
        back.append(g)
        short -= model[g.type].capacity
    return back


def resize(snapshot: Snapshot, model: LatencyModel, need: float, config: AutoscalerConfig, *, grow: bool) -> tuple[Command, ...]:
    """Grow the non-draining pool to ``need`` session slots, or shrink it towards them.

    Growing counts booting GPUs as capacity (no double boot) and reinstates draining GPUs
    before it boots any (:func:`_reinstated`). Shrinking waits while any GPU
    boots, drains the least-loaded GPUs first (then the dearest per slot, then by id) and
    never drops below ``need`` slots, the executing sessions, or ``min_gpus``. External GPUs
    count as capacity but are never drained: shutting them down is not chunkserve's to do.
    """
    pool = [g for g in snapshot.gpus if g.state is not GpuState.DRAINING]
    have = sum(model[g.type].capacity for g in pool)
    if grow:
        if have >= need:
            return ()
        back = _reinstated(snapshot, model, need - have, config.max_gpus - len(pool))
        have += sum(model[g.type].capacity for g in back)
        k = model[config.gpu_type].capacity
        count = min(math.ceil((need - have) / k - 1e-9), config.max_gpus - len(pool) - len(back))
        boot = (Boot(count, config.gpu_type),) if count > 0 else ()
        return tuple(Reinstate(g.id) for g in back) + boot
    if any(g.state is GpuState.BOOTING for g in pool):
        return ()
    active, loads = execution_counts(snapshot)

    def order(g: Any) -> tuple[int, float, str]:
        p = model[g.type]
        return (loads[g.id], -p.cost_per_hour / p.capacity, g.id)

    drains: list[Command] = []
    left = len(pool)
    for g in sorted(pool, key=order):
        k = model[g.type].capacity
        if g.external or left <= config.min_gpus or have - k < need or have - k < active:
            continue
        drains.append(Vacate(g.id))
        have -= k
        left -= 1
    return tuple(drains)
