"""Decision inputs: a frozen snapshot of the cluster at ``now``."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from enum import Enum
from itertools import compress, repeat
from operator import attrgetter, is_, is_not
from typing import Callable

from processors.lifecycle import Session, SessionEvent, SessionState

__all__ = ["GpuState", "Gpu", "Session", "ChunkStats", "Snapshot"]

_GPU_ID, _LIFECYCLE = attrgetter("gpu_id"), attrgetter("lifecycle")


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
        return self._count(is_not, SessionState.TERMINATED)

    def loads(self) -> dict[str, int]:
        """Executing sessions per GPU id (every GPU of the snapshot is a key)."""
        return self._count(is_, SessionState.EXECUTION)

    def _count(self, test: Callable[[object, object], bool], state: SessionState) -> dict[str, int]:
        """Per GPU id, the sessions whose lifecycle passes ``test(lifecycle, state)`` (counted
        in C: this runs over every session at every decision)."""
        sessions = self.sessions
        on = Counter(compress(map(_GPU_ID, sessions), map(test, map(_LIFECYCLE, sessions), repeat(state))))
        return {g.id: on[g.id] for g in self.gpus}
