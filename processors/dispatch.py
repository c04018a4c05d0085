"""Dispatch decisions: which workers to try for a new session, and what to send where.

Pure: the load view comes in, a ranked candidate list and commands go out. The generation
commit in Redis, not this ranking, decides admission (DESIGN.md §3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

__all__ = ["WorkerLoad", "rank_candidates"]


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """One worker in the load view."""

    used: int
    capacity: int
    draining: bool = False

    @property
    def free(self) -> int:
        return self.capacity - self.used


def rank_candidates(view: Mapping[str, WorkerLoad], exclude: frozenset[str] = frozenset()) -> list[str]:
    """Feasible workers, least loaded (by utilization, then used slots) first; ties by id."""
    feasible = [(w.used / w.capacity, w.used, wid) for wid, w in view.items()
                if wid not in exclude and not w.draining and w.capacity > 0 and w.free > 0]
    return [wid for _, _, wid in sorted(feasible)]
