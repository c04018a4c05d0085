"""Decision inputs: a frozen snapshot of the cluster at ``now``."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from processors.lifecycle import SessionState

__all__ = ["GpuState", "Gpu", "Session", "Snapshot"]


class GpuState(str, Enum):
    """A GPU is usable only when READY; DRAINING GPUs are being emptied for shutdown."""

    BOOTING = "booting"
    READY = "ready"
    DRAINING = "draining"


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU (worker) of the pool; ``type`` names its latency profile."""

    id: str
    type: str
    state: GpuState = GpuState.READY


@dataclass(frozen=True, slots=True)
class Session:
    """One session: its state size, lifecycle state and GPU (None when not on one).

    ``restore`` marks an executing session whose state must be restored when placed.
    """

    id: str
    state_bytes: int = 0
    lifecycle: SessionState = SessionState.EXECUTION
    gpu_id: str | None = None
    restore: bool = False


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The cluster as one decision sees it. ``now`` is passed in, never read from a clock."""

    now: float
    gpus: tuple[Gpu, ...]
    sessions: tuple[Session, ...]

    def active_count(self) -> int:
        """Sessions in EXECUTION (placed or waiting for a GPU)."""
        return sum(1 for s in self.sessions if s.lifecycle is SessionState.EXECUTION)

    def loads(self) -> dict[str, int]:
        """Executing sessions per GPU id (every GPU of the snapshot is a key)."""
        out = {g.id: 0 for g in self.gpus}
        for s in self.sessions:
            if s.gpu_id is not None and s.lifecycle is SessionState.EXECUTION and s.gpu_id in out:
                out[s.gpu_id] += 1
        return out
