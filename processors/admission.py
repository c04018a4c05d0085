"""Where a session goes: the load view dispatch keeps (:class:`WorkerLoad`), the policy's
admission plan (:class:`AdmitPlan`) and the one rule both dispatch and the simulator admit
by (:func:`candidate`). Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

__all__ = ["WorkerLoad", "AdmitPlan", "candidate"]


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


@dataclass(frozen=True, slots=True)
class AdmitPlan:
    """The policy's placement of the sessions to come (its last round's ``Admit``, ``Place``
    and ``Resume``): ``order`` (worker, count) entries, ``pinned`` session -> worker, and
    whether a session past the order may go to the least-loaded worker (``fallback``)."""

    order: tuple[tuple[str, int], ...] = ()
    pinned: Mapping[str, str] = field(default_factory=dict)
    fallback: bool = True
    ts: float = -1e18  # when the policy made it (a plan only replaces an older one)


def candidate(plan: AdmitPlan | None, workers: Mapping[str, WorkerLoad], session_id: str,
              exclude: frozenset[str] = frozenset()) -> str | None:
    """Where to try a session next: the worker the plan pinned it to, else the first order
    entry whose worker runs fewer sessions than the entry's count, else (with ``fallback``)
    the least-loaded; never a worker full, draining, down or in ``exclude``. No plan (no
    controller heard yet): the least-loaded. None: wait. The simulator admits by the same rule."""
    def room(wid: str, below: int) -> bool:
        w = workers.get(wid)
        return (w is not None and wid not in exclude and not w.draining and not w.down
                and w.capacity > 0 and w.free > 0 and w.used < below)

    if plan is not None:
        pin = plan.pinned.get(session_id)
        if pin is not None and room(pin, 1 << 30):
            return pin
        for wid, count in plan.order:
            if room(wid, count):
                return wid
        if not plan.fallback:
            return None
    feasible = [(w.used / w.capacity, w.used, wid) for wid, w in workers.items()
                if wid not in exclude and not w.draining and not w.down and w.capacity > 0 and w.free > 0]
    return min(feasible)[2] if feasible else None
