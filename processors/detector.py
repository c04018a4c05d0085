"""Workload detector: a step function over ``session-events`` with a sliding window.

``step(state, event, config) -> (state, signal)``; the faust agent and the simulator only
feed it. Volatility is the population standard deviation of newly active sessions (opens
and idle->active flips) per slot over the window's slots (zero-filled, never counting slots
before the first event seen). The level 1..10 reads that spread relative to the load: nine
ascending thresholds on its coefficient of variation (std / mean), since the autoscaler's
target is a relative utilization and a raw std grows with any load. The default thresholds
are calibrated on ``infra.sim.tracegen`` traces (1 s slots): level L reads near L.
The state is immutable: each step copies the active/idle id sets (O(sessions) per event);
``rebuild`` folds a whole log to the same state in O(events), for a restarted detector, and
``signals`` gives a whole trace's signals (a simulator's) as ``step`` and ``observe`` would.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from itertools import chain
from types import MappingProxyType
from typing import Container, Iterable, Iterator, Sequence

from processors.lifecycle import REFUSED_UNKNOWN, EventKind, SessionEvent, SessionState, transition
from schemas.errors import ConfigError

__all__ = [
    "DetectorConfig",
    "DetectorState",
    "Signal",
    "step",
    "closes",
    "rebuild",
    "signals",
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


_ZERO = (0, 0, 0, 0, 0)


def _span(first: int | None, last: int | None, config: DetectorConfig) -> range:
    """The slots a signal reads: the window's up to the latest slot seen, none before the first."""
    cur = last if last is not None else 0
    return range(max(first if first is not None else cur, cur - config.slots + 1), cur + 1)


def _spread(per: list[int], config: DetectorConfig) -> tuple[float, int, float]:
    """(volatility, level, variation) of the newly active sessions per slot."""
    cv = variation(per)
    return volatility(per), volatility_level(cv, config.thresholds), cv


def _reading(now: float, active: int, idle: int, sums: Sequence[int], spread: tuple[float, int, float]) -> Signal:
    """The signal of a window whose slots hold ``sums`` arrivals, departures and flips."""
    return Signal(now=now, active=active, idle=idle, arrivals=sums[0], departures=sums[1], flips=sums[2],
                  volatility=spread[0], level=spread[1], variation=spread[2])


def _signal(state: DetectorState, now: float, config: DetectorConfig) -> Signal:
    span = _span(state.first_slot, state.last_slot, config)
    by_slot = {s[0]: s[1:] for s in state.window if s[0] in span}
    rows = [by_slot.get(i, _ZERO) for i in span]
    sums = (sum(r[0] for r in rows), sum(r[1] for r in rows), sum(r[2] + r[3] for r in rows))
    return _reading(now, len(state.active), len(state.idle), sums, _spread([r[4] for r in rows], config))


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


_Counts = tuple[int, int, int, int, int]  # arrivals, departures, to_idle, to_active, newly_active
NO_COUNTS: _Counts = (0, 0, 0, 0, 0)
# where a session is in the detector's view: executing, idle, or not open (None)
ACTIVE, IDLE, GONE = SessionState.EXECUTION, SessionState.SUSPENDED, None
_Place = SessionState | None


def _derive(where: _Place, kind: EventKind) -> tuple[_Place, _Counts]:
    """The lifecycle table's move of a session at ``where`` on ``kind`` (terminated is not
    open: ``GONE``; an event dispatch refuses for a session nobody opened moves nothing), and
    what it counts: an arrival from nowhere (an ``active`` whose open was lost or reordered
    too), a departure, a flip either way, and a session newly executing."""
    if where is GONE and kind in REFUSED_UNKNOWN:
        return where, NO_COUNTS
    nxt = transition(where, kind)[0]
    to = GONE if nxt is SessionState.TERMINATED else nxt
    if to is where:
        return where, NO_COUNTS
    return to, (int(where is GONE), int(to is GONE), int(to is IDLE), int(where is IDLE and to is ACTIVE),
                int(to is ACTIVE))


#: every (where, event) -> (where next, counts): the table's rows as the detector reads them
_MOVES = MappingProxyType({(w, k): _derive(w, k) for w in (ACTIVE, IDLE, GONE) for k in EventKind})


def _move(where: _Place, kind: EventKind) -> tuple[_Place, _Counts]:
    """Where a session at ``where`` goes on ``kind``, and what that counts (the one place the
    detector's view of a session moves; :func:`step` and :func:`rebuild` both apply it)."""
    return _MOVES[(where, kind)]


def _where(active: frozenset[str] | set[str], idle: frozenset[str] | set[str], sid: str) -> _Place:
    return ACTIVE if sid in active else IDLE if sid in idle else GONE


def closes(state: DetectorState, event: SessionEvent, closed: Container[str] = frozenset()) -> bool:
    """Whether :func:`step` of ``event`` on ``state`` closes an open session: the caller then
    remembers its id (:func:`processors.lifecycle.remember_closed`) for the next events."""
    sid = event.session_id
    where = _where(state.active, state.idle, sid)
    return sid not in closed and where is not GONE and _move(where, EventKind(event.kind))[0] is GONE


def step(state: DetectorState, event: SessionEvent, config: DetectorConfig,
         closed: Container[str] = frozenset()) -> tuple[DetectorState, Signal]:
    """Fold one session event into the window; returns the new state and the signal.
    ``closed`` (the caller's memory of closed ids, read only; :func:`closes` says when to add
    one): an event of a session in it moves nothing (dispatch refuses it)."""
    slot = math.floor(event.t / config.slot_s)
    cur = slot if state.last_slot is None else max(state.last_slot, slot)
    first = slot if state.first_slot is None else min(state.first_slot, slot)
    sid = event.session_id
    where = _where(state.active, state.idle, sid)
    to, counts = (where, NO_COUNTS) if sid in closed else _move(where, EventKind(event.kind))
    active = state.active - {sid} if where is ACTIVE and to is not ACTIVE else state.active
    idle = state.idle - {sid} if where is IDLE and to is not IDLE else state.idle
    active = active | {sid} if to is ACTIVE and where is not ACTIVE else active
    idle = idle | {sid} if to is IDLE and where is not IDLE else idle
    window = _advance(DetectorState(window=state.window), cur, config)
    if slot >= cur - config.slots + 1 and counts != NO_COUNTS:
        rows = {s[0]: s for s in window}
        old = rows.get(slot, (slot, 0, 0, 0, 0, 0))
        rows[slot] = (slot, *(a + b for a, b in zip(old[1:], counts)))  # type: ignore[assignment]
        window = tuple(sorted(rows.values()))
    new = DetectorState(active, idle, window, first, cur)
    return new, _signal(new, event.t, config)


def _fold(active: set[str], idle: set[str], counts: dict[int, list[int]], sid: str, kind: EventKind, slot: int, last: int,
          slots: int) -> tuple[_Place, _Place, _Counts]:
    """One event folded in place (``last`` the latest slot seen, this event's included):
    the session moves between the sets, its counts go to its slot while that slot is in the
    window, and slots left behind go once there are twice the window's; (from, to, counts)."""
    where = _where(active, idle, sid)
    to, moved = _move(where, kind)
    (active if where is ACTIVE else idle).discard(sid)
    if to is not GONE:
        (active if to is ACTIVE else idle).add(sid)
    if moved != NO_COUNTS and slot > last - slots:
        row = counts.setdefault(slot, [0, 0, 0, 0, 0])
        row[:] = [a + b for a, b in zip(row, moved)]
        if len(counts) > 2 * slots:
            for old in [s for s in counts if s <= last - slots]:
                del counts[old]
    return where, to, moved


def rebuild(events: Iterable[SessionEvent], config: DetectorConfig, state: DetectorState = DetectorState(),
            closed: Container[str] = frozenset()) -> tuple[DetectorState, tuple[str, ...]]:
    """The state folding ``events`` into ``state`` one by one with :func:`step` ends in (the
    caller remembering each id :func:`closes` names), in O(events + sessions + slots) rather
    than :func:`step`'s O(sessions) copy per event: a restarted detector folds its whole log
    with it. The window keeps the counts of the slots within ``config.slots`` of the latest
    slot seen, as :func:`step`'s pruning does. ``closed`` (read only) holds the ids closed
    before: their events move nothing; returned beside the state, the ids these events
    closed, in order, for the caller to remember."""
    now_closed: dict[str, None] = {}
    active, idle = set(state.active), set(state.idle)
    counts: dict[int, list[int]] = {s[0]: list(s[1:]) for s in state.window}
    first, last = state.first_slot, state.last_slot
    for event in events:
        slot = math.floor(event.t / config.slot_s)
        first = slot if first is None else min(first, slot)
        last = slot if last is None else max(last, slot)
        sid = event.session_id
        if sid in closed or sid in now_closed:
            continue
        where, to, _ = _fold(active, idle, counts, sid, EventKind(event.kind), slot, last, config.slots)
        if to is GONE and where is not GONE:
            now_closed[sid] = None
    lo = -math.inf if last is None else last - config.slots + 1
    window = tuple((s, *row) for s, row in sorted(counts.items()) if s >= lo)
    return DetectorState(frozenset(active), frozenset(idle), window, first, last), tuple(now_closed)  # type: ignore[arg-type]


def signals(events: Iterable[SessionEvent], tick_s: float, config: DetectorConfig,
            start: float | None = None) -> tuple[tuple[float, ...], tuple[Signal, ...]]:
    """(times, signals): what :func:`step` gives for each of ``events`` in turn, from an
    empty state, with an :func:`observe` every ``tick_s`` (from ``tick_s`` on) before each
    event later than the tick; the same signals, in O(events + (events + ticks) x slots)
    instead of ``step``'s O(sessions) copy per event (the simulator reads a whole trace).

    ``start`` (a trace cut mid-stream): the events at or before it are the state it starts
    in, counted in no slot, and read once at ``start``. As arrivals, a cut's first instant
    fills one slot and reads level 10 for a whole window on a calm trace
    (docs/scheduling.md, "A trace cut mid-stream")."""
    if not tick_s > 0:
        raise ConfigError("tick_s", "must be > 0", "detector signals")
    active: set[str] = set()
    idle: set[str] = set()
    counts: dict[int, list[int]] = {}  # per slot: arrivals, departures, to_idle, to_active, newly_active
    first: int | None = None
    last: int | None = None
    times: list[float] = []
    out: list[Signal] = []
    n = config.slots
    memo: dict[tuple[int, int, int], tuple[float, int, float]] = {}
    changes = 0  # newly-active counts added so far: the spread is the same while the span and this are
    sums = _SpanSums(counts)  # the span's arrivals, departures and flips, kept as it rolls

    def read(now: float) -> None:  # _signal on the state as it stands
        span = sums.roll(_span(first, last, config))
        key = (span.start, span.stop, changes)
        spread = memo.get(key)
        if spread is None:
            spread = _spread([counts.get(i, _ZERO)[4] for i in span], config)
            memo.clear()
            memo[key] = spread
        times.append(now)
        out.append(_reading(now, len(active), len(idle), sums.sums, spread))

    tick = tick_s
    if start is not None:  # the state the trace starts in, read once
        events = _state_then(events, start, active, idle, n)
        read(start)
        while tick <= start:
            tick += tick_s
    for event in events:
        while tick < event.t:  # observe: the window rolls to the tick's slot
            slot = math.floor(tick / config.slot_s)
            if last is None or slot > last:
                first = slot if first is None else first
                last = slot
            read(tick)
            tick += tick_s
        slot = math.floor(event.t / config.slot_s)
        last = slot if last is None else max(last, slot)
        first = slot if first is None else min(first, slot)
        span = sums.roll(_span(first, last, config))  # before the fold prunes the slots left behind
        moved = _fold(active, idle, counts, event.session_id, EventKind(event.kind), slot, last, n)[2]
        if moved != NO_COUNTS and slot in span:
            sums.add(moved, 1)
        changes += moved[4]
        read(event.t)
    return tuple(times), tuple(out)


def _state_then(events: Iterable[SessionEvent], start: float, active: set[str], idle: set[str],
                slots: int) -> Iterator[SessionEvent]:
    """Fold the events at or before ``start`` into the sets, counted in no slot; the events
    after it, in order."""
    rest = iter(events)
    for event in rest:
        if event.t > start:
            return chain((event,), rest)
        _fold(active, idle, {}, event.session_id, EventKind(event.kind), 0, 0, slots)
    return iter(())


class _SpanSums:
    """Arrivals, departures and flips over a span of ``counts``' slots, kept as the span rolls
    and events fold in (instead of summed over the window's slots at every reading)."""

    def __init__(self, counts: dict[int, list[int]]) -> None:
        self.counts, self.span, self.sums = counts, range(0), [0, 0, 0]

    def roll(self, new: range) -> range:
        """The sums over ``new`` (read the slots that left before they are pruned)."""
        span, get = self.span, self.counts.get
        if new == span:
            return span
        if new.start >= span.start and new.stop >= span.stop:  # forward: slots leave on the left
            for i in range(span.start, min(new.start, span.stop)):
                self.add(get(i, _ZERO), -1)
            for i in range(max(span.stop, new.start), new.stop):
                self.add(get(i, _ZERO), 1)
        else:  # back (an event before the first slot seen): counted afresh
            self.sums = [0, 0, 0]
            for i in new:
                self.add(get(i, _ZERO), 1)
        self.span = new
        return new

    def add(self, row: Sequence[int], sign: int) -> None:
        """Fold one slot's counts (arrivals, departures, to_idle, to_active, ...) in, with ``sign``."""
        sums = self.sums
        sums[0] += sign * row[0]
        sums[1] += sign * row[1]
        sums[2] += sign * (row[2] + row[3])
