"""The dispatch core (``processors.dispatch.decide``): pure, table-driven, commands as data.

No Kafka, no Redis: the store's view of a session is given as facts, and a commit's outcome
is fed back as an event, the way the shell does it.
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError, fields, replace

import pytest

from processors.dispatch import (Admission, CloseInStore, Commit, Committed, CommitRefused, DispatchView,
                                 Facts, Input, Move, Moved, MoveRefused, Note, Publish, ReadAgain, Refuse, RequestClose, Retry,
                                 RetryLater, Seen, decide)
from processors.admission import WorkerLoad
from processors.lifecycle import STORE_STATE, Action, EventKind, transition
from schemas.records import (Assign, CommandRejected, Frozen, Generation, PlacementReport, Resume, Revoke,
                             RoutedInput, SessionActive, SessionClosed, SessionIdle, SessionOpened,
                             Suspend)
from streams.generations import SessionView, SnapshotManifest, StoreState

GEN = Generation("w1", 3)
VIEW = DispatchView({"w1": WorkerLoad(1, 2), "w2": WorkerLoad(0, 2), "w3": WorkerLoad(2, 2)},
                    admission_retries=2)
EVENTS = {EventKind.OPEN: SessionOpened(session_id="s", ts=1.0, prompt="p"),
          EventKind.ACTIVE: SessionActive(session_id="s", ts=1.0),
          EventKind.IDLE: SessionIdle(session_id="s", ts=1.0),
          EventKind.CLOSE: SessionClosed(session_id="s", ts=1.0)}


def _sv(state: StoreState, claimed: bool = True, stranded: bool = False) -> SessionView:
    return SessionView(GEN, state, claimed, 0, 0, None, stranded_epoch=GEN.epoch if stranded else None)


def _kinds(cmds: list) -> list[str]:
    return [type(c.record).__name__ if isinstance(c, Publish) else type(c).__name__ for c in cmds]


@pytest.mark.parametrize("store_state", [None, *StoreState])
@pytest.mark.parametrize("kind", list(EventKind))
def test_session_events_follow_the_lifecycle_table(store_state, kind):
    """Every (store state, event) pair does what the one transition table says, and nothing
    else: a placement or a resume commits, a suspend or terminate sends that command, and a
    pair whose action is NONE changes nothing (at most it re-sends what the state owes)."""
    life = {v: k for k, v in STORE_STATE.items()}.get(store_state) if store_state else None
    _, action = transition(life, kind)
    facts = Facts(_sv(store_state) if store_state else None)
    _, cmds = decide(VIEW, Seen(EVENTS[kind], facts), 5.0)
    got = _kinds(cmds)
    if action is Action.PLACE:
        assert got == ["Commit"] and cmds[0].admission.expected_epoch == 0 and cmds[0].worker == "w2"
    elif action is Action.RESUME:
        assert got == ["Commit"] and cmds[0].admission.restore and cmds[0].admission.expected_epoch == GEN.epoch
    elif action is Action.SUSPEND:
        assert got == ["Suspend"] and cmds[0].record.generation == GEN
    elif action is Action.TERMINATE and store_state is StoreState.SUSPENDED:
        assert got == ["CloseInStore"]
    elif action is Action.TERMINATE:
        assert got == ["RequestClose", "Terminate"]
    elif store_state is StoreState.CLOSED and kind in (EventKind.OPEN, EventKind.ACTIVE):
        assert got == ["RefuseEvent"] and "is not used again" in cmds[0].why  # a closed id, reused
    elif store_state is None:  # an idle or a close of a session never opened: refused, said
        assert got == ["RefuseEvent"] and "which the store does not know" in cmds[0].why
    else:
        assert set(got) <= {"Note", "Resume", "Assign"}, got
        assert not any(isinstance(c, (Commit, CloseInStore, RequestClose)) for c in cmds)


def test_a_close_for_a_lost_owner_is_left_to_the_recovery():
    _, cmds = decide(VIEW, Seen(EVENTS[EventKind.CLOSE], Facts(_sv(StoreState.ACTIVE), owner_down=True)), 1.0)
    assert _kinds(cmds) == ["RequestClose"]
    _, cmds = decide(VIEW, Seen(EVENTS[EventKind.CLOSE], Facts(_sv(StoreState.ACTIVE, stranded=True))), 1.0)
    assert _kinds(cmds) == ["RequestClose"]


def test_a_redelivered_open_resends_the_assign_only_while_unclaimed():
    _, cmds = decide(VIEW, Seen(EVENTS[EventKind.OPEN], Facts(_sv(StoreState.ACTIVE, claimed=False))), 1.0)
    assert _kinds(cmds) == ["Assign"] and cmds[0].record.generation == GEN and cmds[0].record.prompt == "p"
    _, cmds = decide(VIEW, Seen(EVENTS[EventKind.OPEN], Facts(_sv(StoreState.ACTIVE))), 1.0)
    assert cmds == []


def test_an_admission_tries_workers_best_first_then_waits_then_gives_up():
    adm = Admission("s", retries_left=1)
    _, cmds = decide(VIEW, CommitRefused(adm, "w2", "no_capacity"), 1.0)
    assert cmds == [Commit(Admission("s", retries_left=1, tried=frozenset({"w2"})), "w1")]
    _, cmds = decide(VIEW, CommitRefused(cmds[0].admission, "w1", "no_capacity"), 1.0)
    assert _kinds(cmds) == ["RetryLater"] and cmds[0].admission.retries_left == 0
    _, again = decide(VIEW, Retry(cmds[0].admission), 1.0)  # a fresh pass over every worker
    assert again == [Commit(Admission("s", retries_left=0), "w2")]
    inp = Input("s", 4, "text", "hi")
    full = DispatchView({"w1": WorkerLoad(2, 2)})
    _, cmds = decide(full, Retry(Admission("s", then_route=inp)), 1.0)
    assert _kinds(cmds) == ["Note", "Refuse"] and cmds[0].error and cmds[1].input == inp


def test_an_open_that_finds_no_room_waits_within_a_budget_and_is_refused_with_its_event():
    """An open (or a return, or an input waking an offloaded session) that finds every worker
    full waits for room up to the admission timeout, then is refused with its event
    (dead-lettered with the reason, not only logged); one that finds ``max_waiting`` others
    waiting already is refused at once, and so is one whose session's admission gave up
    within the timeout (a flood of one id, or a session's inputs, wait once)."""
    full = DispatchView({"w1": WorkerLoad(2, 2)}, admission_retries=5)  # a 1 s timeout
    opened = Seen(EVENTS[EventKind.OPEN], Facts(None))
    view, cmds = decide(full, opened, 10.0)
    assert _kinds(cmds) == ["RetryLater"] and cmds[0].admission.waiting and cmds[0].admission.for_event
    view, cmds = decide(replace(view, waiting=5), Retry(replace(cmds[0].admission, retries_left=0)), 11.0)
    assert _kinds(cmds) == ["Note", "RefuseEvent"]  # a waiting one is not counted against the budget
    assert cmds[1].why == "no worker had room for session s within 1 s" and view.gave_up == {"s": 11.0}
    _, cmds = decide(view, opened, 11.5)  # again, within the timeout: at once
    assert _kinds(cmds) == ["Note", "RefuseEvent"] and "gave up 0 s ago" in cmds[1].why
    _, cmds = decide(view, opened, 12.5)  # after it: waits again
    assert _kinds(cmds) == ["RetryLater"]
    other = Seen(SessionOpened(session_id="t", ts=1.0, prompt=""), Facts(None))
    _, cmds = decide(replace(full, waiting=full.max_waiting), other, 10.0)
    assert _kinds(cmds) == ["Note", "RefuseEvent"] and "256 other sessions wait for room already" in cmds[1].why
    _, cmds = decide(replace(full, waiting=full.max_waiting - 1), other, 10.0)
    assert _kinds(cmds) == ["RetryLater"]
    returned = Seen(EVENTS[EventKind.ACTIVE], Facts(_sv(StoreState.SUSPENDED)))
    _, cmds = decide(replace(full, waiting=full.max_waiting), returned, 10.0)
    assert _kinds(cmds) == ["Note", "RefuseEvent"]  # a return is an event's admission too
    woken = Seen(Input("s", 7, "text", "hi", partition=0, offset=9), Facts(_sv(StoreState.SUSPENDED)))
    _, cmds = decide(view, woken, 11.5)  # an input waking it, within the timeout: refused at once
    assert _kinds(cmds) == ["Note", "Refuse"] and cmds[1].input.seq == 7 and "gave up 0 s ago" in cmds[1].why
    _, cmds = decide(view, woken, 12.5)
    assert _kinds(cmds) == ["RetryLater"] and cmds[0].admission.waiting  # counted in the budget too
    recovery = Admission("s", restore=True, recover=True, retries_left=0)
    _, cmds = decide(replace(full, waiting=full.max_waiting), Retry(recovery), 10.0)
    assert _kinds(cmds) == ["Note"]  # a recovery is no event's: it is never refused so


def test_the_sessions_whose_admission_gave_up_are_remembered_within_a_bound():
    from processors.dispatch_types import MAX_GAVE_UP

    view = DispatchView({"w1": WorkerLoad(2, 2)}, admission_retries=5)
    for i in range(MAX_GAVE_UP + 10):
        adm = Admission(f"s{i}", for_event=True, waiting=True)
        view, _ = decide(view, Retry(adm), 100.0)
    assert len(view.gave_up) == MAX_GAVE_UP and f"s{MAX_GAVE_UP + 9}" in view.gave_up and "s0" not in view.gave_up
    view, _ = decide(view, Retry(Admission("late", for_event=True, waiting=True)), 102.0)
    assert view.gave_up == {"late": 102.0}  # those older than the timeout are forgotten


def test_a_committed_generation_is_assigned_counted_and_reported():
    inp = Input("s", 1, "text", "wake up", partition=2, offset=7)
    view, cmds = decide(VIEW, Committed(Admission("s", restore=True, then_route=inp), Generation("w2", 4)), 9.0)
    assert _kinds(cmds) == ["Assign", "RoutedInput", "PlacementReport"]
    assign, routed, report = (c.record for c in cmds)
    assert assign.restore and assign.worker_id == "w2" and assign.ts == 9.0
    assert (routed.generation, routed.seq, routed.source_partition, routed.source_offset) == (Generation("w2", 4), 1, 2, 7)
    assert view.workers["w2"].used == 1 and report.sessions == 4
    _, cmds = decide(view, Committed(Admission("t"), Generation("w2", 1)), 9.05)
    assert not any(isinstance(c, Publish) and isinstance(c.record, PlacementReport) for c in cmds)
    # a worker declared down is not in the placement (its report read 8 workers beside control's 3)
    down = replace(VIEW, workers={**VIEW.workers, "w3": WorkerLoad(2, 2, down=True)})
    _, cmds = decide(down, Committed(Admission("u"), Generation("w1", 1)), 9.0)
    (report,) = [c.record for c in cmds if isinstance(c.record, PlacementReport)]
    assert (report.workers, report.sessions, report.loads) == (2, 2, {"w1": 2, "w2": 0})


def test_a_stale_commit_follows_what_the_store_holds_and_other_refusals_refuse_the_waiting_input():
    inp = Input("s", 2, "text", "x")
    active = Facts(_sv(StoreState.ACTIVE))
    _, cmds = decide(VIEW, CommitRefused(Admission("s", then_route=inp), "w1", "stale", active), 1.0)
    assert _kinds(cmds) == ["RoutedInput"] and cmds[0].record.generation == GEN  # to where it is now
    unclaimed = Facts(_sv(StoreState.ACTIVE, claimed=False))  # a redelivered open: its Assign again
    _, cmds = decide(VIEW, CommitRefused(Admission("s", prompt="p"), "w1", "stale", unclaimed), 1.0)
    assert _kinds(cmds) == ["Assign"] and cmds[0].record.generation == GEN and cmds[0].record.prompt == "p"
    for facts in (active, Facts(_sv(StoreState.SUSPENDED))):  # claimed, or offloaded: nothing to send
        _, cmds = decide(VIEW, CommitRefused(Admission("s", prompt="p"), "w1", "stale", facts), 1.0)
        assert _kinds(cmds) == ["Note"]
    # an open of an id the store keeps closed: refused, said why; a resume the close overtook is not
    _, cmds = decide(VIEW, CommitRefused(Admission("s", prompt="p"), "w1", "unknown_session", detail="closed"), 1.0)
    assert _kinds(cmds) == ["RefuseEvent"] and "session s was closed" in cmds[0].why
    _, cmds = decide(VIEW, CommitRefused(Admission("s", restore=True), "w1", "unknown_session", detail="closed"), 1.0)
    assert _kinds(cmds) == ["Note"]
    _, cmds = decide(VIEW, CommitRefused(Admission("s", then_route=inp), "w1", "closed", detail="closed"), 1.0)
    assert _kinds(cmds) == ["Note", "Refuse"]


@pytest.mark.parametrize("facts,expect", [
    (Facts(_sv(StoreState.ACTIVE)), ["RoutedInput"]),
    (Facts(_sv(StoreState.ACTIVE), owner_down=True), []),  # held in the log for the recovery
    (Facts(_sv(StoreState.ACTIVE, stranded=True)), []),
    (Facts(_sv(StoreState.SUSPENDED)), ["Commit"]),  # wakes it; routed once placed
    (Facts(_sv(StoreState.CLOSED)), ["Refuse"]),
    (Facts(None), ["ReadAgain"]),  # its open may be in flight
])
def test_inputs_are_routed_held_woken_or_refused(facts, expect):
    inp = Input("s", 1, "text", "x", rereads_left=1)
    _, cmds = decide(VIEW, Seen(inp, facts), 1.0)
    assert _kinds(cmds) == expect
    if expect == ["Commit"]:
        assert cmds[0].admission.then_route == inp and cmds[0].admission.restore
    if expect == ["ReadAgain"]:
        _, cmds = decide(VIEW, cmds[0].event, 1.0)  # read again, still unknown, none left
        assert _kinds(cmds) == ["Refuse"]


def test_a_commit_is_counted_once_whether_or_not_the_loads_read_after_it_saw_its_slot():
    """The shell reads the loads before it decides on a commit's outcome; a read that ended
    after the commit was sent may count the slot already (a report then counted a session
    twice, 5 of 4 open), so the core adds it only to loads read before the commit."""
    read = replace(VIEW, read_at=5.0)
    before, _ = decide(read, Committed(Admission("s"), Generation("w2", 1), began=5.5), 9.0)
    assert before.workers["w2"].used == 1  # read before the commit: the slot is new to it
    after, cmds = decide(read, Committed(Admission("s"), Generation("w2", 1), began=4.5), 9.0)
    assert after.workers["w2"].used == 0 and _kinds(cmds) == ["Assign", "PlacementReport"]
    moved, _ = decide(read, Moved("s", GEN, Generation("w2", 4), began=4.9), 9.0)
    assert moved.workers["w2"].used == 0
    moved, _ = decide(read, Moved("s", GEN, Generation("w2", 4), began=5.0), 9.0)
    assert moved.workers["w2"].used == 1


def test_dispatch_commits_a_handoff_then_assigns_the_target_and_revokes_the_source():
    """The source only freezes and reports; the ownership commit is dispatch's."""
    frozen = Frozen(worker_id="w1", session_id="s", generation=GEN, target_worker="w2", ts=1.0)
    _, cmds = decide(VIEW, Seen(frozen, Facts(None)), 2.0)
    assert cmds == [Move("s", GEN, "w2")]
    succ = Generation("w2", 4)
    view, cmds = decide(VIEW, Moved("s", GEN, succ), 2.0)
    assert [c.record for c in cmds] == [
        Assign(worker_id="w2", session_id="s", generation=succ, ts=2.0, restore=True, recover=True),
        Revoke(worker_id="w1", session_id="s", generation=GEN, ts=2.0, reason="migrated", successor=succ)]
    assert view.workers["w2"].used == 1
    _, cmds = decide(VIEW, MoveRefused("s", GEN, "w2", "no_capacity"), 2.0)  # kept where it is
    assert _kinds(cmds) == ["Note", "Resume"] and cmds[1].record.generation == GEN
    _, cmds = decide(VIEW, MoveRefused("s", GEN, "w2", "stale_epoch"), 2.0)  # it has passed anyway
    assert _kinds(cmds) == ["Note"]


def test_a_frozen_read_again_after_its_move_was_committed_sends_the_move_again():
    """faust publishes what a replica sends for an event when it commits the event's offset:
    a replica killed between the store's commit and that left the successor unclaimed, and
    the Frozen is read again by another replica. It sends the Assign and Revoke again."""
    frozen = Frozen(worker_id="w1", session_id="s", generation=GEN, target_worker="w2", ts=1.0)
    succ = Generation("w2", 4)
    moved = SessionView(succ, StoreState.ACTIVE, False, 0, 0, None)
    _, cmds = decide(VIEW, Seen(frozen, Facts(moved)), 2.0)
    assert [c.record for c in cmds] == [
        Assign(worker_id="w2", session_id="s", generation=succ, ts=2.0, restore=True, recover=True),
        Revoke(worker_id="w1", session_id="s", generation=GEN, ts=2.0, reason="migrated", successor=succ)]
    for done in (replace(moved, claimed=True),  # the target has it: the move's refusal says so
                 replace(moved, generation=Generation("w3", 4)),  # moved elsewhere (recovered)
                 replace(moved, close_requested=True),
                 replace(moved, stranded_epoch=4)):  # the target died: the recovery's
        _, cmds = decide(VIEW, Seen(frozen, Facts(done)), 2.0)
        assert cmds == [Move("s", GEN, "w2")], done


def test_a_restore_whose_assign_was_lost_is_assigned_again_when_its_event_or_its_input_says_so():
    """A return (or an input) committed a restore and its replica died before the Assign went
    out. The return read again sends the Assign (and the Resume it sent before); an input the
    owner-to-be refused for want of an Assign sends it too, then the input. An open's
    generation (the first) is left to the open read again, which has the prompt."""
    snap = SnapshotManifest("snap", 1, 10, "0" * 64, GEN.epoch - 1)
    restored = SessionView(GEN, StoreState.ACTIVE, False, 0, 0, snap)
    _, cmds = decide(VIEW, Seen(EVENTS[EventKind.ACTIVE], Facts(restored)), 2.0)
    assert _kinds(cmds) == ["Assign", "Resume"]
    assert cmds[0].record.generation == GEN and cmds[0].record.restore and cmds[0].record.recover
    _, cmds = decide(VIEW, Seen(EVENTS[EventKind.ACTIVE], Facts(replace(restored, claimed=True))), 2.0)
    assert _kinds(cmds) == ["Resume"]
    first = replace(restored, generation=Generation("w1", 1), snapshot=None)  # a return placed an unknown id
    _, cmds = decide(VIEW, Seen(EVENTS[EventKind.ACTIVE], Facts(first)), 2.0)
    assert _kinds(cmds) == ["Assign", "Resume"] and not cmds[0].record.restore and cmds[0].record.prompt == ""
    kept = CommandRejected(worker_id="w1", session_id="s", command=RoutedInput.TAG, reason="not_owner", ts=1.0,
                           generation=GEN, seq=2, kind="text", payload="x",
                           detail="no Assign of its generation came in time")
    refused = Input("s", 2, "text", "x", refused=kept, rereads_left=0)
    _, cmds = decide(VIEW, Seen(refused, Facts(restored)), 2.0)
    assert _kinds(cmds) == ["Assign", "RouteAgain"] and cmds[0].record.restore and cmds[1].record.seq == 2
    kept_first = replace(kept, generation=first.generation)
    _, cmds = decide(VIEW, Seen(replace(refused, refused=kept_first), Facts(first)), 2.0)
    assert _kinds(cmds) == ["RouteAgain"]
    for other in (replace(restored, claimed=True), replace(restored, generation=Generation("w2", 4))):
        _, cmds = decide(VIEW, Seen(refused, Facts(other)), 2.0)
        assert _kinds(cmds) == ["RouteAgain"], other


def test_a_return_replays_the_log_when_the_offloaded_generation_was_lost_or_never_claimed():
    """Its owner declared lost before the offload (a restarted worker ends a Suspend of what
    it no longer holds) or never claimed: inputs routed to it may not have been applied."""
    for sv, replay in ((_sv(StoreState.SUSPENDED), False), (_sv(StoreState.SUSPENDED, claimed=False), True),
                       (replace(_sv(StoreState.SUSPENDED), stranded_epoch=GEN.epoch), True),
                       (replace(_sv(StoreState.SUSPENDED), stranded_epoch=GEN.epoch - 1), False)):
        _, cmds = decide(VIEW, Seen(EVENTS[EventKind.ACTIVE], Facts(sv)), 2.0)
        assert _kinds(cmds) == ["Commit"] and cmds[0].admission.restore
        assert cmds[0].admission.recover is replay, sv


def test_worker_events_reroute_refused_inputs():
    stale = CommandRejected(worker_id="w0", session_id="s", command=RoutedInput.TAG, reason="stale_epoch",
                            ts=1.0, generation=Generation("w0", 2), seq=5, kind="text", payload="x",
                            source_partition=4, source_offset=61)
    _, cmds = decide(VIEW, Seen(stale, Facts(_sv(StoreState.ACTIVE))), 2.0)
    assert _kinds(cmds) == ["RouteAgain"] and cmds[0].record.generation == GEN and cmds[0].record.seq == 5
    # the record it is keeps its place: a dead letter is its own, its next owner judges it as it is
    assert (cmds[0].record.source_partition, cmds[0].record.source_offset) == (4, 61)
    _, cmds = decide(VIEW, Seen(stale, Facts(_sv(StoreState.CLOSED))), 2.0)
    assert _kinds(cmds) == ["Refuse"] and "closed before input 5" in cmds[0].why and "stale_epoch at w0" in cmds[0].why
    late = CommandRejected(worker_id="w1", session_id="s", command=RoutedInput.TAG, reason="late",
                           ts=1.0, generation=GEN, seq=2, kind="text", payload="x")
    _, cmds = decide(VIEW, Seen(late, Facts(_sv(StoreState.ACTIVE))), 2.0)
    assert _kinds(cmds) == ["Refuse"] and "refused by its owner" in cmds[0].why
    resume = CommandRejected(worker_id="w1", session_id="s", command=Resume.TAG, reason="not_owner",
                             ts=1.0, generation=GEN)
    _, cmds = decide(VIEW, Seen(resume, Facts(_sv(StoreState.SUSPENDED))), 2.0)
    assert _kinds(cmds) == ["Commit"] and cmds[0].admission.restore


def test_commands_are_frozen_data():
    for cmd in (Publish(Suspend(worker_id="w", session_id="s", generation=GEN, ts=1.0)),
                RequestClose("s"), CloseInStore("s", GEN), Note("x"), RetryLater(Admission("s"), 0.2),
                ReadAgain(Seen(Input("s", 1, "text", "x"), Facts(None)), 0.05), Refuse(Input("s", 1, "t", "x"), "y")):
        assert type(cmd).__dataclass_params__.frozen  # type: ignore[attr-defined]
        with pytest.raises(FrozenInstanceError):
            setattr(cmd, fields(cmd)[0].name, None)


def test_an_admission_waiting_for_a_worker_stops_when_its_session_closes():
    inp = Input("s", 3, "text", "x")
    closed = Facts(_sv(StoreState.CLOSED))
    _, cmds = decide(VIEW, Retry(Admission("s", restore=True, then_route=inp), closed), 1.0)
    assert _kinds(cmds) == ["Note", "Refuse"] and "closed before input 3" in cmds[1].why
    _, cmds = decide(VIEW, Retry(Admission("s", restore=True), Facts(_sv(StoreState.SUSPENDED))), 1.0)
    assert _kinds(cmds) == ["Commit"]


def test_a_copy_of_an_input_coming_back_after_the_close_is_told_apart_by_the_store():
    """After a recovery's replay applied input 7 a routed copy of it can come back from its
    owner after the close: the store's last applied seq says it was applied (no refusal:
    refusing it made an input both applied and refused); a seq the owner gave up on after the
    gap wait is refused as late; one past the last applied as closed before it was applied."""
    closed = Facts(replace(_sv(StoreState.CLOSED), input_seq=10, skipped=(4,)))
    bounced = CommandRejected(worker_id="w1", ts=2.0, command=RoutedInput.TAG, reason="not_owner", detail="closed",
                              session_id="s", generation=GEN, seq=7, kind="text", payload="x")
    _, cmds = decide(VIEW, Seen(bounced, closed), 2.0)
    assert _kinds(cmds) == ["Note"]
    _, cmds = decide(VIEW, Seen(replace(bounced, seq=4), closed), 2.0)
    assert _kinds(cmds) == ["Refuse"] and "(late)" in cmds[0].why
    _, cmds = decide(VIEW, Seen(replace(bounced, seq=12), closed), 2.0)
    assert _kinds(cmds) == ["Refuse"] and "session closed before input 12 was applied" in cmds[0].why
    _, cmds = decide(VIEW, Seen(Input("s", 9, "text", "x"), closed), 2.0)  # a producer's late retry
    assert _kinds(cmds) == ["Note"]


def test_a_copy_of_an_applied_input_does_not_wake_an_offloaded_session():
    """A recovery's replay applied input 110; its routed copy reached the owner after the
    offload and came back refused: it was settled, so no restore is asked for it (the restore
    failed on the close that followed and the input was dead-lettered as well as applied, in an
    outside run); one past the last applied still wakes the session; a late one is refused."""
    offloaded = Facts(replace(_sv(StoreState.SUSPENDED), input_seq=110, skipped=(104,)))
    bounced = CommandRejected(worker_id="w1", ts=2.0, command=RoutedInput.TAG, reason="not_owner",
                              detail="current: w1@3 (suspended)", session_id="s", generation=GEN, seq=110,
                              kind="text", payload="x")
    _, cmds = decide(VIEW, Seen(bounced, offloaded), 2.0)
    assert _kinds(cmds) == ["Note"]
    _, cmds = decide(VIEW, Seen(replace(bounced, seq=111), offloaded), 2.0)
    assert _kinds(cmds) == ["Commit"]
    _, cmds = decide(VIEW, Seen(replace(bounced, seq=104), offloaded), 2.0)
    assert _kinds(cmds) == ["Refuse"] and "(late)" in cmds[0].why


def test_an_input_older_than_the_stores_full_list_of_given_up_seqs_is_refused_not_noted():
    """The store keeps only the latest given-up seqs: below a full list, an input may have been
    given up on, and taking it for a copy of one applied dropped it without a word (an
    outside producer's 2, 3, 2000 after a jump to 5000). It is refused; within the list, a
    seq not in it is still a copy, and one in it late."""
    from streams.store_ops import MAX_SKIPPED

    full = tuple(range(5000 - MAX_SKIPPED, 5000))
    closed = Facts(replace(_sv(StoreState.CLOSED), input_seq=5001, skipped=full))
    for seq in (2, 3, 2000, full[0] - 1):
        _, cmds = decide(VIEW, Seen(Input("s", seq, "text", "x"), closed), 2.0)
        assert _kinds(cmds) == ["Refuse"] and "older than the inputs it still tells apart" in cmds[0].why, seq
    _, cmds = decide(VIEW, Seen(Input("s", full[0], "text", "x"), closed), 2.0)
    assert _kinds(cmds) == ["Refuse"] and "(late)" in cmds[0].why
    _, cmds = decide(VIEW, Seen(Input("s", 5000, "text", "x"), closed), 2.0)
    assert _kinds(cmds) == ["Note"]  # applied: its verdict stands
    short = Facts(replace(_sv(StoreState.CLOSED), input_seq=5001, skipped=full[1:]))  # not full: it tells
    _, cmds = decide(VIEW, Seen(Input("s", 2, "text", "x"), short), 2.0)
    assert _kinds(cmds) == ["Note"]


def test_an_input_waits_with_its_waiting_open_without_using_up_its_rereads():
    inp = Input("s", 1, "text", "x", rereads_left=1)
    _, cmds = decide(VIEW, Seen(inp, Facts(None, open_waits=True)), 1.0)
    assert _kinds(cmds) == ["ReadAgain"] and cmds[0].event.what.rereads_left == 1
    gave_up = replace(VIEW, gave_up={"s": 0.5})  # its open found no room: refused at once, saying so
    _, cmds = decide(gave_up, Seen(inp, Facts(None)), 1.0)
    assert _kinds(cmds) == ["Refuse"] and "its open was refused" in cmds[0].why


@pytest.mark.parametrize("kind", [EventKind.OPEN, EventKind.ACTIVE])
def test_an_open_or_a_return_after_a_close_was_asked_for_is_refused_as_closed(kind):
    """The close is asked for in the store at once, and the owner releases the session at its
    next chunk boundary: an event in between is refused as one after the close (a Resume sent
    to the closing owner found nothing to resume, and the event had no verdict)."""
    closing = replace(_sv(StoreState.ACTIVE), close_requested=True)
    _, cmds = decide(VIEW, Seen(EVENTS[kind], Facts(closing)), 1.0)
    assert _kinds(cmds) == ["RefuseEvent"] and "was closed" in cmds[0].why


def test_an_idle_after_a_close_was_asked_for_offloads_nothing():
    """The session is a close under way: no Suspend for the owner to meet after its Terminate."""
    closing = replace(_sv(StoreState.ACTIVE), close_requested=True)
    _, cmds = decide(VIEW, Seen(EVENTS[EventKind.IDLE], Facts(closing)), 1.0)
    assert _kinds(cmds) == ["Note"] and "close is under way" in cmds[0].text

