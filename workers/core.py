"""The worker's decisions: what a command, an input, a store's answer or a timer leads to.

Pure, the way h11's connection is: ``WorkerCore.decide(event, at) -> commands`` keeps the
sessions this worker holds (``ownership.Held``), the inputs waiting for their ``Assign`` and
the chunk schedule, and says what to do as data: claim, read, fence an input and apply it,
snapshot, offload, release, send an event. No store, broker, model or clock is touched here;
the shell (``commands.py``) carries each command out and feeds its answer back as an event.
The rules of one held session are ``ownership.py``'s; what the core hears and says (the
events, the commands) is in ``core_types.py``.

The shell carries commands out depth first: those an answer leads to run before the ones
after the command it answered, so a decision runs with everything before it done.
``Then(event)`` has ``event`` decided at that point (after an offload's inputs are applied,
say), not now.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from schemas.records import (Assign, ChunkDone, Claimed, CommandRejected, Frozen, Generation, Handoff, InputAccepted, Record,
                             RejectReason, Released, ReleaseReason, Resume, Revoke, RoutedInput, Suspend, Terminate)

from .core_types import (OWED, ApplyInput, At, AwaitLog, ChunksReleased, Claim, ClaimAnswered, Command, CurrentIs,
                         EndedInStore, EndInStore, Event, FreezeCheck, FreezeExpired, Flush, GapCheck, GapExpired,
                         GapRead, Got, HandoffReady, InputApplied, InputFenced, Loaded, LoadState, LogRead, Note,
                         Offload, Offloaded, OffloadReady, ReadCurrent, ReadGap, ReadLog, ReadSession, Release, Send,
                         SessionRead, Snapshot, Snapshotted, SnapshotRefused, Then, Unauthentic)
from .ownership import EarlyInputs, Held, Refusal, command_refusal, stray_input_refusal, suspended_before_assign
from .schedule import Schedule

__all__ = ["WorkerCore", "Outgoing"]


# --- the core ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Outgoing:
    """The events a worker sends about its sessions, stamped with its id."""

    worker_id: str

    def reject(self, rec: Record, reason: RejectReason, detail: str, at: At) -> Send:
        return Send(CommandRejected(
            worker_id=self.worker_id, session_id=getattr(rec, "session_id", ""), command=rec.TAG, reason=reason,
            ts=at.wall, generation=getattr(rec, "generation", None), seq=getattr(rec, "seq", -1),
            detail=detail[:500], kind=getattr(rec, "kind", ""), payload=getattr(rec, "payload", ""),
            source_partition=getattr(rec, "source_partition", -1), source_offset=getattr(rec, "source_offset", -1)))

    def refuse(self, rec: Record, why: Refusal, at: At) -> Send:
        return self.reject(rec, why.reason, why.detail, at)

    def reject_all(self, recs: Iterable[RoutedInput], reason: RejectReason, detail: str, at: At) -> list[Command]:
        """Refuse inputs this worker will not apply: dispatch routes each again or refuses it."""
        return [self.reject(rec, reason, detail, at) for rec in recs]

    def released(self, sid: str, gen: Generation, reason: ReleaseReason, at: At, chunk_index: int = -1,
                 successor: Generation | None = None, detail: str = "") -> Send:
        return Send(Released(worker_id=self.worker_id, session_id=sid, generation=gen, ts=at.wall, reason=reason,
                             chunk_index=chunk_index, successor=successor, detail=detail[:500]))

    def frozen(self, rec: Handoff, sess: Held, at: At) -> list[Command]:
        """Report the session frozen at this boundary: dispatch moves it or resumes it here."""
        return [Flush(), Send(Frozen(worker_id=self.worker_id, session_id=rec.session_id, generation=sess.generation,
                                     target_worker=rec.target_worker, ts=at.wall, chunk_index=sess.released_chunk))]


@dataclass
class WorkerCore:
    """The sessions a worker holds and every decision on them."""

    worker_id: str
    gap_wait_s: float = 5.0
    sessions: dict[str, Held] = field(default_factory=dict)
    early: EarlyInputs = field(default_factory=EarlyInputs)
    schedule: Schedule = field(init=False)
    say: Outgoing = field(init=False)

    def __post_init__(self) -> None:
        self.schedule = Schedule(self.sessions)
        self.say = Outgoing(self.worker_id)

    def decide(self, event: Event, at: At) -> list[Command]:
        """What ``event`` leads to: commands for the shell, in order."""
        match event:
            case Got(rec=Assign() as rec):
                return self._assign(rec)
            case Got(rec=RoutedInput() as rec):
                return self._input(rec, at)
            case Got(rec=Terminate() | Revoke() | Suspend() | Handoff() | Resume() as rec):
                return self._command(rec, at)
            case Got(rec=rec):
                return [Note(f"{self.worker_id}: {rec.TAG} is not a worker command: passed over")]
            case Unauthentic(rec=rec, reason=reason):  # unsigned, unknown key or forged: never acted on
                return [self.say.reject(rec, reason, "command failed its authenticity check", at)]
            case ChunksReleased():
                return chunks_released(self, event, at)
            case GapCheck():
                return gap_check(self, at)
            case FreezeCheck(wait_s=wait_s):
                return [Then(FreezeExpired(sid, s, wait_s)) for sid, s in self.sessions.items()
                        if s.freeze_expired(at.mono, wait_s)]
            case OffloadReady() | HandoffReady() | GapExpired() | FreezeExpired():
                return self._later(event, at)
        return self._answer(event, at)

    def _answer(self, event: Event, at: At) -> list[Command]:
        """What a command's answer leads to."""
        match event:
            case CurrentIs():
                return current_is(self.say, event, at)
            case ClaimAnswered():
                return self._claim_answered(event, at)
            case Loaded():
                return self._loaded(event, at)
            case SessionRead(rec=Suspend() as rec, state=state, current=current):
                if suspended_before_assign(state, current, rec.generation):
                    return [EndInStore(rec)]  # the late Assign finds nothing to run
                return [self.say.refuse(rec, command_refusal(None, rec.generation), at)]
            case SessionRead(rec=RoutedInput() as rec, state=state, current=current):
                refusal = stray_input_refusal(rec, state, current)
                return [self.say.refuse(rec, refusal, at)] if refusal is not None else self._early(rec, at)
            case InputApplied(sid=sid, held=sess, rec=rec, skip_gaps=skip_gaps):
                sess.applied(rec)
                return [Send(InputAccepted(worker_id=self.worker_id, session_id=sid, generation=sess.generation,
                                           seq=rec.seq, ts=at.wall)), *self._next_input(sid, sess, skip_gaps, at)]
            case InputFenced(sid=sid, held=sess, rec=rec, why=why):
                sess.pending[rec.seq] = rec
                return self.drop(sid, sess, why, at)
            case GapRead(sid=sid, held=sess, logged=logged):
                if logged is not None:
                    sess.offer_logged(logged, self.worker_id, at.wall, self.gap_wait_s, upto=max(sess.pending))
                return self._next_input(sid, sess, True, at)
            case LogRead():
                return log_read(self, event, at)
            case EndedInStore():
                return ended_in_store(self, event, at)
            case Offloaded():
                return self._offloaded(event, at)
            case Snapshotted() | SnapshotRefused():
                return self._snapshot_answer(event, at)
        raise TypeError(f"not a worker event: {event!r}")

    def _later(self, event: OffloadReady | HandoffReady | GapExpired | FreezeExpired, at: At) -> list[Command]:
        """A decision carried to its point by ``Then``: on a session still held by then."""
        sid = event.rec.session_id if isinstance(event, (OffloadReady, HandoffReady)) else event.sid
        if self.sessions.get(sid) is not event.held:
            return []
        match event:
            case OffloadReady(rec=rec, held=sess):
                return [Offload(rec, sess)]
            case HandoffReady(rec=rec, held=sess):
                return [Snapshot(sid, sess, rec)]
            case GapExpired(held=sess):
                return self.apply_pending(sid, sess, at, skip_gaps=True)
            case FreezeExpired(held=sess, wait_s=wait_s) if sess.frozen_since is not None:
                sess.thaw(at.mono)
                self.schedule.add(sid, sess)
                return [Note(f"{self.worker_id}: handoff of {sid} not completed in {wait_s:.0f} s; serving it here "
                             "again", "warning"), *self.apply_pending(sid, sess, at)]
        return []

    def drop(self, sid: str, sess: Held, why: str, at: At) -> list[Command]:
        """Forget a session whose generation the store fenced (``why``: the refusal); its
        waiting inputs are refused as stale, so dispatch routes them to the current owner."""
        if self.sessions.get(sid) is sess:
            del self.sessions[sid]
        return [*self.say.reject_all(sess.take_pending(), "stale_epoch", f"fenced: {why}", at),
                self.say.released(sid, sess.generation, "fenced", at, sess.released_chunk, detail=why)]

    # --- Assign ---------------------------------------------------------------------------

    def _assign(self, rec: Assign) -> list[Command]:
        held = self.sessions.get(rec.session_id)
        if held is not None and held.generation == rec.generation:
            return [ReadCurrent(rec)]  # a duplicate delivery, or a replay of a generation that has passed
        return [Claim(rec)]

    def _claim_answered(self, event: ClaimAnswered, at: At) -> list[Command]:
        rec, sid = event.rec, event.rec.session_id
        if event.refusal is not None:
            return [self.say.refuse(rec, event.refusal, at),
                    *self.say.reject_all(self.early.take(sid, rec.generation), "not_owner",
                                         f"its Assign was refused: {event.refusal.detail}", at)]
        cmds: list[Command] = []
        if (held := self.sessions.pop(sid, None)) is not None:  # an older generation we held has passed
            cmds += self.say.reject_all(held.take_pending(), "stale_epoch", f"superseded by {rec.generation}", at)
        return [*cmds, LoadState(rec, restore=rec.restore)]

    def _loaded(self, event: Loaded, at: At) -> list[Command]:
        rec, sid = event.rec, event.rec.session_id
        if event.refusal is not None:  # corrupt, vanished, or over max_snapshot_bytes
            return [self.say.refuse(rec, event.refusal, at), Release(sid, rec.generation, close=False, flush=False),
                    *self.say.reject_all(self.early.take(sid, rec.generation), "not_owner",
                                         f"its session did not start here: {event.refusal.detail}", at)]
        if not event.found:  # never snapshotted (it went idle before its first): it starts new
            return [LoadState(rec, restore=False)]
        sess = Held(rec.generation, event.state, next_due=at.mono, input_pos=event.input_pos,
                    skipped=set(event.skipped))
        self.sessions[sid] = sess
        self.schedule.add(sid, sess)
        cmds: list[Command] = []
        if rec.recover:  # the inputs after the snapshot, from the log, read beside the serving loop
            sess.owe_replay()
            cmds.append(read_log(sid, sess))
        cmds.append(Send(Claimed(worker_id=self.worker_id, session_id=sid, generation=rec.generation, ts=at.wall)))
        others, refused = self.early.hand_over(sid, sess, self.gap_wait_s)
        for other in others:
            cmds.append(self.say.reject(other, "stale_epoch", f"held: {sess.generation}", at))
        cmds += [self.say.refuse(rec, why, at) for rec, why in refused]
        return [*cmds, *self.apply_pending(sid, sess, at)]

    # --- commands on a held session ---------------------------------------------------------

    def _command(self, rec: Terminate | Revoke | Suspend | Handoff | Resume, at: At) -> list[Command]:
        """A command on a session: carried out if it bears the generation held. A Terminate or
        Suspend may overtake the Assign of the same generation (they come from different
        agents): the store is asked whether that generation is current and ours (a close), or
        current, ours and active (an offload)."""
        sess = self.sessions.get(rec.session_id)
        if sess is None and isinstance(rec, (Terminate, Suspend)) and rec.generation.worker_id == self.worker_id:
            return [ReadCurrent(rec) if isinstance(rec, Terminate) else ReadSession(rec)]
        refusal = command_refusal(sess.generation if sess is not None else None, rec.generation)
        if refusal is not None:
            return [self.say.refuse(rec, refusal, at)]
        assert sess is not None
        match rec:
            case Suspend() | Handoff() if sess.replay_owed:  # its snapshot must hold every input
                sess.log_read_on_way = True  # the shell takes the read on its way, or makes one
                return [AwaitLog(rec.session_id, sess, rec)]
            case Suspend():
                sess.frozen_since = None  # an offload overrides a handoff: it keeps the inputs
                # a snapshot keeps no waiting input: what waits on a gap is applied past it (the seqs given up on travel)
                return [*self.apply_pending(rec.session_id, sess, at, skip_gaps=True), Then(OffloadReady(rec, sess))]
            case Handoff() if sess.frozen_since is None:  # what is in order goes into the snapshot
                return [*self.apply_pending(rec.session_id, sess, at), Then(HandoffReady(rec, sess))]
            case Handoff():  # a duplicate Handoff while frozen reports again
                return self.say.frozen(rec, sess, at)
            case Resume():  # the user is back, or a handoff was refused: run (again)
                sess.thaw(at.mono)
                self.schedule.add(rec.session_id, sess)
                return self.apply_pending(rec.session_id, sess, at)
            case Terminate() | Revoke():
                return self._stop(rec, sess, at)
        raise TypeError(f"not a session command: {rec!r}")

    def _stop(self, rec: Terminate | Revoke, sess: Held, at: At) -> list[Command]:
        sid, close, successor = rec.session_id, isinstance(rec, Terminate), getattr(rec, "successor", None)
        cmds: list[Command] = []
        if close:  # inputs still waiting for an earlier one are not applied: refused
            cmds += self.say.reject_all(sess.take_pending(), "closed",
                                        "the session closed while it waited for an earlier one", at)
        if successor is None:  # (after a handoff the store moved it already)
            cmds.append(Release(sid, rec.generation, close=close))
        self.sessions.pop(sid, None)
        cmds += self.say.reject_all(sess.take_pending(), "stale_epoch", f"the session moved to {successor}" if successor
                                    else "the session was revoked here", at)
        reason: ReleaseReason = "closed" if close else "migrated" if successor is not None else "revoked"
        return [*cmds, self.say.released(sid, rec.generation, reason, at, sess.released_chunk, successor,
                                     detail=getattr(rec, "reason", "") if reason == "revoked" else "")]

    def _offloaded(self, event: Offloaded, at: At) -> list[Command]:
        rec, sess, sid = event.rec, event.held, event.rec.session_id
        if event.fenced:
            return self.drop(sid, sess, event.refusal.detail if event.refusal else "", at)
        if event.refusal is not None:  # cannot offload: the session stays resident and says why
            if not sess.executing and self.sessions.get(sid) is sess:  # a handoff had frozen it: it runs
                sess.thaw(at.mono)  # (a Revoke still moves it, a Resume keeps it)
                self.schedule.add(sid, sess)
            return [self.say.refuse(rec, event.refusal, at)]
        self.sessions.pop(sid, None)
        return [self.say.released(sid, sess.generation, "suspended", at, sess.released_chunk)]

    def _snapshot_answer(self, event: Snapshotted | SnapshotRefused, at: At) -> list[Command]:
        match event:
            case SnapshotRefused(sid=sid, held=sess, refusal=refusal, fenced=True):
                return self.drop(sid, sess, refusal.detail, at)
            case SnapshotRefused(then=None, refusal=refusal):  # no checkpoint: a recovery replays from the last one
                return [Note(f"worker {self.worker_id}: periodic snapshot skipped: {refusal.detail}", "warning",
                             refusal.reason)]
            case SnapshotRefused(then=rec, refusal=refusal):  # its state cannot travel through Redis: keep serving here
                return [self.say.refuse(rec, refusal, at)]  # type: ignore[arg-type]
            case Snapshotted(then=None):
                return []
            case Snapshotted(then=Handoff() as rec, held=sess):
                sess.freeze(at.mono)
                return self.say.frozen(rec, sess, at)
        raise TypeError(f"not a snapshot answer: {event!r}")

    # --- inputs -----------------------------------------------------------------------------

    def _input(self, rec: RoutedInput, at: At) -> list[Command]:
        sess = self.sessions.get(rec.session_id)
        if sess is None:  # not held here: wait for the Assign, or let dispatch route it again
            return [ReadSession(rec)]
        if sess.generation.epoch < rec.generation.epoch:
            return self._early(rec, at)
        if (refusal := sess.offer(rec, self.gap_wait_s)) is not None:
            return [self.say.refuse(rec, refusal, at)]
        return self.apply_pending(rec.session_id, sess, at)

    def _early(self, rec: RoutedInput, at: At) -> list[Command]:
        refusal = self.early.keep(rec, at.mono)
        return [self.say.refuse(rec, refusal, at)] if refusal is not None else []

    def apply_pending(self, sid: str, sess: Held, at: At, skip_gaps: bool = False) -> list[Command]:
        """Apply the waiting inputs in order, each fenced in the store first; ``skip_gaps``
        (after the gap wait, or at an offload) past a missing one, once the log is read for it."""
        if skip_gaps and sess.has_gap():
            return [ReadGap(sid, sess)]
        return self._next_input(sid, sess, skip_gaps, at)

    def _next_input(self, sid: str, sess: Held, skip_gaps: bool, at: At) -> list[Command]:
        """The next input to fence and apply, one at a time (its answer leads to the next)."""
        if (rec := sess.next_input(at.mono, skip_gaps)) is None:
            return []
        return [ApplyInput(sid, sess, rec, _tuple(sess.skipped_news()), skip_gaps)]



# --- a recovery's inputs, the heartbeat's checks, a batch's chunks ---------------------------


def current_is(say: Outgoing, event: CurrentIs, at: At) -> list[Command]:
    """What the store's current generation means for a duplicate Assign, or for a close that
    came before its Assign."""
    match event:
        case CurrentIs(rec=Assign() as rec, current=current) if current != rec.generation:
            return [say.reject(rec, "stale_epoch" if current is not None else "unknown_session",
                                f"generation {rec.generation} has passed (now {current})", at)]
        case CurrentIs(rec=Assign()):
            return []  # a duplicate delivery of the command being served
        case CurrentIs(rec=Terminate() as rec, current=current) if current == rec.generation:
            return [EndInStore(rec)]  # ended in the store: the late Assign finds nothing to run
        case CurrentIs(rec=rec):
            return [say.refuse(rec, command_refusal(None, rec.generation), at)]  # type: ignore[arg-type]
    raise TypeError(f"not a store answer: {event!r}")


def ended_in_store(core: WorkerCore, event: EndedInStore, at: At) -> list[Command]:
    """A close or an offload that overtook its Assign, done in the store: the early inputs of
    its generation are refused, and it is reported released."""
    rec = event.rec
    if event.refusal is not None:
        return [core.say.refuse(rec, event.refusal, at)]
    close = isinstance(rec, Terminate)
    return [*core.say.reject_all(core.early.take(rec.session_id, rec.generation),
                                 "closed" if close else "not_owner", "ended before its Assign ran here", at),
            core.say.released(rec.session_id, rec.generation, "closed" if close else "suspended", at)]


def log_read(core: WorkerCore, event: LogRead, at: At) -> list[Command]:
    """A recovery's inputs read back: offered, and the session runs (a command that
    waited for them is decided again); when the read failed, a command that waited is
    refused and the read is made again at the next heartbeat."""
    sid, sess, then = event.sid, event.held, event.then
    sess.log_read_on_way = False
    if then is not None and event.logged is None:
        return [core.say.reject(then, "error", OWED, at)]
    if event.logged is not None and core.sessions.get(sid) is sess and sess.replay_owed:
        sess.offer_logged(event.logged, core.worker_id, at.wall, core.gap_wait_s)
        sess.replayed(at.mono)
        core.schedule.add(sid, sess)
        return core.decide(Got(then), at) if then is not None else core.apply_pending(sid, sess, at)
    return core.decide(Got(then), at) if then is not None else []


def read_log(sid: str, sess: Held) -> ReadLog:
    """Ask for a recovery's inputs, noting a read is on its way (none is asked for twice)."""
    sess.log_read_on_way = True
    return ReadLog(sid, sess)


def gap_check(core: WorkerCore, at: At) -> list[Command]:
    """Read again the recoveries' inputs whose read failed, apply the inputs after a missing
    one waited for long enough (it is refused as late if it comes), refuse early inputs
    whose Assign never came."""
    cmds: list[Command] = [read_log(sid, s) for sid, s in core.sessions.items()
                           if s.replay_owed and not s.log_read_on_way]
    cmds += [Then(GapExpired(sid, s)) for sid, s in core.sessions.items()
             if s.gap_expired(at.mono, core.gap_wait_s)]
    return cmds + core.say.reject_all(core.early.expired(at.mono, core.gap_wait_s), "not_owner",
                                      "no Assign of its generation came in time", at)


def chunks_released(core: WorkerCore, event: ChunksReleased, at: At) -> list[Command]:
    """Release the chunks the store revalidated, drop the sessions it fenced, schedule the
    next chunks, and take the periodic snapshots that bound what a recovery replays."""
    cmds: list[Command] = []
    sends: list[Command] = []
    for (sid, sess), out, (ok, why) in zip(event.due, event.outputs, event.verdicts):
        if not ok and why != "released":
            cmds += core.drop(sid, sess, str(why), at)
            continue
        sess.next_due = max(sess.next_due + event.interval_s, event.due_at)
        core.schedule.add(sid, sess)
        if not ok:  # recomputed after a recovery: an earlier owner already released it
            continue
        sess.released_chunk = out.chunk_index
        sends.append(Send(ChunkDone(
            worker_id=core.worker_id, session_id=sid, generation=sess.generation, chunk_index=out.chunk_index,
            ts=at.wall, latency_s=event.latency_s, batch_size=len(event.due), input_seq=out.input_seq,
            checksum=out.checksum)))
    every = event.snapshot_every
    checkpoints = [Snapshot(sid, sess) for sid, sess in event.due
                   if every and core.sessions.get(sid) is sess and sess.state.chunk_index % every == 0]
    return [*cmds, *sends, Flush(), *checkpoints]


def _tuple(seqs: list[int] | None) -> tuple[int, ...] | None:
    return tuple(seqs) if seqs is not None else None
