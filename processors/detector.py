"""Workload detector: a step function over ``session-events`` with a sliding window.

``step(state, event, config) -> (state, signal)``; the faust agent and the simulator only
feed it. Volatility is the population standard deviation of newly active sessions (opens
and idle->active flips) per slot over the window's slots (zero-filled, never counting slots
before the first event seen). The level 1..10 reads that spread relative to the load: nine
ascending thresholds on its coefficient of variation (std / mean), since the autoscaler's
target is a relative utilization and a raw std grows with any load. The default thresholds
are calibrated on ``infra.sim.tracegen`` traces (1 s slots): level L reads near L.
The state is immutable: each step copies the active/idle id sets (O(sessions) per event).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass

from processors.lifecycle import EventKind, SessionEvent
from schemas.errors import ConfigError

__all__ = [
    "DetectorConfig",
    "DetectorState",
    "Signal",
    "step",
    "not_ahead",
    "observe",
    "volatility",
    "variation",
    "volatility_level",
]

# per-slot counters: (slot index, arrivals, departures, to_idle, to_active, newly_active)
_Slot = tuple[int, int, int, int, int, int]


MIN_SLOT_S = 1e-3
MAX_SLOTS = 100_000


@dataclass(frozen=True, slots=True)
class DetectorConfig:
    """Window length, slot length (seconds) and the nine level thresholds (on std / mean)."""

    window_s: float = 60.0
    slot_s: float = 1.0
    thresholds: tuple[float, ...] = (0.44, 0.55, 0.71, 0.92, 1.14, 1.36, 1.58, 1.81, 2.04)

    def __post_init__(self) -> None:
        if not (self.slot_s >= MIN_SLOT_S and self.window_s >= self.slot_s):
            raise ConfigError("window_s", f"need slot_s >= {MIN_SLOT_S:g} and window_s >= slot_s", "detector")
        if self.window_s / self.slot_s > MAX_SLOTS:  # the window is kept slot by slot
            raise ConfigError("window_s", f"at most {MAX_SLOTS} slots in the window (window_s / slot_s)", "detector")
        t = self.thresholds
        if len(t) != 9 or any(b <= a for a, b in zip(t, t[1:])):
            raise ConfigError("thresholds", "need nine strictly ascending values", "detector")

    @property
    def slots(self) -> int:
        """Number of slots in the window."""
        return max(1, math.ceil(self.window_s / self.slot_s - 1e-9))


@dataclass(frozen=True, slots=True)
class DetectorState:
    """Active and idle session ids, and per-slot counters of the current window."""

    active: frozenset[str] = frozenset()
    idle: frozenset[str] = frozenset()
    window: tuple[_Slot, ...] = ()
    first_slot: int | None = None
    last_slot: int | None = None


@dataclass(frozen=True, slots=True)
class Signal:
    """What the detector tells the controllers at ``now``."""

    now: float
    active: int
    idle: int
    arrivals: int
    departures: int
    flips: int
    volatility: float
    level: int
    variation: float = 0.0  # std / mean of newly active per slot: what ``level`` reads


def volatility(newly_active_per_slot: list[int] | tuple[int, ...]) -> float:
    """Population standard deviation of per-slot counts (0 for fewer than two slots)."""
    xs = list(newly_active_per_slot)
    if len(xs) < 2:
        return 0.0
    mean = sum(xs) / len(xs)
    return math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))


def variation(newly_active_per_slot: list[int] | tuple[int, ...]) -> float:
    """Coefficient of variation (std / mean) of per-slot counts (0 when none or one slot)."""
    xs = list(newly_active_per_slot)
    mean = sum(xs) / len(xs) if xs else 0.0
    return volatility(xs) / mean if mean > 0 else 0.0


def volatility_level(vol: float, thresholds: tuple[float, ...]) -> int:
    """Level 1 (calm) .. 10 (bursty): one plus the number of thresholds at or below ``vol``.

    ``vol`` is the measure the thresholds are set on (the signal's ``variation``)."""
    return 1 + bisect_right(thresholds, vol)


def _advance(state: DetectorState, slot: int, config: DetectorConfig) -> tuple[_Slot, ...]:
    lo = slot - config.slots + 1
    return tuple(s for s in state.window if s[0] >= lo)


def _signal(state: DetectorState, now: float, config: DetectorConfig) -> Signal:
    cur = state.last_slot if state.last_slot is not None else 0
    first = state.first_slot if state.first_slot is not None else cur
    lo = max(first, cur - config.slots + 1)
    by_slot = {s[0]: s for s in state.window if lo <= s[0] <= cur}
    counts = [by_slot[i][5] if i in by_slot else 0 for i in range(lo, cur + 1)]
    vol = volatility(counts)
    cv = variation(counts)
    rows = by_slot.values()
    return Signal(
        now=now,
        active=len(state.active),
        idle=len(state.idle),
        arrivals=sum(r[1] for r in rows),
        departures=sum(r[2] for r in rows),
        flips=sum(r[3] + r[4] for r in rows),
        volatility=vol,
        level=volatility_level(cv, config.thresholds),
        variation=cv,
    )


def observe(state: DetectorState, now: float, config: DetectorConfig) -> tuple[DetectorState, Signal]:
    """Roll the window forward to ``now`` without an event (for periodic rounds)."""
    slot = math.floor(now / config.slot_s)
    if state.last_slot is not None and slot <= state.last_slot:
        return state, _signal(state, now, config)
    first = state.first_slot if state.first_slot is not None else slot
    new = DetectorState(state.active, state.idle, _advance(state, slot, config), first, slot)
    return new, _signal(new, now, config)


FUTURE_S = 2.0  # how far ahead of the reading process's clock an event's time may count


def not_ahead(event: SessionEvent, now: float) -> SessionEvent:
    """``event`` with its time at most ``now + FUTURE_S``: a record stamped ahead (the broker
    lets a producer's time through within its skew bound, minutes) would move the window
    past every honest event, blind until the clock caught up."""
    if event.t <= now + FUTURE_S:
        return event
    return SessionEvent(now + FUTURE_S, event.session_id, event.kind, event.state_bytes)


def step(state: DetectorState, event: SessionEvent, config: DetectorConfig) -> tuple[DetectorState, Signal]:
    """Fold one session event into the window; returns the new state and the signal."""
    slot = math.floor(event.t / config.slot_s)
    cur = slot if state.last_slot is None else max(state.last_slot, slot)
    first = slot if state.first_slot is None else min(state.first_slot, slot)
    sid, kind = event.session_id, EventKind(event.kind)
    active, idle = state.active, state.idle
    arr = dep = to_idle = to_active = new_active = 0
    if kind is EventKind.OPEN and sid not in active and sid not in idle:
        active, arr, new_active = active | {sid}, 1, 1
    elif kind is EventKind.ACTIVE and sid not in active:
        if sid in idle:
            idle, to_active = idle - {sid}, 1
        else:
            arr = 1  # the open was lost or reordered: count it as an arrival
        active, new_active = active | {sid}, 1
    elif kind is EventKind.IDLE and sid in active:
        active, idle, to_idle = active - {sid}, idle | {sid}, 1
    elif kind is EventKind.CLOSE and (sid in active or sid in idle):
        active, idle, dep = active - {sid}, idle - {sid}, 1
    window = _advance(DetectorState(window=state.window), cur, config)
    if slot >= cur - config.slots + 1 and (arr or dep or to_idle or to_active):
        rows = {s[0]: s for s in window}
        old = rows.get(slot, (slot, 0, 0, 0, 0, 0))
        rows[slot] = (slot, old[1] + arr, old[2] + dep, old[3] + to_idle, old[4] + to_active, old[5] + new_active)
        window = tuple(sorted(rows.values()))
    new = DetectorState(active, idle, window, first, cur)
    return new, _signal(new, event.t, config)
