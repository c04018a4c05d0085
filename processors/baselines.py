"""Baselines: a fixed pool, placement at arrival only, never migrate.

The paper's three (``rr``, ``lag``, ``mag``) keep a session on the GPU it was placed on
from open to close: its state stays resident while idle, holding memory and one of the
GPU's K slots; no offload, no re-placement at resume. rr: round-robin over the pool; lag
(load-aware greedy): least predicted latency l_j(n_j + 1) over executing sessions; mag
(memory-aware greedy): least memory fraction after adding the session's state.

The ``-offload`` variants are stronger references: idle sessions are offloaded like
turboserve's, and a resumed session is placed again (fewest sessions / lag / mag).
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, ClassVar, Sequence

from processors.decisions import Admit, Command, Decision, Place, Restore
from processors.detector import Signal
from processors.latency import GpuProfile, LatencyModel, load_profiles
from processors.lifecycle import SessionState
from processors.placement import free_positions
from processors.snapshot import Gpu, GpuState, Session, Snapshot

__all__ = ["greedy_place", "Base", "Lag", "Mag", "RoundRobin", "PinnedLag", "PinnedMag"]


# score(profile, sessions on the GPU, state bytes on the GPU, state bytes of the newcomer)
Score = Callable[[GpuProfile, int, int, int], float]


def _fewest(p: GpuProfile, n: int, mem: int, add: int) -> float:
    return float(n)


def _latency(p: GpuProfile, n: int, mem: int, add: int) -> float:
    return p.latency(n + 1)


def _memory(p: GpuProfile, n: int, mem: int, add: int) -> float:
    return (mem + add) / p.memory_bytes


def greedy_place(snapshot: Snapshot, model: LatencyModel, score: Score, *, pinned: bool = False,
                 start: int = 0) -> tuple[tuple[Command, ...], int]:
    """Give each waiting executing session the ready GPU with the lowest score; (commands, rr cursor).

    A GPU is full at K executing sessions, or with ``pinned`` at K resident ones (idle
    sessions kept resident hold a slot and memory). ``score`` sees executing sessions and
    resident memory; the round-robin marker instead takes the next GPU with room after the
    cursor ``start``.
    """
    cmds, start, _ = _place(snapshot, model, score, pinned, start)
    return cmds, start


def _place(snapshot: Snapshot, model: LatencyModel, score: Score, pinned: bool,
           start: int) -> tuple[tuple[Command, ...], int, dict[str, int]]:
    """:func:`greedy_place`, and the executing sessions per GPU id after its commands."""
    gpus = {g.id: g for g in snapshot.gpus}
    sessions = snapshot.sessions
    # the executing sessions and their counts per GPU id (the sessions loops are the hot
    # path of a large pool: a list comprehension, and a Counter of plain ids)
    execution = SessionState.EXECUTION
    execs = [s for s in sessions if s.lifecycle is execution]
    on = Counter([s.gpu_id for s in execs])  # None: waiting for a GPU
    # pinned: a session is placed at its open and holds its slot to its close, so one that
    # opened idle (never placed, no state anywhere) is placed too, after those executing
    unplaced = [s for s in sessions if s.gpu_id is None and s.lifecycle is SessionState.SUSPENDED] if pinned else []
    if all(g in gpus for g in on) and not unplaced:
        return (), start, {g: on[g] for g in gpus}  # nobody waits
    n = {g: on[g] for g in gpus}
    if pinned:  # the idle ones resting on a GPU hold their slot too
        rest = Counter([s.gpu_id for s in sessions if s.lifecycle is not execution])
        held = {g: on[g] + rest[g] for g in gpus}
    else:
        held = dict(n)
    if score is not _fewest and score is not _latency and score is not _ROUND_ROBIN:  # the score may read memory
        mem = _resident_bytes(sessions if pinned else execs, list(gpus))
    else:
        mem = dict.fromkeys(gpus, 0)
    waiting = [s for s in execs if s.gpu_id not in gpus] + unplaced
    ready = sorted(g for g, x in gpus.items() if x.state is GpuState.READY)
    profile = {g: model[gpus[g].type] for g in ready}
    room = [g for g in ready if held[g] < profile[g].capacity]  # by id; shrinks as GPUs fill
    free = set(room)
    key = _heap_key(score, profile, n, mem, room)
    heap = [(key(x), x) for x in room] if key is not None else None
    if heap is not None:
        heapq.heapify(heap)
    out: list[Command] = []
    for s in waiting:
        if not free:
            break
        if score is _ROUND_ROBIN:
            at = next((i for i in range(len(ready)) if ready[(start + i) % len(ready)] in free))
            g = ready[(start + at) % len(ready)]
            start = (start + at + 1) % len(ready)
        elif heap is not None:
            g = heapq.heappop(heap)[1]
        else:
            g = min((score(profile[x], n[x], mem[x], s.state_bytes), x) for x in room)[1]
        n[g] += s.lifecycle is execution
        held[g] += 1
        mem[g] += s.state_bytes
        if held[g] >= profile[g].capacity:
            room.remove(g)
            free.discard(g)
        elif heap is not None:
            heapq.heappush(heap, (key(g), g))  # type: ignore[misc]
        out.append(Restore(s.id, g) if s.restore or s.gpu_id is not None else Place(s.id, g))
    return tuple(out), start, n


_ROUND_ROBIN: Score = lambda p, n, mem, add: 0.0  # noqa: E731  (a marker: cycle, do not score)


def _resident_bytes(sessions: Sequence[Session], ids: list[str]) -> dict[str, int]:
    """State bytes per GPU id of the ``sessions`` naming it."""
    total = dict.fromkeys(ids, 0)
    for s in sessions:
        if s.gpu_id in total:
            total[s.gpu_id] += s.state_bytes
    return {g: int(v) for g, v in total.items()}


def _heap_key(score: Score, profile: dict[str, GpuProfile], n: dict[str, int], mem: dict[str, int],
              room: list[str]) -> Callable[[str], float] | None:
    """A key that orders GPUs as ``score`` does for any newcomer, so a heap of (key, id)
    gives the min over the room in log time: the score itself when it reads only n; the
    resident bytes for memory when every GPU has the same memory (exact: bytes are
    integers below 2**53, so distinct sums stay distinct after the division). None: scan."""
    if score is _fewest or score is _latency:
        return lambda x: score(profile[x], n[x], 0, 0)
    if score is _memory and len({profile[x].memory_bytes for x in room}) <= 1:
        return lambda x: float(mem[x])
    return None


@dataclass(frozen=True)
class _Greedy:
    model: LatencyModel = field(default_factory=lambda: load_profiles("paper"))
    name: str = "greedy"
    score: Score = _fewest
    keep_idle_resident: ClassVar[bool] = False

    def initial_state(self) -> int:
        return 0

    def decide(self, snapshot: Snapshot, signal: Signal | None, state: int | None) -> Decision:
        cmds, cursor, loads = _place(snapshot, self.model, self.score, self.keep_idle_resident, state or 0)
        if self.score in _ORDERED and not self.keep_idle_resident:
            cmds += (Admit(free_positions(snapshot.gpus, loads, _score_keys(snapshot.gpus, self.model, self.score))),)
        return Decision(cmds, cursor)


# scores that read only a GPU's session count: their choice for the sessions to come can be
# given ahead as an admission order (a memory score needs the newcomer's state size)
_ORDERED = (_fewest, _latency)


def _score_keys(gpus: tuple[Gpu, ...], model: LatencyModel, score: Score) -> dict[str, tuple[float, ...]]:
    """Each GPU type's score at every count below its capacity (the next session's key)."""
    return {t: _type_keys(score, model[t]) for t in {g.type for g in gpus}}


@lru_cache(maxsize=256)
def _type_keys(score: Score, profile: GpuProfile) -> tuple[float, ...]:
    """``score`` at every count below ``profile``'s capacity (made once per type: profiles
    are frozen, and these scores read only the count)."""
    return tuple(score(profile, k, 0, 0) for k in range(profile.capacity))


@dataclass(frozen=True)
class Base(_Greedy):
    """Fewest sessions at arrival and at resume; idle sessions offloaded; never migrates."""

    name: str = "least-loaded-offload"
    score: Score = _fewest


@dataclass(frozen=True)
class Lag(_Greedy):
    """Load-aware greedy with offload: least predicted per-chunk latency after adding the session."""

    name: str = "lag-offload"
    score: Score = _latency


@dataclass(frozen=True)
class Mag(_Greedy):
    """Memory-aware greedy with offload: least GPU memory fraction after adding the session's state."""

    name: str = "mag-offload"
    score: Score = _memory


@dataclass(frozen=True)
class RoundRobin(_Greedy):
    """The paper's base: round-robin over the fixed pool; sessions pinned open to close."""

    name: str = "rr"
    score: Score = _ROUND_ROBIN
    keep_idle_resident: ClassVar[bool] = True


@dataclass(frozen=True)
class PinnedLag(_Greedy):
    """The paper's LAG: least current compute load at arrival; pinned open to close."""

    name: str = "lag"
    score: Score = _latency
    keep_idle_resident: ClassVar[bool] = True


@dataclass(frozen=True)
class PinnedMag(_Greedy):
    """The paper's MAG: least memory at arrival; pinned open to close."""

    name: str = "mag"
    score: Score = _memory
    keep_idle_resident: ClassVar[bool] = True
