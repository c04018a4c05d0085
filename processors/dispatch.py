"""Dispatch decisions: which workers to try for a new session, and what to send where.

Pure: ``decide(view, event, now) -> (view, commands)`` takes the load view and one event
(with what the store said about its session) and returns commands as data; the shell in
``agents/dispatch.py`` carries them out. Session events go through the lifecycle table
(``lifecycle.transition``); the generation commit in Redis, not the ranking, decides
admission (DESIGN.md §3).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from schemas.records import (AdmissionPlan, Assign, CommandRejected, Frozen, Generation, PlacementReport, Record,
                             Resume, Revoke, RoutedInput, Suspend, Terminate)
from streams.store_records import SessionView, StoreState
from streams.store_ops import untold_from

from .admission import AdmitPlan, WorkerLoad, candidate
from .dispatch_types import (MAX_GAVE_UP, Admission, CloseInStore, Command, Commit, Committed, CommitRefused,
                             DispatchView, Event, Facts, Input, Move, Moved, MoveRefused, Note, Publish, ReadAgain,
                             Refuse, RefuseEvent, RequestClose, Retry, RetryLater, RouteAgain, Seen)
from .lifecycle import EVENT_KIND, INPUT_EVENT, STORE_STATE, Action, EventKind, SessionState, transition

__all__ = ["DispatchView", "Facts",
           "Input", "Admission", "Seen", "Committed", "CommitRefused", "Moved", "MoveRefused", "Retry",
           "Event", "Publish", "RouteAgain", "Commit", "Move", "RetryLater", "ReadAgain", "RequestClose", "CloseInStore",
           "Refuse", "RefuseEvent", "Note",
           "Command", "decide", "counted"]


# --- the dispatch core: decide(view, event, now) -> (view, commands) --------------------
#
# Dispatch is stateless about sessions: the store holds authority, so every event reaches
# the core together with what the shell read for it (the session's store view, whether its
# owner is down). The core says what to do; the shell (processors/agents/dispatch.py) does
# it and feeds the results back as events (a commit's outcome, a re-read). What it hears and
# says (the view, the events, the commands) is in processors/dispatch_types.py.



_CLOSED_ID = ("session {sid} was closed: a session id is not used again while the store keeps "
              "the closed session (store_retention_s)")
# an open read again (a rebalance, a restart: faust commits up to the first event not acked)
# after its session was served and closed: it had its verdict (refused, it had two: an outside run)
_READ_AGAIN = "the open of session {sid}, served and closed since, read again: passed over"
RETRY_S = 0.2  # an admission that found every worker full tries again after this
REREAD_S = 0.05
REPORT_EVERY_S = 0.1
_LIFECYCLE = {store: life for life, store in STORE_STATE.items()}


def decide(view: DispatchView, event: Event, now: float) -> tuple[DispatchView, list[Command]]:
    """Dispatch's every decision: admissions, session commands, input routing."""
    match event:
        case Seen(what=Input() as inp, facts=facts):
            return route(view, inp, facts, now)
        case Seen(what=AdmissionPlan() as rec):
            return planned(view, rec), []
        case Seen(what=rec, facts=facts) if type(rec) in EVENT_KIND:
            return on_session_event(view, rec, facts, now)
        case Seen(what=rec, facts=facts):
            return on_worker_event(view, rec, facts, now)
        case Committed(admission=adm, generation=gen, began=began):
            return admitted(view, adm, gen, began, now)
        case CommitRefused(admission=adm, worker=worker, reason="no_capacity"):
            return next_candidate(view, replace(adm, tried=adm.tried | {worker}), now)
        case CommitRefused(reason=reason) if reason != "no_capacity":
            return commit_refused(view, event, now)
        case Moved(session_id=sid, source=src, successor=succ, began=began):
            return counted(view, succ.worker_id, began, now)[0], _handed_over(sid, src, succ, now)
        case MoveRefused(session_id=sid, source=src, reason=reason) if reason in ("stale_epoch", "not_owner",
                                                                                    "unknown_session"):
            # the source's generation has passed (recovered elsewhere, or a duplicate
            # handoff already moved it): nothing to give back
            return view, [Note(f"handoff of {sid} from {src} not committed: {reason}")]
        case MoveRefused(session_id=sid, source=src, target=target, reason=reason):
            # the target is full, down or gone, or the user closed the session: keep it
            # where it is (a close's Terminate reaches the source as usual)
            return view, [Note(f"handoff of {sid} to {target} refused ({reason}); it stays on {src.worker_id}"),
                          Publish(Resume(worker_id=src.worker_id, session_id=sid, generation=src, ts=now))]
        case Retry(admission=adm, facts=Facts(session=SessionView() as sv)) if (
                sv.state == StoreState.CLOSED or sv.close_requested):
            cmds = [Note(f"session {adm.session_id} closed while it waited for a worker")]
            if adm.then_route is not None:
                why = f"session closed before input {adm.then_route.seq} was applied"
                cmds.append(Refuse(adm.then_route, _refusal(adm.then_route, why)))
            return view, cmds
        case Retry(admission=adm):
            return next_candidate(view, replace(adm, tried=frozenset()), now)
    raise TypeError(f"not a dispatch event: {event!r}")


def commit_refused(view: DispatchView, event: CommitRefused, now: float) -> tuple[DispatchView, list[Command]]:
    """A commit the store refused for a reason other than capacity: follow what the store
    holds (a redelivered event, another replica first), refuse an open of a closed id, or
    give up the admission (refusing the input that woke it)."""
    match event:
        case CommitRefused(admission=adm, reason="stale", facts=Facts(session=SessionView() as sv) as facts):
            # a redelivered event, or another replica was first: the session has a generation
            if adm.then_route is not None:
                return route(view, adm.then_route, facts, now)  # to where it is now
            if sv.state == StoreState.ACTIVE and not sv.stranded and not sv.claimed:
                return view, [_assign(adm, sv.generation, now)]  # its Assign may never have gone out
            return view, [Note(f"session {adm.session_id} has {sv.generation} ({sv.state.value}) already")]
        case CommitRefused(admission=adm, reason="unknown_session", facts=Facts(session=sv)) if _served(
                sv, adm.opened_by):  # the open of a session served and closed since, read again
            return view, [Note(_READ_AGAIN.format(sid=adm.session_id))]
        case CommitRefused(admission=adm, reason="unknown_session") if not (
                adm.restore or adm.recover or adm.then_route):  # an open of an id the store keeps closed
            # (the commit script answers a closed session so before it compares epochs)
            return view, [RefuseEvent(_CLOSED_ID.format(sid=adm.session_id))]
        case CommitRefused(admission=adm, detail=detail):
            cmds: list[Command] = [Note(f"session {adm.session_id} not admitted: {detail}")]
            if adm.then_route is not None:
                cmds.append(Refuse(adm.then_route, _refusal(adm.then_route, f"the session was not resumed: {detail}")))
            return view, cmds
    raise TypeError(f"not a refused commit: {event!r}")


def planned(view: DispatchView, rec: AdmissionPlan) -> DispatchView:
    """The control leader's newest admission plan replaces the one before."""
    if view.plan is not None and rec.ts <= view.plan.ts:
        return view
    plan = AdmitPlan(tuple((x.worker_id, x.count) for x in rec.order), dict(rec.pinned or {}), rec.fallback, rec.ts)
    return replace(view, plan=plan)


def next_candidate(view: DispatchView, adm: Admission, now: float) -> tuple[DispatchView, list[Command]]:
    """Commit on the best worker not yet tried (the policy's plan, :func:`candidate`); when
    none is left, wait (for a slot, or the policy's next plan) and try again. An open or a
    return that finds no room is refused at once when ``max_waiting`` others wait already, or
    when its session's admission gave up within the admission timeout; else it waits up to
    that timeout, and is refused with its event when it gives up."""
    sid = adm.session_id
    best = candidate(view.plan, view.workers, sid, adm.tried)
    if best is not None:
        return view, [Commit(adm, best)]
    timeout_s = view.admission_retries * RETRY_S
    if adm.budgeted and not adm.waiting:
        since = view.gave_up.get(sid)
        if since is not None and now - since < timeout_s:
            return view, _given_up(adm, f"no worker has room for session {sid} (its admission gave up "
                                        f"{max(now - since, 0.0):.0f} s ago)")
        if view.waiting >= view.max_waiting:
            return view, _given_up(adm, f"no worker has room for session {sid}, and {view.waiting} other "
                                        "sessions wait for room already")
    if adm.retries_left <= 0 and adm.budgeted:
        # remembered for an admission timeout: the session's next events and inputs that find
        # no room are refused at once (a flood of one id waits once)
        horizon = now - timeout_s
        kept = [(s, t) for s, t in view.gave_up.items() if t > horizon and s != sid][-(MAX_GAVE_UP - 1):]
        why = f"no worker had room for session {sid} within {timeout_s:.0f} s"
        return replace(view, gave_up=dict([*kept, (sid, now)])), _given_up(adm, why, error=True)
    if adm.retries_left <= 0:
        return view, [Note(f"no worker admitted session {sid}", error=True)]
    return view, [RetryLater(replace(adm, retries_left=adm.retries_left - 1, waiting=adm.budgeted), RETRY_S)]


def _given_up(adm: Admission, why: str, error: bool = False) -> list[Command]:
    """A user's admission given up: the input that woke it, or its event, refused with the
    reason (to dead-letters)."""
    if adm.then_route is not None:
        return [Note(why, error=error), Refuse(adm.then_route, _refusal(adm.then_route, f"{why}, to apply it"))]
    return [Note(why, error=error), RefuseEvent(why)]


def admitted(view: DispatchView, adm: Admission, gen: Generation, began: float,
             now: float) -> tuple[DispatchView, list[Command]]:
    """A generation committed: assign it, route the input that woke it, count the slot."""
    cmds: list[Command] = [_assign(adm, gen, now)]
    if adm.then_route is not None:
        cmds.append(_routed(adm.then_route, gen, now))
    view, report = counted(view, gen.worker_id, began, now)
    return view, cmds + report


def counted(view: DispatchView, worker: str, began: float, now: float) -> tuple[DispatchView, list[Command]]:
    """One more slot used on ``worker`` by a commit sent at ``began``; a placement report at
    most every REPORT_EVERY_S. The cached loads count it already when their read ended after
    the commit was sent (it may have seen the slot: counted twice, a report ran past the
    sessions open); they miss it for a moment at worst, until the next read."""
    cmds: list[Command] = []
    workers = dict(view.workers)
    if worker in workers and view.read_at <= began:  # keep the cached view close to the truth between reads
        w = workers[worker]
        workers[worker] = WorkerLoad(w.used + 1, w.capacity, w.draining, w.down)
    view = replace(view, workers=workers)
    if now - view.reported_at >= REPORT_EVERY_S:  # the workers serving: a down one's slots are not
        view = replace(view, reported_at=now)
        up = sorted((k, v.used) for k, v in workers.items() if not v.down)
        cmds.append(Publish(PlacementReport(
            ts=now, workers=len(up), sessions=sum(n for _, n in up), source=view.source, loads=dict(up[:256]))))
    return view, cmds


def on_session_event(view: DispatchView, rec: Record, facts: Facts,
                     now: float) -> tuple[DispatchView, list[Command]]:
    """A session event, through the lifecycle table from the state the store holds."""
    sv, sid = facts.session, rec.session_id  # type: ignore[attr-defined]
    state = _LIFECYCLE[StoreState(sv.state)] if sv is not None else None
    kind = EVENT_KIND[type(rec)]
    _, action = transition(state, kind)
    if action is Action.PLACE:
        return next_candidate(view, _admission(view, sid, prompt=getattr(rec, "prompt", ""), for_event=True,
                                               opened_by=facts.place), now)
    closing = state is SessionState.TERMINATED or (sv is not None and sv.close_requested)
    if closing and kind is EventKind.OPEN and _served(sv, facts.place):
        return view, [Note(_READ_AGAIN.format(sid=sid))]
    if closing and kind in (EventKind.OPEN, EventKind.ACTIVE):  # a close asked for is a close: its
        # owner releases it at its next chunk boundary, and a Resume sent meanwhile found none
        return view, [RefuseEvent(_CLOSED_ID.format(sid=sid))]
    if kind is EventKind.IDLE and state is not SessionState.TERMINATED and closing:  # nothing to offload: a Suspend
        # sent meanwhile met the close (or an owner that had released it)
        return view, [Note(f"{rec.TAG} for session {sid}, whose close is under way")]
    if sv is None:  # an idle or a close of a session never opened (or closed and forgotten): said
        return view, [RefuseEvent(f"{rec.TAG} for session {sid}, which the store does not know "
                                  "(never opened, or closed past its retention)")]
    if state is SessionState.TERMINATED:  # a close again, or an idle after it: settled already
        return view, [Note(f"{rec.TAG} for session {sid}, closed already")]
    gen = sv.generation
    if action is Action.RESUME:
        return next_candidate(view, _restore(view, sid, sv, for_event=True), now)
    if action is Action.SUSPEND:
        return view, [Publish(Suspend(worker_id=gen.worker_id, session_id=sid, generation=gen, ts=now))]
    if action is Action.TERMINATE and state is SessionState.SUSPENDED:
        return view, [CloseInStore(sid, gen)]  # nobody holds it
    if action is Action.TERMINATE:
        # a close wins over any move still to come (recovery, migration); a session whose
        # owner is down is released by the recovery sweep, the others by their owner
        cmds: list[Command] = [RequestClose(sid)]
        if not (sv.stranded or facts.owner_down):
            cmds.append(Publish(Terminate(worker_id=gen.worker_id, session_id=sid, generation=gen, ts=now)))
        return view, cmds
    return view, _reassert(sid, rec, sv, kind, now)


def _reassert(sid: str, rec: Record, sv: SessionView, kind: EventKind, now: float) -> list[Command]:
    """A duplicate event changes no state, but the command the state owes is sent again: an
    unclaimed generation's Assign (dispatch may have died between its commit and its send:
    faust sends what an event caused when it commits the event's offset), and the owner's
    Resume when the user is back (it cancels a Suspend still on its way)."""
    gen = sv.generation
    if sv.state != StoreState.ACTIVE or sv.stranded:
        return []
    if kind is EventKind.OPEN and not sv.claimed:
        return [_assign(Admission(sid, prompt=getattr(rec, "prompt", "")), gen, now)]
    if kind is EventKind.ACTIVE:
        resume = Publish(Resume(worker_id=gen.worker_id, session_id=sid, generation=gen, ts=now))
        if not sv.claimed:  # a return's restore read again (or a return that placed an unknown id,
            # as an open with no prompt; an open before it, read again first, sent its own)
            again = gen.epoch > 1
            return [_assign(Admission(sid, restore=again, recover=again), gen, now), resume]
        return [resume]
    return []


def on_worker_event(view: DispatchView, rec: Record, facts: Facts,
                    now: float) -> tuple[DispatchView, list[Command]]:
    """Commit a handoff the source froze for; bring back a session whose Resume found it
    offloaded; route again an input its owner refused."""
    sv = facts.session
    match rec:
        case Frozen(session_id=sid, generation=src, target_worker=target):
            if sv is not None and _moved_unclaimed(sv, src, target):
                # read again: the move was committed, but the replica that committed it died
                # before its Assign went out (sent when the Frozen's offset is committed)
                return view, _handed_over(sid, src, sv.generation, now)
            return view, [Move(sid, src, target)]
        case CommandRejected(command=Resume.TAG, generation=Generation() as gen):
            # the Resume overtook a pending Suspend: the session is offloaded now
            if sv is not None and sv.generation == gen and _wakes(sv, EventKind.ACTIVE):
                return next_candidate(view, _restore(view, rec.session_id, sv), now)
        case CommandRejected(command=RoutedInput.TAG, generation=Generation()):
            # the record the owner refused keeps its place in the log (its owner names it): a
            # dead letter is that record's, and the next owner judges it as the record it is
            return route(view, Input(rec.session_id, rec.seq, rec.kind, rec.payload, rec.ts, rec.source_partition,
                                     rec.source_offset, refused=rec, rereads_left=0), facts, now)
    return view, []


def _moved_unclaimed(sv: SessionView, src: Generation, target: str) -> bool:
    """The session's current generation is a successor of ``src`` on ``target`` that nobody
    claimed yet: a handoff from ``src`` to ``target`` was committed already."""
    gen = sv.generation
    return (sv.state == StoreState.ACTIVE and not sv.claimed and not sv.stranded and not sv.close_requested
            and gen.worker_id == target and gen.epoch > src.epoch)


def _handed_over(sid: str, src: Generation, succ: Generation, now: float) -> list[Command]:
    """A committed handoff's commands: the target restores the frozen snapshot and replays
    the inputs after it from the log (one routed to the source that dies before refusing it
    back is not lost; duplicates of the rest are applied once, by seq), the source lets go."""
    return [Publish(Assign(worker_id=succ.worker_id, session_id=sid, generation=succ, ts=now, restore=True,
                           recover=True)),
            Publish(Revoke(worker_id=src.worker_id, session_id=sid, generation=src, ts=now,
                           reason="migrated", successor=succ))]


def route(view: DispatchView, inp: Input, facts: Facts, now: float) -> tuple[DispatchView, list[Command]]:
    """Route an input to its session's owner, stamped with the generation. One for an
    offloaded session wakes it (restored, then routed); one whose owner is down is held in
    the log (the recovery replays it, or the close refuses it); an unknown session is read
    again for a while (its open may be in flight), and for as long as its open waits for
    room (up to the admission timeout, as the open does); a closed one refuses it."""
    sv, refused = facts.session, inp.refused
    if sv is None and facts.open_waits:  # waits with its open, its own rereads kept for after
        return view, [ReadAgain(Seen(inp, facts), RETRY_S)]
    if sv is None and inp.rereads_left > 0 and inp.session_id not in view.gave_up:  # its open refused: no wait
        return view, [ReadAgain(Seen(replace(inp, rereads_left=inp.rereads_left - 1), facts), REREAD_S)]
    resting = sv is not None and sv.state in (StoreState.CLOSED, StoreState.SUSPENDED)
    if resting and inp.seq <= (sv.input_seq or 0):  # at or below the last applied: nothing to wake it for
        if inp.seq < untold_from(sv.skipped):  # the store's list of given-up seqs no longer reaches it
            return view, [Refuse(inp, _refusal(inp, f"input {inp.seq} came after its session "
                                                    f"{'closed' if sv.state == StoreState.CLOSED else 'was offloaded'}, "
                                                    "older than the inputs it still tells apart (late, or a "
                                                    "copy of one applied, whose InputAccepted stands)"))]
        if inp.seq not in sv.skipped:  # a copy of one applied (a redelivery, a recovery's replay);
            # one refused at dispatch and passed over is among the skipped, as a gap given up on is
            return view, [Note(f"{inp.session_id}: input {inp.seq} came again after the session "
                               f"{'closed' if sv.state == StoreState.CLOSED else 'was offloaded'}; it was settled before")]
        late = f"input {inp.seq} came after its session gave up waiting for it and applied later ones (late)"
        return view, [Refuse(inp, _refusal(inp, late))]
    if sv is None or sv.state == StoreState.CLOSED:  # closed: whether it came after the close or was
        # handed back by the owner the close released, the same words (an outside producer read
        # "unknown or closed" for its own inputs racing a close)
        why = f"session closed before input {inp.seq} was applied" if sv is not None else _no_owner(view, inp.session_id)
        return view, [Refuse(inp, _refusal(inp, why))]
    if refused is not None and refused.reason not in ("stale_epoch", "not_owner"):
        return view, [Refuse(inp, _refusal(inp, f"input {inp.seq} refused by its owner"))]
    if _wakes(sv, INPUT_EVENT):
        return next_candidate(view, _restore(view, inp.session_id, sv, then_route=inp), now)
    if sv.stranded or facts.owner_down:
        return view, []  # held in the log
    if refused is not None and refused.generation == sv.generation and _unassigned(sv):
        # its owner-to-be kept it and no Assign came: the one committed was lost with the
        # replica that committed it (sent at its event's offset commit); send it again
        return view, [_assign(Admission(inp.session_id, restore=True, recover=True), sv.generation, now),
                      _routed(inp, sv.generation, now)]
    return view, [_routed(inp, sv.generation, now)]



def _wakes(sv: SessionView, kind: EventKind) -> bool:
    """Whether ``kind`` resumes the session the store holds (the lifecycle table's RESUME)."""
    return transition(_LIFECYCLE[StoreState(sv.state)], kind)[1] is Action.RESUME


def _no_owner(view: DispatchView, sid: str) -> str:
    """Why an input of a session the store does not know is refused."""
    if sid in view.gave_up:  # its open waited for room and found none
        return f"no owner for session: its open was refused (no worker had room for session {sid})"
    return "no owner for session: never opened, or closed past its retention"

def _served(sv: SessionView | None, place: str) -> bool:
    """Whether the open at ``place`` is the one that opened ``sv`` (the store keeps where it sits)."""
    return sv is not None and bool(place) and sv.opened_by == place


def _unassigned(sv: SessionView) -> bool:
    """Placed again (a restore, a move, a recovery: any generation after the first) and not
    claimed yet: its Assign can be sent again from what the store holds (a first one, an
    open's, needs its prompt: the open read again sends it)."""
    return sv.state == StoreState.ACTIVE and not sv.claimed and sv.generation.epoch > 1


def _admission(view: DispatchView, sid: str, **how: Any) -> Admission:
    return Admission(sid, retries_left=view.admission_retries, **how)


def _restore(view: DispatchView, sid: str, sv: Any, **how: Any) -> Admission:
    """Restore an offloaded session; when the generation it was offloaded under was never
    claimed (its Suspend overtook the Assign: a recovery whose Assign was lost, say) or its
    owner was declared lost before the offload (a restarted worker ends a Suspend of what it
    no longer holds), inputs routed to it may never have been applied, so the restore
    replays the log after the snapshot too (one applied already is applied once, by seq)."""
    lost = not sv.claimed or sv.stranded_epoch == sv.generation.epoch
    return _admission(view, sid, expected_epoch=sv.generation.epoch, restore=True, recover=lost, **how)


def _refusal(inp: Input, why: str) -> str:
    rec = inp.refused
    return why if rec is None else f"{why} ({rec.reason} at {rec.worker_id}: {rec.detail})"


def _assign(adm: Admission, gen: Generation, now: float) -> Publish:
    return Publish(Assign(worker_id=gen.worker_id, session_id=adm.session_id, generation=gen, ts=now,
                          prompt=adm.prompt, restore=adm.restore, recover=adm.recover))


def _routed(inp: Input, gen: Generation, now: float) -> Publish | RouteAgain:
    """An input to its owner: a first routing published as it is, one its owner refused
    routed again (the shell names in it the inputs refused lately)."""
    rec = RoutedInput(worker_id=gen.worker_id, session_id=inp.session_id, generation=gen,
                      seq=inp.seq, kind=inp.kind, payload=inp.payload, ts=now,  # type: ignore[arg-type]
                      source_partition=inp.partition, source_offset=inp.offset,
                      refused_before=inp.refused_before)
    return Publish(rec) if inp.refused is None else RouteAgain(rec)
