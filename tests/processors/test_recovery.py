"""Recovery never strands a session: the dispatch core on the in-memory store twin, no broker.

The store twin runs the same operations as the Redis store (held to it by
tests/streams/test_generations_equivalence.py); the publisher records what dispatch sends.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from infra.chaos import refused_inputs
from processors.agents.dispatch import DispatchShell
from processors.recovery import CLAIM_GRACE_S, Step, next_step, waits
from schemas.records import (Assign, DeadLetter, Generation, Heartbeat, InputPushed, Record,
                             RoutedInput, SessionClosed, SessionOpened, Terminate, WorkerDown)
from streams.generations import SessionView
from streams.generations_memory import MemoryGenerationStore
from streams.input_log import LoggedInput


class Sent:
    """The publisher: keeps every record dispatch sends."""

    def __init__(self) -> None:
        self.records: list[Record] = []

    async def send(self, rec: Record, wait: bool = False) -> None:
        self.records.append(rec)

    def of(self, kind: type) -> list[Any]:
        return [r for r in self.records if isinstance(r, kind)]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _fleet(workers: dict[str, int], sessions: list[str],
                 retention_s: float = 3600) -> tuple[MemoryGenerationStore, DispatchShell, Sent, Clock]:
    store, sent, clock = MemoryGenerationStore("t", retention_s=retention_s), Sent(), Clock()
    for w, cap in workers.items():
        await store.register_worker(w, cap)
    shell = DispatchShell(store, sent, clock=clock, view_ttl_s=0.0, admission_timeout_s=0.0,
                          owner_wait_s=0.0)
    for sid in sessions:
        await shell.on_session_event(SessionOpened(session_id=sid, ts=clock(), prompt="p"))
    for a in sent.of(Assign):  # every owner claims what it was given
        await store.claim(a.session_id, a.generation)
    return store, shell, sent, clock


async def _owner(store: MemoryGenerationStore, sid: str) -> str:
    view = await store.session(sid)
    assert view is not None
    return view.generation.worker_id


async def _claim_assigned(store: MemoryGenerationStore, sent: Sent, since: int) -> None:
    for a in sent.records[since:]:
        if isinstance(a, Assign):
            view = await store.session(a.session_id)
            if view is not None and view.generation == a.generation:
                await store.claim(a.session_id, a.generation)


def test_second_death_with_survivors_full_waits_then_recovers_when_the_first_returns() -> None:
    """The issue's reproduction: three workers of capacity 2, four sessions; w1 dies (its
    sessions recovered), then w2 dies while w3 is full: its sessions wait, their inputs are
    held (never sent to w2), and when w1 heartbeats again they move there, inputs and all."""

    async def run() -> None:
        store, shell, sent, clock = await _fleet({"w1": 2, "w2": 2, "w3": 2}, ["a", "b", "c", "d"])
        on_w1 = [s for s in "abcd" if await _owner(store, s) == "w1"]
        assert on_w1, "the least-loaded ranking spreads the four sessions"
        await shell.on_worker_event(WorkerDown(worker_id="w1", ts=clock(), reason="missed heartbeats"))
        n = len(sent.records)
        await shell.sweep()
        await _claim_assigned(store, sent, n)
        for s in on_w1:
            assert await _owner(store, s) != "w1"
        assert (await store.load_view())["w1"].down

        on_w2 = [s for s in "abcd" if await _owner(store, s) == "w2"]
        assert len(on_w2) == 2 and (await store.load_view())["w3"].used == 2
        clock.now += 5
        await shell.on_worker_event(WorkerDown(worker_id="w2", ts=clock(), reason="missed heartbeats"))
        steps = await shell.sweep()
        assert steps == {"waiting": 1}, steps  # the first waits, the second behind it
        for s in on_w2:
            assert await _owner(store, s) == "w2"
        n = len(sent.records)
        assert await shell.route_input(on_w2[0], 1, "text", "steer", ts=clock()) is None
        assert not [r for r in sent.records[n:] if isinstance(r, RoutedInput)], "never sent to a dead owner"

        # a heartbeat sent before w1 was declared dead proves nothing
        await shell.on_worker_event(Heartbeat(worker_id="w1", ts=clock() - 10, sessions=0, executing=0, capacity=2))
        assert (await store.load_view())["w1"].down
        clock.now += 1
        await shell.on_worker_event(Heartbeat(worker_id="w1", ts=clock(), sessions=0, executing=0, capacity=2))
        assert not (await store.load_view())["w1"].down
        n = len(sent.records)
        await shell.sweep()
        for s in on_w2:
            assert await _owner(store, s) == "w1"
        assigns = [r for r in sent.records[n:] if isinstance(r, Assign)]
        assert {a.session_id for a in assigns} == set(on_w2) and all(a.recover and a.restore for a in assigns)
        await _claim_assigned(store, sent, n)
        clock.now += CLAIM_GRACE_S + 1
        await shell.sweep()
        assert (await shell.sweep()) == {} and shell.recovery_queue == 0  # every obligation met
        # the input left in the log reaches w1 by the recovery's replay; routed from now on
        n = len(sent.records)
        assert await shell.route_input(on_w2[0], 2, "text", "steer", ts=clock()) is None
        assert [(r.seq, r.worker_id) for r in sent.records[n:] if isinstance(r, RoutedInput)] == [(2, "w1")]

    asyncio.run(run())


def test_a_worker_down_older_than_a_sign_of_life_read_before_it_is_not_acted_on() -> None:
    """A declaration of death written again after the worker heartbeated (a copy of an
    earlier one: it verifies, the tag covers its bytes) takes nothing from it; a later one does."""

    async def run() -> None:
        store, shell, _, clock = await _fleet({"w1": 2, "w2": 2}, ["a", "b"])
        owners = {s: await _owner(store, s) for s in "ab"}
        down = WorkerDown(worker_id="w1", ts=clock(), reason="missed heartbeats")
        clock.now += 5
        await shell.on_worker_event(Heartbeat(worker_id="w1", ts=clock(), sessions=1, executing=1, capacity=2))
        await shell.on_worker_event(down)
        assert not (await store.load_view())["w1"].down
        assert await shell.sweep() == {} and {s: await _owner(store, s) for s in "ab"} == owners
        await shell.on_worker_event(WorkerDown(worker_id="w1", ts=clock() - 0.001, reason="stopped"))
        assert not (await store.load_view())["w1"].down
        # at the instant of its last heartbeat or later: acted on (as control's view reads it)
        await shell.on_worker_event(WorkerDown(worker_id="w1", ts=clock(), reason="stopped"))
        assert (await store.load_view())["w1"].down

    asyncio.run(run())


def test_a_close_wins_over_a_recovery_still_to_come() -> None:
    """A session closed while its worker is dead (declared or not yet) is released for good,
    its held inputs refused with the reason, and never resurrected when capacity frees up."""

    async def run() -> None:
        store, shell, sent, clock = await _fleet({"w1": 1, "w2": 1}, ["a", "b"])
        victim = await _owner(store, "a")
        other = "w2" if victim == "w1" else "w1"
        # closed before the death is declared: the Terminate goes to the dead owner
        await shell.on_session_event(SessionClosed(session_id="a", ts=clock()))
        assert [t.worker_id for t in sent.of(Terminate)] == [victim]
        await shell.on_worker_event(WorkerDown(worker_id=victim, ts=clock(), reason="missed heartbeats"))
        await store.release("b", (await store.session("b")).generation, close=True)  # a slot frees up
        await shell.sweep()
        view = await store.session("a")
        assert view is not None and view.state == "closed", view
        assert not [a for a in sent.of(Assign) if a.session_id == "a" and a.recover]
        assert (await store.load_view())[other].used == 0

    asyncio.run(run())


def _log_holds(shell: DispatchShell, sid: str, seqs: tuple[int, ...]) -> None:
    """The session-inputs log, as dispatch reads it back, holds these inputs of ``sid``."""
    log = [LoggedInput(0, i, InputPushed(session_id=sid, seq=i, kind="text", payload=f"in {i}", ts=1.0)) for i in seqs]

    async def read_inputs(wanted: str, after_seq: int) -> list[LoggedInput]:
        return [x for x in log if x.record.session_id == wanted and x.record.seq > after_seq]

    shell.read_inputs = read_inputs


def test_inputs_of_a_session_closed_while_stranded_are_refused_from_the_log() -> None:
    async def run() -> None:
        store, shell, sent, clock = await _fleet({"w1": 1}, ["a"])
        _log_holds(shell, "a", (1, 2))
        await shell.on_worker_event(WorkerDown(worker_id="w1", ts=clock(), reason="missed heartbeats"))
        await shell.sweep()
        for seq in (1, 2):
            assert await shell.route_input("a", seq, "text", f"in {seq}", ts=clock()) is None
        await shell.on_session_event(SessionClosed(session_id="a", ts=clock()))
        assert not sent.of(Terminate), "nothing is sent to a dead owner"
        await shell.sweep()
        assert (await store.session("a")).state == "closed"
        assert refused_inputs(sent.of(DeadLetter)) == {("a", 1), ("a", 2)}
        assert all("closed before input" in d.reason for d in sent.of(DeadLetter))
        # every reason says refused: (or schema:) first, as the contract has it (an outside run found these did not)
        assert all(d.reason.startswith("refused: session closed before input") for d in sent.of(DeadLetter))

    asyncio.run(run())


def test_the_close_sweep_does_not_refuse_again_what_was_refused_at_the_close() -> None:
    """A session still queued for recovery closes while an owner holds it after all: that
    owner refuses its waiting input 2 at the close (dispatch dead-letters it), and the sweep
    that finishes the close refuses from the log only what nobody refused (3), not 2 a second
    time (an outside run saw 21 inputs dead-lettered twice)."""
    from processors.dispatch import Input

    async def run() -> None:
        store, shell, sent, clock = await _fleet({"w1": 1}, ["a"])
        _log_holds(shell, "a", (2, 3))
        await shell.refuse(Input("a", 2, "text", "in 2", partition=0, offset=2), "session closed before input 2 was applied")
        await shell.on_worker_event(WorkerDown(worker_id="w1", ts=clock(), reason="missed heartbeats"))
        await shell.on_session_event(SessionClosed(session_id="a", ts=clock()))
        await shell.sweep()
        assert sorted(refused_inputs(sent.of(DeadLetter))) == [("a", 2), ("a", 3)]
        assert len(sent.of(DeadLetter)) == 2  # 2 once, at the close; 3 by the sweep

    asyncio.run(run())


def test_inputs_the_sweep_refused_are_not_dead_lettered_again_when_handed_back() -> None:
    """The close sweep refused a stranded session's inputs from the log; its owner, resumed
    after all, handed them back refused (`not_owner`), and the same replica dead-lettered each
    a second time (an outside run: 51 dead letters for 19 records). One each."""
    from processors.dispatch import Input

    async def run() -> None:
        store, shell, sent, clock = await _fleet({"w1": 1}, ["a"])
        _log_holds(shell, "a", (1, 2))
        await shell.on_worker_event(WorkerDown(worker_id="w1", ts=clock(), reason="missed heartbeats"))
        await shell.on_session_event(SessionClosed(session_id="a", ts=clock()))
        await shell.sweep()
        assert sorted(refused_inputs(sent.of(DeadLetter))) == [("a", 1), ("a", 2)]
        for seq in (1, 2):  # handed back by the owner that was alive after all, from where the log holds them
            await shell.refuse(Input("a", seq, "text", f"in {seq}", partition=0, offset=seq),
                               f"session closed before input {seq} was applied")
        assert len(sent.of(DeadLetter)) == 2

    asyncio.run(run())


def test_two_replicas_sweeping_a_closed_stranded_session_refuse_its_inputs_once() -> None:
    """Every dispatch replica sweeps the queue; two that meet the same closed session while
    each reads its inputs back from the log refused each input once apiece (each replica's
    dead letters are its own). One replica takes the entry; the other passes it by."""

    async def run() -> None:
        store, shell, sent, clock = await _fleet({"w1": 1}, ["a"])
        other = DispatchShell(store, Sent(), clock=clock, view_ttl_s=0.0)  # a second replica
        for replica in (shell, other):
            _log_holds(replica, "a", (1, 2))
        due = store.recovery_due

        async def due_then_wait(now: float, limit: int = 64) -> Any:
            got = await due(now, limit)
            await asyncio.sleep(0.01)  # a round trip to Redis: the other replica's sweep reads it too
            return got

        store.recovery_due = due_then_wait  # type: ignore[method-assign]
        await shell.on_worker_event(WorkerDown(worker_id="w1", ts=clock(), reason="missed heartbeats"))
        await shell.on_session_event(SessionClosed(session_id="a", ts=clock()))
        await asyncio.gather(shell.sweep(), other.sweep())
        letters = sent.of(DeadLetter) + other.publisher.of(DeadLetter)
        assert sorted(refused_inputs(letters)) == [("a", 1), ("a", 2)] and len(letters) == 2
        assert (await store.recovery_due(clock() + 1e6))[0] == 0

    asyncio.run(run())


def test_a_replica_dying_while_it_refuses_a_closed_sessions_inputs_leaves_them_to_another() -> None:
    """The entry leaves the queue only once its inputs are refused: a replica whose read of
    the log fails (it dies) leaves the session queued, and another replica refuses them after
    the take's time (before, the entry was dropped first and the inputs ended neither way)."""
    from processors.agents.recovery import CLOSE_TAKE_S

    async def run() -> None:
        store, shell, sent, clock = await _fleet({"w1": 1}, ["a"])

        async def dies(wanted: str, after: int) -> list[LoggedInput]:
            raise ConnectionError("the replica's broker connection is gone")

        shell.read_inputs = dies
        await shell.on_worker_event(WorkerDown(worker_id="w1", ts=clock(), reason="missed heartbeats"))
        await shell.on_session_event(SessionClosed(session_id="a", ts=clock()))
        with pytest.raises(ConnectionError):
            await shell.sweep()
        other = DispatchShell(store, Sent(), clock=clock, view_ttl_s=0.0)
        _log_holds(other, "a", (1, 2))
        await other.sweep()
        assert not other.publisher.of(DeadLetter)  # still the first replica's for now
        clock.now += CLOSE_TAKE_S + 0.1
        await other.sweep()
        assert sorted(refused_inputs(other.publisher.of(DeadLetter))) == [("a", 1), ("a", 2)]
        assert (await store.recovery_due(clock.now + 1e6))[0] == 0

    asyncio.run(run())


def test_a_new_owner_dying_while_the_sweep_drops_the_old_entry_keeps_the_new_one() -> None:
    """The sweep read a recovered session (claimed, owner up: nothing owed) and meanwhile its
    new owner died and was queued again by another replica; the sweep's drop of what it read
    erased that newer entry, and the session stayed on a dead worker for good (a review's
    repro). Each change of the queue holds only for the entry the step was decided on."""

    async def run() -> None:
        store, shell, sent, clock = await _fleet({"w1": 1, "w2": 1, "w3": 1}, ["a"])
        first = await _owner(store, "a")
        await shell.on_worker_event(WorkerDown(worker_id=first, ts=clock(), reason="missed heartbeats"))
        since = len(sent.records)
        await shell.sweep()
        await _claim_assigned(store, sent, since)
        second = await _owner(store, "a")
        assert second != first
        clock.now += CLAIM_GRACE_S + 1
        read = store.session

        async def read_then_die(sid: str) -> Any:  # the new owner dies right after the sweep's read
            got = await read(sid)
            store.session = read  # type: ignore[method-assign]
            await store.set_down(second, clock())
            assert await store.strand(second, clock()) == 1
            return got

        store.session = read_then_die  # type: ignore[method-assign]
        assert await shell.sweep() == {"drop": 1}
        since = len(sent.records)
        await shell.sweep()  # the newer entry is still there: recovered again
        third = [a for a in sent.records[since:] if isinstance(a, Assign) and a.recover]
        assert len(third) == 1 and third[0].generation.worker_id not in (first, second)

    asyncio.run(run())


def test_a_lost_assign_is_sent_again_after_the_grace() -> None:
    """The replica that committed a recovery died before its Assign went out (or the Assign
    was lost): once the grace passes, any replica sends it again."""

    async def run() -> None:
        store, shell, sent, clock = await _fleet({"w1": 1, "w2": 1}, ["a"])
        victim = await _owner(store, "a")
        await shell.on_worker_event(WorkerDown(worker_id=victim, ts=clock(), reason="missed heartbeats"))
        await shell.sweep()
        first = [a for a in sent.of(Assign) if a.recover]
        assert len(first) == 1
        other = DispatchShell(store, Sent(), clock=clock, view_ttl_s=0.0)  # a second replica
        assert await other.sweep() == {}  # not due yet
        clock.now += CLAIM_GRACE_S + 0.1
        await other.sweep()
        again = [a for a in other.publisher.records if isinstance(a, Assign)]
        assert [a.generation for a in again] == [first[0].generation]

    asyncio.run(run())


def test_a_restarted_worker_queues_what_its_previous_run_held() -> None:
    async def run() -> None:
        store, shell, sent, clock = await _fleet({"w1": 2}, ["a", "b"])
        # the process restarts under the same id before anyone declared it dead
        assert await store.strand("w1", clock()) == 2
        await store.set_up("w1", clock())
        n = len(sent.records)
        await shell.sweep()
        assigns = [a for a in sent.records[n:] if isinstance(a, Assign)]
        assert sorted(a.session_id for a in assigns) == ["a", "b"]
        assert all(a.generation.epoch == 2 and a.worker_id == "w1" for a in assigns)

    asyncio.run(run())


def _view(epoch: int, state: str = "active", claimed: bool = True, stranded: int | None = 1,
          close: bool = False) -> SessionView:
    return SessionView(Generation("w", epoch), state, claimed, None, None, None, close, stranded)


@pytest.mark.parametrize("view, owner_down, step", [
    (None, False, Step.DROP),
    (_view(1, "closed"), True, Step.REFUSE),  # closed mid-recovery: its unapplied inputs refused
    (_view(1, close=True), True, Step.CLOSE),
    (_view(1, "suspended", close=True), False, Step.CLOSE),
    (_view(1, "suspended"), True, Step.DROP),
    (_view(1), True, Step.RECOVER),
    (_view(1), False, Step.TAKE_BACK),  # restarted under the same id: its own slot first
    (_view(2, claimed=False), False, Step.RESEND),
    (_view(2, claimed=False), True, Step.RECOVER),
    (_view(2), False, Step.DROP),
    (_view(2, stranded=None), True, Step.DROP),
])
def test_next_step(view: SessionView | None, owner_down: bool, step: Step) -> None:
    assert next_step(view, owner_down) is step


def test_once_a_recovery_finds_no_slot_the_later_ones_wait_and_the_rest_go_on() -> None:
    assert not waits(Step.RECOVER, False) and not waits(Step.TAKE_BACK, False)
    assert waits(Step.RECOVER, True) and waits(Step.TAKE_BACK, True)
    assert not any(waits(s, True) for s in (Step.DROP, Step.CLOSE, Step.REFUSE, Step.RESEND))


def test_input_accounting_reason_for_unknown_session() -> None:
    async def run() -> None:
        _store, shell, _sent, _clock = await _fleet({"w1": 1}, [])
        why = await shell.on_input(InputPushed(session_id="nope", seq=1, kind="text", payload="x", ts=1.0))
        assert why is not None and "never opened, or closed past its retention" in why

    asyncio.run(run())


def test_sessions_of_a_dead_worker_count_as_unplaced_demand() -> None:
    """The autoscaler is told: a stranded session is an executing session on no GPU."""
    from processors.cluster import ClusterView, apply_all, to_snapshot
    from schemas.records import Claimed, WorkerUp

    view = apply_all(ClusterView(), [
        WorkerUp(worker_id="w1", ts=1.0, capacity=2), WorkerUp(worker_id="w2", ts=1.0, capacity=1),
        SessionOpened(session_id="a", ts=2.0, prompt="p"), Claimed(worker_id="w1", session_id="a",
                                                                   generation=Generation("w1", 1), ts=2.1),
        WorkerDown(worker_id="w1", ts=5.0, reason="missed heartbeats")])
    snap = to_snapshot(view, 5.5, heartbeat_timeout_s=10.0)
    assert [g.id for g in snap.gpus] == ["w2"]
    assert [(s.id, s.gpu_id) for s in snap.sessions] == [("a", None)]


def test_a_worker_down_past_the_store_retention_is_forgotten_by_the_sweep() -> None:
    """A dead worker's entry stays while it may come back, and goes once it has been down for
    the retention with no slot left (its sessions recovered): the store does not grow with
    every worker that ever died."""

    async def run() -> None:
        store, shell, sent, clock = await _fleet({"w1": 2, "w2": 4}, ["a", "b", "c"], retention_s=600)
        await shell.on_worker_event(WorkerDown(worker_id="w1", ts=clock(), reason="missed heartbeats"))
        n = len(sent.records)
        await shell.sweep()
        await _claim_assigned(store, sent, n)
        assert (await store.load_view())["w1"].down  # down for 0 s: kept
        clock.now += 599
        await shell.sweep()
        assert "w1" in await store.load_view()  # not yet the retention
        clock.now += 1
        await shell.sweep()
        assert "w1" in await store.load_view()  # looked at once a minute, not every sweep
        clock.now += 59
        await shell.sweep()
        assert set(await store.load_view()) == {"w2"}
        assert [await _owner(store, s) for s in "abc"] == ["w2"] * 3
        assert not [k for k in store.scripts.data if k.endswith(":ws:w1")]

    asyncio.run(run())
