"""What the outside reviewers' generators (``infra.sim.review``, ``infra.sim.surges``) share:
a thinned Poisson process and their drawn rows made trace events."""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from processors.lifecycle import EventKind, SessionEvent

from infra.sim.trace import MB

__all__ = ["Row", "poisson_arrivals", "row_events"]

# (time, session index, its own order, session id, event word, state MB or None)
Row = tuple[float, int, int, str, str, "float | None"]


def poisson_arrivals(rng: np.random.Generator, rate: Callable[[float], float], top: float, t0: float, t1: float) -> list[float]:
    """Arrival times in [t0, t1) of an inhomogeneous Poisson process at ``rate`` (thinning
    under ``top``, its most)."""
    out, t = [], t0
    while True:
        t += rng.exponential(1.0 / top)
        if t >= t1:
            return out
        if rng.random() < rate(t) / top:
            out.append(t)


def row_events(rows: Iterable[Row]) -> list[SessionEvent]:
    """Rows as events, sorted by (time, session, its own order), sizes to the 0.1 MB as a
    trace file keeps them."""
    return [SessionEvent(t, sid, EventKind(ev), int(float(f"{mb:.1f}") * MB) if mb is not None else 0)
            for t, _, _, sid, ev, mb in sorted(rows, key=lambda r: r[:3])]
