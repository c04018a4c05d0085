"""Dispatch decisions: which workers to try for a new session, and what to send where.

Pure: the load view comes in, a ranked candidate list and commands go out. The generation
commit in Redis, not this ranking, decides admission (DESIGN.md §3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

__all__ = ["WorkerLoad", "rank_candidates", "Bucket", "take"]


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """One worker in the load view."""

    used: int
    capacity: int
    draining: bool = False
    down: bool = False  # declared dead, not heard from since

    @property
    def free(self) -> int:
        return self.capacity - self.used


def rank_candidates(view: Mapping[str, WorkerLoad], exclude: frozenset[str] = frozenset()) -> list[str]:
    """Feasible workers (registered, not draining, not down, a free slot), least loaded (by utilization, then used slots) first; ties by id."""
    feasible = [(w.used / w.capacity, w.used, wid) for wid, w in view.items()
                if wid not in exclude and not w.draining and not w.down and w.capacity > 0 and w.free > 0]
    return [wid for _, _, wid in sorted(feasible)]


@dataclass(frozen=True, slots=True)
class Bucket:
    """A token bucket: ``tokens`` left at time ``at``."""

    tokens: float
    at: float


def take(bucket: Bucket | None, now: float, rate: float, burst: float) -> tuple[Bucket, bool]:
    """Take one token (one input) if the session's bucket has one; refill at ``rate`` per second
    up to ``burst``."""
    if bucket is None:
        bucket = Bucket(burst, now)
    tokens = min(burst, bucket.tokens + max(0.0, now - bucket.at) * rate)
    if tokens >= 1.0:
        return Bucket(tokens - 1.0, now), True
    return Bucket(tokens, now), False
