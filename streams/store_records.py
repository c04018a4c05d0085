"""The generation store's records: a session's stored state, what a read returns, a worker's
load, a lease's answer, and the key layout (``streams.generations`` describes the keys)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from schemas.errors import ConfigError
from schemas.records import Generation

__all__ = ["Keys", "LeaseAnswer", "LeaseState", "SessionView", "SnapshotManifest", "StoreState", "WorkerLoad"]


class StoreState(str, Enum):
    """A session's state as the store keeps it (field ``st``, written by the Lua scripts):
    the lifecycle's EXECUTION, SUSPENDED and TERMINATED (``processors.lifecycle.STORE_STATE``
    maps them; a test holds the scripts and the twin to these values)."""

    ACTIVE = "active"  # a generation holds a slot on its worker
    SUSPENDED = "suspended"  # offloaded: a snapshot and no slot
    CLOSED = "closed"  # terminated; refuses every commit and write


class LeaseState(str, Enum):
    """What an acquire found (``acquire_lease.lua`` answers with these names)."""

    ACQUIRED = "acquired"  # no one held it: taken now
    REFRESHED = "refreshed"  # this token held it: its time set again
    HELD = "held"  # another token holds it: left as it is


@dataclass(frozen=True, slots=True)
class LeaseAnswer:
    """An acquire's answer: who holds the lease now and for how many ms unless refreshed
    (the time just set when ours; -1 for a key without expiry, set by hand)."""

    state: LeaseState
    holder: str
    remaining_ms: int

    @property
    def ours(self) -> bool:
        return self.state != LeaseState.HELD


class WorkerLoad(NamedTuple):
    """One worker in the load view."""

    used: int
    capacity: int
    draining: bool
    down: bool = False  # declared dead and not heard from since


@dataclass(frozen=True, slots=True)
class SnapshotManifest:
    """A published snapshot: ``parts`` parts of ``snap_id``, ``size`` bytes in all."""

    snap_id: str
    parts: int
    size: int
    sha256: str
    epoch: int
    chunk_index: int | None = None
    input_seq: int | None = None


@dataclass(frozen=True, slots=True)
class SessionView:
    """Everything the store keeps for a session (a read: no authority implied)."""

    generation: Generation
    state: StoreState
    claimed: bool
    chunk_index: int | None
    input_seq: int | None
    snapshot: SnapshotManifest | None
    close_requested: bool = False  # the user closed it: it is never moved again
    stranded_epoch: int | None = None  # this epoch's owner was lost: a recovery is owed
    skipped: tuple[int, ...] = ()  # seqs below input_seq given up on after the gap wait (the latest)
    opened_by: str = ""  # where the event that opened it sits (``partition:offset``), as dispatch gave it

    @property
    def stranded(self) -> bool:
        """The current generation's owner was lost and no new owner holds it yet."""
        return self.state == StoreState.ACTIVE and self.stranded_epoch == self.generation.epoch


class Keys:
    """The key layout of ``streams.generations``; ``{ns}`` is the one hash tag."""

    def __init__(self, namespace: str) -> None:
        if not namespace or any(c in namespace for c in "{}"):
            raise ConfigError("namespace", f"{namespace!r}: must be non-empty, without braces")
        self.tag = "{" + namespace + "}"
        self.workers = f"{self.tag}:workers"

    def session(self, sid: str) -> str:
        return f"{self.tag}:s:{sid}"

    def snapdata(self, sid: str) -> str:
        return f"{self.tag}:sd:{sid}"

    def slots(self, worker: str) -> str:
        return f"{self.tag}:ws:{worker}"

    @property
    def recovery(self) -> str:
        return f"{self.tag}:recover"

    def lease(self, name: str) -> str:
        return f"{self.tag}:lease:{name}"

    @property
    def logs(self) -> str:
        """Topic prefix -> the ``session-events`` end offset the store has served up to."""
        return f"{self.tag}:logs"

