"""Decision inputs: a frozen snapshot of the cluster at ``now``."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from processors.lifecycle import SessionEvent, SessionState

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
class Session:
    """One session: its state size, lifecycle state and GPU (None when not on one).

    ``restore`` marks an executing session whose state must be restored when placed. A
    suspended session with a ``gpu_id`` is idle but still resident there (its state holds
    memory and a slot). ``since`` is when its lifecycle state last changed (idle age).
    """

    id: str
    state_bytes: int = 0
    lifecycle: SessionState = SessionState.EXECUTION
    gpu_id: str | None = None
    restore: bool = False
    since: float = 0.0


@dataclass(frozen=True, slots=True)
class ChunkStats:
    """Chunks finished since the previous decision: how many, how many past their
    deadline, and the worst per-chunk latency (measured, not predicted)."""

    count: int = 0
    missed: int = 0
    worst_s: float = 0.0


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
        return sum(1 for s in self.sessions if s.lifecycle is SessionState.EXECUTION)

    def resident(self) -> dict[str, int]:
        """Sessions whose state is on each GPU (executing or idle-resident), per GPU id."""
        out = {g.id: 0 for g in self.gpus}
        for s in self.sessions:
            if s.gpu_id in out and s.lifecycle is not SessionState.TERMINATED:
                out[s.gpu_id] += 1  # type: ignore[index]
        return out

    def loads(self) -> dict[str, int]:
        """Executing sessions per GPU id (every GPU of the snapshot is a key)."""
        out = {g.id: 0 for g in self.gpus}
        for s in self.sessions:
            if s.gpu_id is not None and s.lifecycle is SessionState.EXECUTION and s.gpu_id in out:
                out[s.gpu_id] += 1
        return out
