"""Decision inputs: a frozen snapshot of the cluster at ``now``."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from enum import Enum

from processors.lifecycle import Session, SessionEvent, SessionState

__all__ = ["GpuState", "Gpu", "Session", "ChunkStats", "Snapshot"]


class GpuState(str, Enum):
    """A GPU is usable only when READY; DRAINING GPUs are being emptied for shutdown."""

    BOOTING = "booting"
    READY = "ready"
    DRAINING = "draining"


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU (worker) of the pool; ``type`` names its latency profile. An ``external``
    one was started outside chunkserve: it serves sessions, but no decision drains or
    shuts it down (that is for whoever started it)."""

    id: str
    type: str
    state: GpuState = GpuState.READY
    external: bool = False


@dataclass(frozen=True, slots=True)
class ChunkStats:
    """Chunks finished since the previous decision: how many, how many past their
    deadline, and the worst per-chunk latency (measured, not predicted); ``deadline_s``
    the deadline they were judged against (the shortest, where workers differ; 0: none
    known)."""

    count: int = 0
    missed: int = 0
    worst_s: float = 0.0
    deadline_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The cluster as one decision sees it. ``now`` is passed in, never read from a clock.

    ``events`` are the session events folded since the previous decision and ``chunks``
    the chunk latencies measured since then (empty where the caller has none).
    """

    now: float
    gpus: tuple[Gpu, ...]
    sessions: tuple[Session, ...]
    events: tuple[SessionEvent, ...] = ()
    chunks: ChunkStats = ChunkStats()

    def active_count(self) -> int:
        """Sessions in EXECUTION (placed or waiting for a GPU)."""
        execution = SessionState.EXECUTION
        return len([s for s in self.sessions if s.lifecycle is execution])

    def resident(self) -> dict[str, int]:
        """Sessions whose state is on each GPU (executing or idle-resident), per GPU id."""
        ended = SessionState.TERMINATED
        return self._per_gpu(Counter([s.gpu_id for s in self.sessions if s.lifecycle is not ended]))

    def loads(self) -> dict[str, int]:
        """Executing sessions per GPU id (every GPU of the snapshot is a key)."""
        execution = SessionState.EXECUTION
        return self._per_gpu(Counter([s.gpu_id for s in self.sessions if s.lifecycle is execution]))

    def _per_gpu(self, on: Counter[str | None]) -> dict[str, int]:
        """``on``'s count for every GPU of the snapshot (this runs over every session at every
        decision: the counts come from a list comprehension, twice as fast as a chain of
        ``map`` and ``compress``)."""
        return {g.id: on[g.id] for g in self.gpus}
