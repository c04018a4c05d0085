"""Where a session goes: the load view dispatch keeps (:class:`WorkerLoad`), the policy's
admission plan (:class:`AdmitPlan`) and the one rule both dispatch and the simulator admit
by (:func:`candidate`). Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

__all__ = ["WorkerLoad", "AdmitPlan", "candidate", "admit_in_turn"]


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
    if plan is not None:
        pin = plan.pinned.get(session_id)
        if pin is not None and _room(workers, pin, 1 << 30, exclude):
            return pin
        for wid, count in plan.order:
            if _room(workers, wid, count, exclude):
                return wid
        if not plan.fallback:
            return None
    return _least_loaded(workers, exclude)


def admit_in_turn(plan: AdmitPlan | None, workers: Mapping[str, WorkerLoad], session_ids: Iterable[str]) -> list[str | None]:
    """:func:`candidate` for each session in turn, each admitted where it goes (its worker's
    ``used`` one higher) before the next is asked: sessions that arrive one after another.
    The plan's order is walked once: an entry that has no room for one session has none for
    the next (``used`` only grows)."""
    load = dict(workers)
    order = plan.order if plan is not None else ()
    at = 0  # every order entry before it is without room
    out: list[str | None] = []
    for sid in session_ids:
        pin = plan.pinned.get(sid) if plan is not None else None
        if pin is not None and _room(load, pin, 1 << 30):
            best: str | None = pin
        else:
            while at < len(order) and not _room(load, *order[at]):
                at += 1
            if at < len(order):
                best = order[at][0]
            else:
                best = _least_loaded(load) if plan is None or plan.fallback else None
        if best is not None:
            w = load[best]
            load[best] = WorkerLoad(w.used + 1, w.capacity, w.draining, w.down)
        out.append(best)
    return out


def _room(workers: Mapping[str, WorkerLoad], wid: str, below: int, exclude: frozenset[str] = frozenset()) -> bool:
    """Whether worker ``wid`` takes a session as an order entry of count ``below``."""
    w = workers.get(wid)
    return (w is not None and wid not in exclude and not w.draining and not w.down
            and w.capacity > 0 and w.free > 0 and w.used < below)


def _least_loaded(workers: Mapping[str, WorkerLoad], exclude: frozenset[str] = frozenset()) -> str | None:
    feasible = [(w.used / w.capacity, w.used, wid) for wid, w in workers.items()
                if wid not in exclude and not w.draining and not w.down and w.capacity > 0 and w.free > 0]
    return min(feasible)[2] if feasible else None
