"""What the outside reviewers' generators (``infra.sim.review``, ``infra.sim.surges``,
``infra.sim.steps``, ``infra.sim.tenants``, ``infra.sim.cohorts``) share: a thinned Poisson
process, their drawn rows made trace events, the sessions still open closed at the end, and the
check of a trace's settings."""

from __future__ import annotations

import math
from typing import Callable, Iterable

import numpy as np

from processors.lifecycle import EventKind, SessionEvent
from schemas.errors import ConfigError

from infra.sim.trace import MAX_T_S, MB

__all__ = ["Row", "poisson_arrivals", "row_events", "closed_at_end", "check_config"]

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


def closed_at_end(events: list[SessionEvent]) -> list[SessionEvent]:
    """``events`` (in time order) and a close, at the last event's time, of each session still
    open then (in the order they opened), as a trace file's reader closes them."""
    alive: dict[str, None] = {}
    for e in events:
        if e.kind is EventKind.OPEN:
            alive[e.session_id] = None
        elif e.kind is EventKind.CLOSE:
            alive.pop(e.session_id, None)
    last = events[-1].t if events else 0.0
    return events + [SessionEvent(last, sid, EventKind.CLOSE) for sid in alive]


def check_config(families: tuple[str, ...], family: str, duration_s: float, scale: float, seed: int) -> None:
    """A reviewer model's trace settings, refused in one line naming ``trace gen``: a family of
    ``families``, a duration up to a trace's longest, a finite scale above 0 (NaN fails too),
    a seed of at least 0."""
    if family not in families:
        raise ConfigError("family", f"one of {', '.join(families)}", "trace gen")
    if not (0 < duration_s <= MAX_T_S and 0 < scale < math.inf):
        raise ConfigError("family", "need duration > 0 and sessions >= 1", "trace gen")
    if seed < 0:
        raise ConfigError("seed", "must be >= 0", "trace gen")

