"""A small plug-in policy: hold the executing sessions at a target utilization of the pool's
slots, place waiting sessions on the least-loaded ready GPU, and shrink only by GPUs that
hold nothing (so nothing has to migrate). Run it beside the built-ins:

    PYTHONPATH=. chunkserve simulate TRACE --policy all --policy examples.policies.target_util:TargetUtil

It is offered the built-ins' options and takes those its constructor names (``model``,
``gpu_type``); ``infra/sim/peers.py`` is a larger one (TeleFuser's scheduler, with
migrations and drains).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from processors.decisions import Admit, Boot, Command, Decision, Place, Restore, Retire, Vacate
from processors.detector import Signal
from processors.latency import LatencyModel, load_profiles
from processors.lifecycle import SessionState
from processors.snapshot import GpuState, Snapshot


@dataclass(frozen=True, slots=True)
class Last:
    """When the pool was last resized (the state kept between decisions)."""

    scaled_at: float = -math.inf


@dataclass(frozen=True)
class TargetUtil:
    model: LatencyModel = field(default_factory=lambda: load_profiles("paper"))
    gpu_type: str = "b300"
    u_target: float = 0.7
    dwell_s: float = 30.0
    name: str = "target-util"

    def initial_state(self) -> Last:
        return Last()

    def decide(self, snapshot: Snapshot, signal: Signal | None, state: Last) -> Decision:
        k = self.model[self.gpu_type].capacity
        ready = [g for g in snapshot.gpus if g.state is GpuState.READY]
        booting = [g for g in snapshot.gpus if g.state is GpuState.BOOTING]
        resident, loads = snapshot.resident(), snapshot.loads()
        want = max(1, math.ceil(snapshot.active_count() / (self.u_target * k)))
        have = len(ready) + len(booting)
        cmds: list[Command] = []
        if want > have:
            cmds.append(Boot(want - have, self.gpu_type))
            state = Last(snapshot.now)
        elif want < have and snapshot.now - state.scaled_at >= self.dwell_s:
            empty = [g for g in ready if resident[g.id] == 0][: have - want]
            cmds += [Vacate(g.id) for g in empty]  # a drained GPU that holds nothing retires next round
            ready = [g for g in ready if g not in empty]
            state = Last(snapshot.now) if empty else state
        cmds += [Retire(g.id) for g in snapshot.gpus if g.state is GpuState.DRAINING and resident[g.id] == 0]
        n = {g.id: loads[g.id] for g in ready}
        for s in snapshot.sessions:  # waiting for a GPU: the least-loaded ready one
            if s.lifecycle is SessionState.EXECUTION and s.gpu_id is None and n:
                g = min(n, key=lambda x: (n[x], x))
                cmds.append(Restore(s.id, g) if s.restore else Place(s.id, g))
                n[g] += 1
        order: list[tuple[str, int]] = []  # where the next arrivals go before the next decision:
        for _ in range(64):  # each to the least-loaded GPU, as (GPU, while it holds fewer than)
            g = min(n, key=lambda x: (n[x], x)) if n else None
            if g is None or n[g] >= k:
                break
            n[g] += 1
            order.append((g, n[g]))
        return Decision(tuple(cmds) + ((Admit(tuple(order)),) if order else ()), state)
