"""What the dispatch core (``processors.dispatch``) hears and says: its state (the load
view), the events the shell feeds it, and the commands it returns, all frozen data."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from schemas.records import CommandRejected, Generation, Record, RoutedInput
from streams.store_records import SessionView

from .admission import AdmitPlan, WorkerLoad

__all__ = ["MAX_WAITING", "MAX_GAVE_UP", "DispatchView", "Facts",
           "Input", "Admission", "Seen", "Committed", "CommitRefused", "Moved", "MoveRefused", "Retry",
           "Event", "Publish", "RouteAgain", "Commit", "Move", "RetryLater", "ReadAgain", "RequestClose",
           "CloseInStore", "Refuse", "RefuseEvent", "Note", "Command"]


# admissions for session events (opens, returns) waiting for room at once: each holds one of
# the shell's in-flight places, so a flood of opens while the fleet is full cannot hold them all
MAX_WAITING = 256
MAX_GAVE_UP = 1024  # sessions whose admission timed out, remembered for an admission timeout


@dataclass(frozen=True, slots=True)
class DispatchView:
    """The dispatch core's state: the workers' loads (a cache the shell refreshes from the
    store), the control leader's admission plan, when the last placement report went out, and
    the sessions whose admission (for a session event) timed out lately. ``waiting``: how many
    admissions for session events wait for room now (the shell's count)."""

    workers: Mapping[str, WorkerLoad]
    plan: AdmitPlan | None = None  # the control leader's latest (None: no controller heard yet)
    reported_at: float = -1e18
    source: str = "dispatch"  # the replica's name on its placement reports
    admission_retries: int = 150  # passes over a full fleet (RETRY_S apart) before an admission gives up
    waiting: int = 0
    max_waiting: int = MAX_WAITING  # past it, an open or return that finds no room is refused at once
    gave_up: Mapping[str, float] = field(default_factory=dict)  # session -> when its admission timed out
    read_at: float = -math.inf  # when the shell's latest read of the workers' loads ended (its own clock)


@dataclass(frozen=True, slots=True)
class Facts:
    """What the store says about an event's session when the shell read it."""

    session: SessionView | None
    owner_down: bool = False
    open_waits: bool = False  # an open (or return) of the session waits for room in this dispatch
    place: str = ""  # where the event sits in its topic (``partition:offset``), when the shell knows


@dataclass(frozen=True, slots=True)
class Input:
    """An input to route: from ``session-inputs`` (``partition``/``offset``), or refused by
    an owner and routed again (``refused`` the owner's refusal); ``refused_before``: the
    session's inputs dispatch refused since its previous routed one."""

    session_id: str
    seq: int
    kind: str
    payload: str
    ts: float = 0.0
    partition: int = -1
    offset: int = -1
    refused: CommandRejected | None = None
    rereads_left: int = 0  # re-reads of an unknown session left (its open may still be in flight)
    refused_before: tuple[int, ...] = ()
    origin: Any = field(default=None, compare=False, repr=False)  # the shell's handle on the record


@dataclass(frozen=True, slots=True)
class Admission:
    """A session's next generation being committed: what for, and the workers tried."""

    session_id: str
    prompt: str = ""
    expected_epoch: int = 0
    restore: bool = False
    recover: bool = False
    tried: frozenset[str] = frozenset()
    retries_left: int = 0  # passes over the workers left (one every RETRY_S) before giving up
    then_route: Input | None = None  # an input that woke the session: routed once it is placed
    for_event: bool = False  # an open's or a return's (refused with the event when it gives up)
    waiting: bool = False  # it found no room and waits (counted in the view's ``waiting``)
    opened_by: str = ""  # an open's: where it sits (the store keeps it: read again, it is told apart)

    @property
    def budgeted(self) -> bool:
        """A user's (an open, a return, an input waking an offloaded session): it waits for
        room within the budget and is refused when it gives up; a recovery's is not."""
        return self.for_event or self.then_route is not None


# events the shell feeds the core
@dataclass(frozen=True, slots=True)
class Seen:
    """A record from a topic (a session event, a worker event, an ``Input``) and its facts."""

    what: Record | Input
    facts: Facts


@dataclass(frozen=True, slots=True)
class Committed:
    """A generation committed; ``began``: when the shell sent the commit (the clock of the
    view's ``read_at``): a read of the loads that ended after it may count the slot already."""

    admission: Admission
    generation: Generation
    began: float = math.inf


@dataclass(frozen=True, slots=True)
class CommitRefused:
    """``reason``: ``no_capacity`` (that worker is full), ``stale`` (the session has another
    generation already: ``facts`` as the shell read them then) or another ownership refusal
    (an open's of a closed session: with ``facts`` too)."""

    admission: Admission
    worker: str
    reason: str
    facts: Facts = Facts(None)
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Moved:
    """A handoff committed: ``source`` passed, ``successor`` (on the target) is current."""

    session_id: str
    source: Generation
    successor: Generation
    began: float = math.inf  # as Committed's


@dataclass(frozen=True, slots=True)
class MoveRefused:
    """The store refused a handoff's commit: ``reason`` its code."""

    session_id: str
    source: Generation
    target: str
    reason: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Retry:
    """An admission's pause is over (the shell refreshed the view and read the session again)."""

    admission: Admission
    facts: Facts = Facts(None)


Event = Seen | Committed | CommitRefused | Moved | MoveRefused | Retry


# commands the core returns
@dataclass(frozen=True, slots=True)
class Publish:
    record: Record


@dataclass(frozen=True, slots=True)
class RouteAgain:
    """Publish an input its owner refused to the session's owner now (``record`` keeps the
    original record's place in ``session-inputs``); the shell names in it the session's inputs
    refused lately below it, as a first routing does."""

    record: RoutedInput


@dataclass(frozen=True, slots=True)
class Commit:
    """Commit ``admission``'s next generation on ``worker`` (the store decides)."""

    admission: Admission
    worker: str


@dataclass(frozen=True, slots=True)
class Move:
    """Commit a frozen session's next generation on ``target``, guarded by its ``source``
    generation (the store refuses it once the source has passed)."""

    session_id: str
    source: Generation
    target: str


@dataclass(frozen=True, slots=True)
class RetryLater:
    admission: Admission
    after_s: float


@dataclass(frozen=True, slots=True)
class ReadAgain:
    """Read the facts again after ``after_s`` and feed ``event`` back."""

    event: Seen
    after_s: float


@dataclass(frozen=True, slots=True)
class RequestClose:
    session_id: str


@dataclass(frozen=True, slots=True)
class CloseInStore:
    """Close a session nobody holds (offloaded) in the store directly."""

    session_id: str
    generation: Generation


@dataclass(frozen=True, slots=True)
class Refuse:
    """An input refused to ``dead-letters`` with the reason: never dropped."""

    input: Input
    why: str


@dataclass(frozen=True, slots=True)
class RefuseEvent:
    """The session event being handled is refused to ``dead-letters`` with the reason."""

    why: str


@dataclass(frozen=True, slots=True)
class Note:
    """Something worth a log line (an admission given up, an event for no session)."""

    text: str
    error: bool = False


Command = Publish | RouteAgain | Commit | Move | RetryLater | ReadAgain | RequestClose | CloseInStore | Refuse | RefuseEvent | Note
