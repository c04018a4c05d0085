"""The session lifecycle: the one transition table.

No other module may encode a lifecycle transition: everything that changes a session's
state goes through :func:`transition` (or :func:`on_event`, which wraps it). Like h11's
``_state.py``, the table is data, and it is total: every (state, event) pair is listed,
so a duplicated or reordered event (delivery is at-least-once) lands somewhere defined.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Iterable, Iterator, Mapping

from processors.decisions import Command, Offload, Discard
from schemas import records as r
from streams.store_records import StoreState

__all__ = [
    "SessionState",
    "EventKind",
    "Action",
    "SessionEvent",
    "Session",
    "TRANSITIONS",
    "transition",
    "moves",
    "on_event",
    "EVENT_KIND",
    "session_event",
    "STORE_STATE",
    "CLOSED_KEPT",
    "remember_closed",
    "REFUSED_UNKNOWN",
    "INPUT_EVENT",
]


class SessionState(str, Enum):
    """Where a session's state lives: on a GPU, offloaded, or gone."""

    EXECUTION = "execution"
    SUSPENDED = "suspended"
    TERMINATED = "terminated"


# the same states as the generation store spells them (its Lua scripts write these values)
STORE_STATE: Mapping[SessionState, StoreState] = MappingProxyType({
    SessionState.EXECUTION: StoreState.ACTIVE,
    SessionState.SUSPENDED: StoreState.SUSPENDED,
    SessionState.TERMINATED: StoreState.CLOSED,
})


class EventKind(str, Enum):
    """A session event as it appears on ``session-events`` and in traces."""

    OPEN = "open"
    ACTIVE = "active"
    IDLE = "idle"
    CLOSE = "close"


class Action(str, Enum):
    """What a transition asks of the control plane."""

    NONE = "none"
    PLACE = "place"  # needs a GPU; the placement controller picks it
    SUSPEND = "suspend"  # offload command
    RESUME = "resume"  # needs a GPU and a restore
    TERMINATE = "terminate"


@dataclass(frozen=True, slots=True)
class SessionEvent:
    """One session event at time ``t`` (seconds); ``state_bytes`` is the session's state size."""

    t: float
    session_id: str
    kind: EventKind
    state_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Session:
    """One session: its state size, lifecycle state and GPU (None when not on one).

    ``restore`` marks an executing session whose state must be restored when placed. A
    suspended session with a ``gpu_id`` is idle but still resident there (its state holds
    memory and a slot). ``since`` is the time (seconds, the snapshot's clock) its lifecycle
    state last changed: a suspended session's idle age is ``snapshot.now - since``.
    """

    id: str
    state_bytes: int = 0
    lifecycle: SessionState = SessionState.EXECUTION
    gpu_id: str | None = None
    restore: bool = False
    since: float = 0.0



_E, _S, _T = SessionState.EXECUTION, SessionState.SUSPENDED, SessionState.TERMINATED

#: (current state or None for an unknown session, event) -> (next state, action)
TRANSITIONS: Mapping[tuple[SessionState | None, EventKind], tuple[SessionState, Action]] = (
    MappingProxyType(
        {
            (None, EventKind.OPEN): (_E, Action.PLACE),
            (None, EventKind.ACTIVE): (_E, Action.PLACE),  # open lost or reordered
            (None, EventKind.IDLE): (_S, Action.NONE),
            (None, EventKind.CLOSE): (_T, Action.NONE),
            (_E, EventKind.OPEN): (_E, Action.NONE),  # duplicate
            (_E, EventKind.ACTIVE): (_E, Action.NONE),  # duplicate
            (_E, EventKind.IDLE): (_S, Action.SUSPEND),
            (_E, EventKind.CLOSE): (_T, Action.TERMINATE),
            (_S, EventKind.OPEN): (_S, Action.NONE),  # duplicate open after an idle
            (_S, EventKind.ACTIVE): (_E, Action.RESUME),
            (_S, EventKind.IDLE): (_S, Action.NONE),
            (_S, EventKind.CLOSE): (_T, Action.TERMINATE),
            (_T, EventKind.OPEN): (_T, Action.NONE),  # terminated is final
            (_T, EventKind.ACTIVE): (_T, Action.NONE),
            (_T, EventKind.IDLE): (_T, Action.NONE),
            (_T, EventKind.CLOSE): (_T, Action.NONE),
        }
    )
)


#: events dispatch refuses for a session its store does not know (the table's rows for None
#: say where a trace puts them; the live folds, control's view and the metrics tally, pass
#: over them as the detector does, or they counted idle sessions nobody had opened)
REFUSED_UNKNOWN = frozenset({EventKind.IDLE, EventKind.CLOSE})

#: what an input is to its session's lifecycle: an ``active`` (it wakes an offloaded session:
#: dispatch restores it, then routes the input; the control plane, which reads no inputs,
#: counts the session idle until its own ``active``)
INPUT_EVENT = EventKind.ACTIVE

#: the lifecycle event each ``session-events`` record is
EVENT_KIND: Mapping[type, EventKind] = MappingProxyType({
    r.SessionOpened: EventKind.OPEN, r.SessionActive: EventKind.ACTIVE,
    r.SessionIdle: EventKind.IDLE, r.SessionClosed: EventKind.CLOSE})


def session_event(rec: r.Record) -> SessionEvent | None:
    """The lifecycle event a record is (at its own ``ts``); None for any other record."""
    kind = EVENT_KIND.get(type(rec))
    if kind is None:
        return None
    return SessionEvent(rec.ts, rec.session_id, kind, getattr(rec, "state_bytes", 0))  # type: ignore[attr-defined]


def transition(state: SessionState | None, event: EventKind) -> tuple[SessionState, Action]:
    """Look up the next state and the action for ``event`` in ``state``."""
    return TRANSITIONS[(state, event if type(event) is EventKind else EventKind(event))]


def moves(events: Iterable[SessionEvent]) -> Iterator[tuple[SessionEvent, SessionState | None, SessionState]]:
    """Each event with its session's state before and after it, every session moved by the
    table from unknown (the fold the simulator's tooling shares)."""
    states: dict[str, SessionState] = {}
    for ev in events:
        was = states.get(ev.session_id)
        states[ev.session_id] = now = transition(was, ev.kind)[0]
        yield ev, was, now


def on_event(session: Session | None, event: SessionEvent) -> tuple[Session, tuple[Command, ...]]:
    """Apply ``event`` to one session record; returns the new record and its commands.

    A session that must run comes back in EXECUTION with ``gpu_id=None`` (``restore`` set when
    its state was offloaded): the placement controller gives it a GPU at the next round.
    """
    # the simulator's hot path: the new record is built whole (dataclasses.replace costs
    # several times a plain construction), field by field from the old one
    current = session.lifecycle if session is not None else None
    nxt, action = transition(current, event.kind)
    if session is None:
        sid, size, gpu_id, restore, since = event.session_id, event.state_bytes, None, False, 0.0
    else:
        sid, gpu_id, restore, since = session.id, session.gpu_id, session.restore, session.since
        size = event.state_bytes if event.state_bytes else session.state_bytes
    if action is Action.PLACE:
        return Session(sid, size, nxt, gpu_id=None, restore=False, since=since), ()
    if action is Action.RESUME:
        return Session(sid, size, nxt, gpu_id=None, restore=True, since=since), ()
    if action is Action.SUSPEND:
        return Session(sid, size, nxt, gpu_id=None, restore=restore, since=since), (Offload(sid, gpu_id),)
    if action is Action.TERMINATE:
        return Session(sid, size, nxt, gpu_id=None, restore=restore, since=since), (Discard(sid, gpu_id),)
    return Session(sid, size, nxt, gpu_id=gpu_id, restore=restore, since=since), ()


CLOSED_KEPT = 100_000  # closed session ids a fold remembers, the latest kept


def remember_closed(closed: dict[str, None], sid: str) -> None:
    """Keep ``sid`` among the closed ids (``closed`` in closing order; bounded, the oldest is
    forgotten). Dispatch refuses a later event of a closed id while its store keeps the
    closed session (``store_retention_s``, an hour by default), and the folds that count
    sessions (the detector's, control's window, the metrics processor's) pass over it. The
    bounds differ: an id used again after the store forgot it is served by dispatch but not
    counted here until 100,000 later closes push it out, so producers do not reuse ids."""
    closed[sid] = None
    if len(closed) > CLOSED_KEPT:
        del closed[next(iter(closed))]
