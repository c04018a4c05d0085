"""What the worker's core hears and says (``core.py``): the events (a command or input, a
store's answer, a batch's chunks, a heartbeat's check) and the commands, as data.

Every command whose outcome a decision needs is answered by one event naming what it was
for (a ``Claim`` by ``ClaimAnswered`` with its ``Assign``); ``Then(event)`` asks the shell to
have ``event`` decided at that point, not now. Events and commands that carry a held
session (``ownership.Held``) compare by identity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from schemas.records import Assign, Generation, Handoff, Record, RejectReason, RoutedInput, Suspend, Terminate

from .ownership import Held, Refusal

__all__ = ["At", "OWED",
           # events: what the shell hears and the answers to commands
           "Got", "Unauthentic", "CurrentIs", "ClaimAnswered", "Loaded", "SessionRead", "InputApplied",
           "InputFenced", "GapRead", "LogRead", "EndedInStore", "Offloaded", "Snapshotted",
           "SnapshotRefused", "ChunksReleased", "GapCheck", "FreezeCheck", "Event",
           # commands: what the shell carries out
           "Send", "Flush", "ReadCurrent", "Claim", "LoadState", "ReadSession", "ApplyInput", "ReadGap",
           "ReadLog", "AwaitLog", "EndInStore", "Release", "Offload", "Snapshot", "Note", "Then", "Command",
           # decisions carried to a later point (``Then``)
           "OffloadReady", "HandoffReady", "GapExpired", "FreezeExpired"]

OWED = "its recovery's inputs are not read from session-inputs yet (the broker away): it stays here until they are"


@dataclass(frozen=True, slots=True)
class At:
    """When a decision is made: the monotonic clock (waits, due times) and the wall clock
    (the ``ts`` of the records it sends)."""

    mono: float
    wall: float


# --- events ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Got:
    """A command or an input from ``worker-commands`` addressed to this worker."""

    rec: Record


@dataclass(frozen=True, slots=True)
class Unauthentic:
    """A command that failed its authenticity check (unsigned, unknown key, forged)."""

    rec: Record
    reason: RejectReason


@dataclass(frozen=True, slots=True)
class CurrentIs:
    """The store's current generation of ``rec``'s session (answers ``ReadCurrent``)."""

    rec: Record
    current: Generation | None


@dataclass(frozen=True, slots=True)
class ClaimAnswered:
    """The store took the claim of ``rec``'s generation, or refused it (answers ``Claim``)."""

    rec: Assign
    refusal: Refusal | None = None


@dataclass(frozen=True, slots=True, eq=False)
class Loaded:
    """A claimed session's state: new, or restored with where its inputs stood and the seqs
    given up on before it; not ``found`` when there was no snapshot to restore, ``refusal``
    when it cannot be had (answers ``LoadState``)."""

    rec: Assign
    state: Any = None
    input_pos: tuple[int, int] = (-1, -1)
    skipped: tuple[int, ...] = ()
    refusal: Refusal | None = None
    found: bool = True


@dataclass(frozen=True, slots=True)
class SessionRead:
    """The store's word on a session this worker does not hold (answers ``ReadSession``)."""

    rec: RoutedInput | Suspend
    state: str | None
    current: Generation | None


@dataclass(frozen=True, slots=True, eq=False)
class InputApplied:
    """``rec`` was fenced in the store and applied to the session's state (answers ``ApplyInput``)."""

    sid: str
    held: Held
    rec: RoutedInput
    skip_gaps: bool


@dataclass(frozen=True, slots=True, eq=False)
class InputFenced:
    """The store refused ``rec``'s input seq: the generation has passed (answers ``ApplyInput``)."""

    sid: str
    held: Held
    rec: RoutedInput
    why: str


@dataclass(frozen=True, slots=True, eq=False)
class GapRead:
    """The session's inputs read back from the log to fill a gap; None when the broker could
    not be read (answers ``ReadGap``)."""

    sid: str
    held: Held
    logged: tuple[Any, ...] | None


@dataclass(frozen=True, slots=True, eq=False)
class LogRead:
    """A recovery's inputs read back from the log (``streams.input_log.LoggedInput``); None
    when the broker could not be read. ``then``: the command that waited for them (answers
    ``AwaitLog``); None for a read made beside the serving loop (``ReadLog``)."""

    sid: str
    held: Held
    logged: tuple[Any, ...] | None
    then: Record | None = None


@dataclass(frozen=True, slots=True)
class EndedInStore:
    """A close or an offload that overtook its Assign, done in the store or refused (answers ``EndInStore``)."""

    rec: Terminate | Suspend
    refusal: Refusal | None = None


@dataclass(frozen=True, slots=True, eq=False)
class Offloaded:
    """The session's state is in the store and its generation released; ``refusal`` when it
    could not be offloaded (a limit: it stays resident) and ``fenced`` when its generation has
    passed (answers ``Offload``)."""

    rec: Suspend
    held: Held
    refusal: Refusal | None = None
    fenced: bool = False


@dataclass(frozen=True, slots=True, eq=False)
class Snapshotted:
    """A fenced snapshot of the session was taken (answers ``Snapshot``); ``then``: the
    Handoff it was for, or None for a periodic one."""

    sid: str
    held: Held
    then: Handoff | None


@dataclass(frozen=True, slots=True, eq=False)
class SnapshotRefused:
    """No snapshot: over a limit, or (``fenced``) the generation has passed (answers ``Snapshot``)."""

    sid: str
    held: Held
    then: Handoff | None
    refusal: Refusal
    fenced: bool


@dataclass(frozen=True, slots=True, eq=False)
class ChunksReleased:
    """A batch's chunks ran and the store answered for each (``(ok, why)``: released, already
    released by an earlier owner, or fenced); ``outputs``: the model's per-session results;
    ``due_at``: the monotonic time the batch was taken as due."""

    due: tuple[tuple[str, Held], ...]
    outputs: tuple[Any, ...]
    verdicts: tuple[tuple[bool, Any], ...]
    due_at: float
    latency_s: float
    interval_s: float
    snapshot_every: int


@dataclass(frozen=True, slots=True)
class GapCheck:
    """Each heartbeat: gaps waited on long enough, recoveries owed a read, early inputs whose Assign never came."""


@dataclass(frozen=True, slots=True)
class FreezeCheck:
    """Each heartbeat: sessions frozen for a handoff nobody completed within ``wait_s``."""

    wait_s: float


# decisions carried to a later point by ``Then``


@dataclass(frozen=True, slots=True, eq=False)
class OffloadReady:
    """An offload's inputs are applied: offload, unless the session was fenced meanwhile."""

    rec: Suspend
    held: Held


@dataclass(frozen=True, slots=True, eq=False)
class HandoffReady:
    """A handoff's inputs in order are applied: snapshot, unless the session was fenced meanwhile."""

    rec: Handoff
    held: Held


@dataclass(frozen=True, slots=True, eq=False)
class GapExpired:
    sid: str
    held: Held


@dataclass(frozen=True, slots=True, eq=False)
class FreezeExpired:
    sid: str
    held: Held
    wait_s: float


Event = (Got | Unauthentic | CurrentIs | ClaimAnswered | Loaded | SessionRead | InputApplied | InputFenced | GapRead
         | LogRead | EndedInStore | Offloaded | Snapshotted | SnapshotRefused | ChunksReleased | GapCheck | FreezeCheck
         | OffloadReady | HandoffReady | GapExpired | FreezeExpired)


# --- commands ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    """Publish an event on ``worker-events``."""

    rec: Record


@dataclass(frozen=True, slots=True)
class Flush:
    """Wait until every event sent so far is acknowledged: the inputs applied are reported
    before an offload, a handoff or a close makes the state others act on."""


@dataclass(frozen=True, slots=True)
class ReadCurrent:
    rec: Record


@dataclass(frozen=True, slots=True)
class Claim:
    rec: Assign


@dataclass(frozen=True, slots=True)
class LoadState:
    """The session's state: its last snapshot (from host memory when it holds that one), or
    a new one."""

    rec: Assign
    restore: bool


@dataclass(frozen=True, slots=True)
class ReadSession:
    rec: RoutedInput | Suspend


@dataclass(frozen=True, slots=True, eq=False)
class ApplyInput:
    """Fence ``rec``'s seq in the store (with the seqs given up on, when there are new ones),
    then apply it to the session's state."""

    sid: str
    held: Held
    rec: RoutedInput
    skipped: tuple[int, ...] | None
    skip_gaps: bool


@dataclass(frozen=True, slots=True, eq=False)
class ReadGap:
    sid: str
    held: Held


@dataclass(frozen=True, slots=True, eq=False)
class ReadLog:
    """Read a recovery's inputs beside the serving loop (the core asks for none while one is on its way)."""

    sid: str
    held: Held


@dataclass(frozen=True, slots=True, eq=False)
class AwaitLog:
    """The recovery's inputs, now: the read on its way waited for, or a new one."""

    sid: str
    held: Held
    then: Record


@dataclass(frozen=True, slots=True)
class EndInStore:
    rec: Terminate | Suspend


@dataclass(frozen=True, slots=True)
class Release:
    """Flush, then give up the generation in the store (a refusal only logged: the session is gone here either way)."""

    sid: str
    generation: Generation
    close: bool
    flush: bool = True


@dataclass(frozen=True, slots=True, eq=False)
class Offload:
    """Device -> host -> fenced snapshot, flush, release; the state kept in host memory."""

    rec: Suspend
    held: Held


@dataclass(frozen=True, slots=True, eq=False)
class Snapshot:
    sid: str
    held: Held
    then: Handoff | None = None


@dataclass(frozen=True, slots=True)
class Note:
    """A line for the log; ``reason``: a refusal counted in the metrics though nothing is sent."""

    text: str
    level: Literal["info", "warning"] = "info"
    reason: str = ""


@dataclass(frozen=True, slots=True, eq=False)
class Then:
    event: OffloadReady | HandoffReady | GapExpired | FreezeExpired


Command = (Send | Flush | ReadCurrent | Claim | LoadState | ReadSession | ApplyInput | ReadGap | ReadLog | AwaitLog
           | EndInStore | Release | Offload | Snapshot | Note | Then)
