"""A worker's per-session ownership machine: which commands and inputs a held session takes.

Pure: no Kafka, Redis, torch or clock (``now`` is passed in). The worker's core (``core.py``)
asks it what to do and turns the answer into commands (claim, fenced write, model step, send)
that the shell (``commands.py``) carries out. Its rules:

- a command acts only with the generation the worker holds; an older one is ``stale_epoch``,
  any other ``not_owner``;
- inputs are applied once, in ``seq`` order, each from the generation they were routed with;
  an input for a generation not yet claimed waits (bounded) for its ``Assign``;
- a session frozen for a handoff applies nothing until it is revoked (the inputs waiting
  are refused, so dispatch routes them to the new owner) or thawed;
- a missing ``seq`` is waited on for ``gap_wait_s`` (not at all when a later input names it
  as refused by dispatch); then the later ones are applied without it and it is refused as
  ``late`` if it comes (a copy sent again after dispatch refused it too); nothing waits past a close (refused ``closed``)
  or an offload (applied first).

Session lifecycle transitions are not encoded here: the store and ``processors/lifecycle.py``
own them; this machine only fences one owner's actions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from schemas.records import Generation, RejectReason, RoutedInput
from streams.generations import StoreState
from streams.store_ops import untold_from

__all__ = ["MAX_PENDING_INPUTS", "Held", "Refusal", "EarlyInputs", "command_refusal",
           "stray_input_refusal", "suspended_before_assign"]

MAX_PENDING_INPUTS = 1024


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a command or input is refused (``CommandRejected.reason``, and detail)."""

    reason: RejectReason
    detail: str = ""


def command_refusal(held: Generation | None, sent: Generation) -> Refusal | None:
    """None when a command stamped ``sent`` may act on the session held as ``held``."""
    if held is not None and held == sent:
        return None
    reason = "stale_epoch" if held is not None and sent.epoch < held.epoch else "not_owner"
    return Refusal(reason, f"held: {held}")


def stray_input_refusal(rec: RoutedInput, state: str | None, current: Generation | None) -> Refusal | None:
    """An input for a session this worker does not hold, given the store's view of it: None
    when it should wait for its ``Assign`` (the store says active under the input's own
    generation), else the refusal that makes dispatch route it again."""
    if state == StoreState.ACTIVE and current == rec.generation:
        return None
    stale = current is not None and current.epoch > rec.generation.epoch
    said = getattr(state, "value", state) or "unknown"  # the store's word, not the enum's repr
    return Refusal("stale_epoch" if stale else "not_owner", f"current: {current} ({said})")


def suspended_before_assign(state: str | None, current: Generation | None, sent: Generation) -> bool:
    """Whether a Suspend stamped ``sent``, for a session this worker does not hold, overtook
    its Assign (they come from different agents): the store holds the session active under
    that generation, so it is suspended there and the late Assign finds nothing to run. A
    Suspend delivered again after the offload finds it suspended: refused, not released twice."""
    return state == StoreState.ACTIVE and current == sent


@dataclass
class Held:
    """One session this worker owns: its generation, model state and the inputs waiting."""

    generation: Generation
    state: Any  # the model's session state; ``input_seq`` is the last applied input
    executing: bool = True
    next_due: float = 0.0
    pending: dict[int, RoutedInput] = field(default_factory=dict)
    input_pos: tuple[int, int] = (-1, -1)  # session-inputs (partition, offset) of the last applied input
    gap_since: float | None = None  # since when the next seq is missing while later ones wait
    skipped: set[int] = field(default_factory=set)  # seqs given up on after the gap wait
    # below this seq (at or below the last applied) an input may have been given up on
    # without ``skipped`` still listing it (only the latest are kept): neither applied for
    # sure nor a duplicate, so one that comes is refused, never dropped without a word
    untold_below: int = 0
    skipped_told: int = 0  # the highest seq given up on that the store was told of
    withdrawn: set[int] = field(default_factory=set)  # seqs dispatch refused: never waited for
    frozen_since: float | None = None  # frozen for a handoff: no chunk, no input applied
    replay_owed: bool = False  # a recovery's inputs not read from the log yet: no chunk, no input applied
    log_read_on_way: bool = False  # a read of those inputs was asked for and has not come back
    released_chunk: int = -1  # the last chunk index released under this generation (-1: none)
    # the last input applied: the state's at the start (a new one, or its snapshot's), then
    # this machine's own count (:meth:`applied`), not read back from the model's state
    applied_seq: int = field(init=False)

    def __post_init__(self) -> None:
        self.applied_seq = int(self.state.input_seq)
        # a list taken from a snapshot or the store is full when older seqs may have left it
        self.untold_below = max(self.untold_below, untold_from(sorted(self.skipped)))

    def freeze(self, now: float) -> None:
        self.executing, self.frozen_since = False, now

    def thaw(self, now: float) -> None:
        """Kept after all (the handoff refused, or it waited too long): runs again from ``now``
        (once its recovery's inputs are read, if they are owed)."""
        self.executing, self.frozen_since, self.next_due = not self.replay_owed, None, now

    def owe_replay(self) -> None:
        """Its recovery's inputs could not be read from the log (the broker away): it waits."""
        self.replay_owed, self.executing = True, False

    def replayed(self, now: float) -> None:
        self.replay_owed, self.executing, self.next_due = False, self.frozen_since is None, now

    def freeze_expired(self, now: float, wait_s: float) -> bool:
        return self.frozen_since is not None and self.frozen_since <= now - wait_s

    def offer(self, rec: RoutedInput, gap_wait_s: float) -> Refusal | None:
        """Take an input routed to this generation: None when it is queued or a duplicate of
        one already applied, else why it is refused."""
        if rec.generation != self.generation:
            return Refusal("stale_epoch", f"held: {self.generation}")
        if rec.seq in self.skipped:
            return Refusal("late", f"input {rec.seq} arrived after the session applied later inputs without it "
                           f"(refused before, or given up on after {gap_wait_s:g} s or at an offload)")
        if rec.seq < self.untold_below:
            return Refusal("late", f"input {rec.seq} is older than the inputs this session still tells apart "
                           f"(from {self.untold_below}: more were given up on than are kept); if it was "
                           "applied before, its InputAccepted stands")
        if rec.seq <= self.applied_seq:
            part, offset = self.input_pos
            if rec.source_partition == part and rec.source_offset > offset >= 0:
                # a record later in the log than the last input applied: not this input delivered
                # again but another that uses its seq again (a producer that restarted from 1);
                # it was dropped without a word before
                return Refusal("late", f"input {rec.seq} was applied already and this record, later in the log "
                               f"(session-inputs partition {part}, offset {rec.source_offset} after {offset}), uses "
                               f"its seq again: a session's seq goes on from its last input (after a producer's "
                               f"restart, from its last InputAccepted + 1: SessionClient.push(..., next_seq=N))")
            return None  # already applied (the same record delivered again)
        if len(self.pending) >= MAX_PENDING_INPUTS:
            self.withdraw((rec.seq,))  # refused for good: not waited for, nor applied from the log
            return Refusal("too_many_pending", "pending input buffer full")
        self.pending[rec.seq] = rec
        self.withdraw(seq for seq in rec.refused_before if seq < rec.seq)
        return None

    def offer_logged(self, logged: Iterable[Any], worker_id: str, ts: float, gap_wait_s: float,
                     upto: int | None = None) -> None:
        """Take inputs read back from ``session-inputs`` (``streams.input_log.LoggedInput``) as
        if routed to this generation, up to seq ``upto``; never one withdrawn (refused upstream,
        which the log read names too)."""
        for got in logged:
            rec = got.record
            if (upto is None or rec.seq <= upto) and rec.seq not in self.withdrawn:
                self.offer(RoutedInput(worker_id=worker_id, session_id=rec.session_id, generation=self.generation,
                                       seq=rec.seq, kind=rec.kind, payload=rec.payload, ts=ts,
                                       source_partition=got.partition, source_offset=got.offset,
                                       refused_before=got.refused_before), gap_wait_s)

    def withdraw(self, seqs: Iterable[int]) -> None:
        """Seqs refused upstream (dispatch named them) or here for good: never coming."""
        applied = self.applied_seq
        self.withdrawn.update(seq for seq in seqs if seq > applied)
        if len(self.withdrawn) > MAX_PENDING_INPUTS:
            self.withdrawn = set(sorted(self.withdrawn)[-MAX_PENDING_INPUTS:])

    def has_gap(self) -> bool:
        """Whether inputs wait for one that has not come (nor was refused upstream)."""
        nxt = self.applied_seq + 1
        while nxt in self.withdrawn and nxt not in self.pending:
            nxt += 1
        return bool(self.pending) and nxt not in self.pending

    def next_input(self, now: float, skip_gaps: bool = False) -> RoutedInput | None:
        """The next input to apply, in order, or None. A missing seq is waited for (from
        ``now``); with ``skip_gaps`` it is given up on and the next present one is returned.
        Nothing while frozen: the snapshot a handoff took must hold every input applied."""
        if self.frozen_since is not None or self.replay_owed:
            return None
        if not self.pending:
            self.gap_since = None
            return None
        nxt = self.applied_seq + 1
        while nxt in self.withdrawn and nxt not in self.pending:  # refused upstream: never coming
            nxt += 1
        if nxt not in self.pending:
            if not skip_gaps:
                self.gap_since = self.gap_since if self.gap_since is not None else now
                return None
            first = min(self.pending)
            # only the latest seqs given up on are kept, so only they are listed: a seq far
            # ahead (a producer's bug, or a hostile one) must not make the owner count up to it
            self._give_up(range(max(nxt, first - MAX_PENDING_INPUTS), first))
            if first - MAX_PENDING_INPUTS > nxt:  # the seqs from nxt up to those listed are not
                self.untold_below = max(self.untold_below, first - MAX_PENDING_INPUTS)
            nxt = first
        self.gap_since = None  # progress: a gap met after this one is waited for from when it blocks
        # the seqs refused upstream it passes over are given up on too: a copy sent again (a
        # producer's retry after the refusal) is refused as late, not taken for a duplicate
        # of an input applied and dropped without a word
        self._give_up([seq for seq in self.withdrawn if seq < nxt])
        return self.pending.pop(nxt)

    def applied(self, rec: RoutedInput) -> None:
        """Record that ``rec`` was applied, and where in ``session-inputs`` it came from."""
        self.applied_seq = max(self.applied_seq, rec.seq)
        if self.withdrawn:
            self.withdrawn = {seq for seq in self.withdrawn if seq > rec.seq}
        if rec.source_offset >= 0:
            self.input_pos = (rec.source_partition, rec.source_offset)

    def _give_up(self, seqs: Iterable[int]) -> None:
        self.skipped.update(seqs)
        if len(self.skipped) > MAX_PENDING_INPUTS:
            kept = sorted(self.skipped)[-MAX_PENDING_INPUTS:]
            self.skipped = set(kept)
            self.untold_below = max(self.untold_below, kept[0])

    def skipped_news(self) -> list[int] | None:
        """The seqs given up on, when some are new since the last call (else None): the store
        keeps them, so a copy of one that comes back after the session ended is refused as
        late, and a copy of an input applied is known for a duplicate."""
        top = max(self.skipped, default=0)
        if top <= self.skipped_told:
            return None
        self.skipped_told = top
        return sorted(self.skipped)

    def gap_expired(self, now: float, gap_wait_s: float) -> bool:
        return self.gap_since is not None and self.gap_since <= now - gap_wait_s

    def take_pending(self) -> list[RoutedInput]:
        """Every waiting input, in order, and none left (for refusal at a close or a fence)."""
        pending, self.pending = self.pending, {}
        return sorted(pending.values(), key=lambda r: r.seq)


class EarlyInputs:
    """Inputs that arrived before the ``Assign`` of their generation, bounded per session.

    None waits for ever: the Assign's claim failing, a close or an offload overtaking it
    (:meth:`take`), or no Assign within a wait (:meth:`expired`) hands them back to be
    refused, so dispatch settles each one (routes it again, or refuses it with a reason)."""

    def __init__(self, bound: int = MAX_PENDING_INPUTS) -> None:
        self.bound = bound
        self._by_session: dict[str, dict[int, tuple[RoutedInput, float]]] = {}

    def keep(self, rec: RoutedInput, now: float) -> Refusal | None:
        early = self._by_session.setdefault(rec.session_id, {})
        if len(early) >= self.bound:
            return Refusal("too_many_pending", "pending input buffer full")
        early[rec.seq] = (rec, early[rec.seq][1] if rec.seq in early else now)
        return None

    def hand_over(self, sid: str, held: Held,
                  gap_wait_s: float) -> tuple[list[RoutedInput], list[tuple[RoutedInput, Refusal]]]:
        """Offer the early inputs of ``held``'s generation to it (``Held.offer``: a seq given up
        on is refused as late, the seqs dispatch refused are not waited for); returns the ones
        of other generations and those ``offer`` refused, which the core refuses."""
        early = self._by_session.pop(sid, {})
        others, refused = [], []
        for seq, (rec, _) in sorted(early.items()):
            if rec.generation != held.generation:
                others.append(rec)
            elif (why := held.offer(rec, gap_wait_s)) is not None:
                refused.append((rec, why))
        return others, refused

    def take(self, sid: str, generation: Generation) -> list[RoutedInput]:
        """The early inputs of ``generation`` (whose Assign will run nothing here), in order."""
        early = self._by_session.get(sid, {})
        out = [rec for _, (rec, _) in sorted(early.items()) if rec.generation == generation]
        for rec in out:
            del early[rec.seq]
        if not early:
            self._by_session.pop(sid, None)
        return out

    def expired(self, now: float, wait_s: float) -> list[RoutedInput]:
        """The early inputs kept longer than ``wait_s`` with no Assign of theirs."""
        out = []
        for sid in list(self._by_session):
            early = self._by_session[sid]
            for seq, (rec, since) in sorted(early.items()):
                if since <= now - wait_s:
                    out.append(rec)
                    del early[seq]
            if not early:
                del self._by_session[sid]
        return out

    def waiting(self, sid: str, generation: Generation | None = None) -> list[int]:
        return sorted(seq for seq, (rec, _) in self._by_session.get(sid, {}).items()
                      if generation is None or rec.generation == generation)
