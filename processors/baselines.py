"""Baselines: fixed pool, placement at arrival (and at resume) only, never migrate.

base: fewest sessions; lag (load-aware greedy): least predicted latency l_j(n_j + 1);
mag (memory-aware greedy): least memory fraction after adding the session's state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from processors.decisions import Command, Decision, Place, Resume
from processors.detector import WorkloadSignal
from processors.latency import GpuProfile, LatencyModel, load_profiles
from processors.lifecycle import SessionState
from processors.snapshot import GpuState, Snapshot

__all__ = ["greedy_place", "Base", "Lag", "Mag"]

# score(profile, sessions on the GPU, state bytes on the GPU, state bytes of the newcomer)
Score = Callable[[GpuProfile, int, int, int], float]


def _fewest(p: GpuProfile, n: int, mem: int, add: int) -> float:
    return float(n)


def _latency(p: GpuProfile, n: int, mem: int, add: int) -> float:
    return p.latency(n + 1)


def _memory(p: GpuProfile, n: int, mem: int, add: int) -> float:
    return (mem + add) / p.memory_bytes


def greedy_place(snapshot: Snapshot, model: LatencyModel, score: Score) -> tuple[Command, ...]:
    """Give each waiting executing session the ready GPU with the lowest score (below K)."""
    gpus = {g.id: g for g in snapshot.gpus}
    n = {g: 0 for g in gpus}
    mem = {g: 0 for g in gpus}
    waiting = []
    for s in snapshot.sessions:
        if s.lifecycle is not SessionState.EXECUTION:
            continue
        if s.gpu_id in gpus:
            n[s.gpu_id] += 1
            mem[s.gpu_id] += s.state_bytes
        else:
            waiting.append(s)
    ready = sorted(g for g, x in gpus.items() if x.state is GpuState.READY)
    out: list[Command] = []
    for s in waiting:
        best = min(
            ((score(model[gpus[g].type], n[g], mem[g], s.state_bytes), g) for g in ready if n[g] < model[gpus[g].type].capacity),
            default=None,
        )
        if best is None:
            continue
        g = best[1]
        n[g] += 1
        mem[g] += s.state_bytes
        out.append(Resume(s.id, g) if s.restore or s.gpu_id is not None else Place(s.id, g))
    return tuple(out)


@dataclass(frozen=True)
class _Greedy:
    model: LatencyModel = field(default_factory=lambda: load_profiles("paper"))
    name: str = "greedy"
    score: Score = _fewest

    def initial_state(self) -> None:
        return None

    def decide(self, snapshot: Snapshot, signal: WorkloadSignal | None, state: None) -> Decision:
        return Decision(greedy_place(snapshot, self.model, self.score), None)


@dataclass(frozen=True)
class Base(_Greedy):
    """Least-loaded (fewest sessions) at arrival; fixed pool; never migrates."""

    name: str = "base"
    score: Score = _fewest


@dataclass(frozen=True)
class Lag(_Greedy):
    """Load-aware greedy: least predicted per-chunk latency after adding the session."""

    name: str = "lag"
    score: Score = _latency


@dataclass(frozen=True)
class Mag(_Greedy):
    """Memory-aware greedy: least GPU memory fraction after adding the session's state."""

    name: str = "mag"
    score: Score = _memory
