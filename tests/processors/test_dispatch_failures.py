"""Dispatch's shell when the broker or the store fails under it: every record still ends with
one verdict, and a verdict is never given for work that took effect. The dispatch core on the
in-memory store twin; the publisher fails on purpose (a review's findings)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka.errors import KafkaTimeoutError

import processors.agents.input_budgets as budgets
from processors.agents.dispatch import DispatchShell
from processors.agents.dispatch_streams import then_ack
from processors.dispatch import Input
from schemas.records import Assign, DeadLetter, InputPushed, Record, RoutedInput, SessionOpened
from streams.generations_memory import MemoryGenerationStore
from streams.signing import EventKeys


class Flaky:
    """A publisher whose first ``fails`` sends of records of ``kind`` time out, as a send does
    while the broker is away."""

    def __init__(self, kind: type, fails: int) -> None:
        self.kind, self.fails, self.records = kind, fails, []  # type: ignore[var-annotated]

    async def send(self, rec: Record, wait: bool = False) -> None:
        if isinstance(rec, self.kind) and self.fails > 0:
            self.fails -= 1
            raise KafkaTimeoutError()
        self.records.append(rec)


class Event:
    def __init__(self) -> None:
        self.acked = 0

    def ack(self) -> None:
        self.acked += 1


def _quick(monkeypatch: Any) -> None:
    monkeypatch.setattr(budgets, "STORE_RETRY_S", (0.01, 0.01, 0.01))
    monkeypatch.setattr(budgets, "RETRY_MAX_S", 0.01)


def test_an_open_whose_assign_could_not_be_sent_is_tried_again_not_refused(monkeypatch: Any) -> None:
    """The commit landed and the Assign's send timed out: the open was dead-lettered as
    refused and acked, while the store kept an active, unclaimed session holding a slot that
    no Assign would reach. Tried again, the open finds its commit and sends the Assign."""
    _quick(monkeypatch)

    async def run() -> None:
        store, pub = MemoryGenerationStore("t"), Flaky(Assign, fails=1)
        await store.register_worker("w", 1)
        shell, event, letters = DispatchShell(store, pub, view_ttl_s=0.0), Event(), []

        work = shell.session_work(SessionOpened(session_id="s", ts=1.0, prompt="p"))

        async def handle() -> None:  # as dispatch's agent has it
            assert await work() is None
            event.ack()

        async def refuse(exc: Exception) -> None:
            letters.append(exc)

        await shell.submit("events:s", handle, then_ack(event, refuse))
        await asyncio.gather(*shell.chains.tasks.values())
        assigned = [r for r in pub.records if isinstance(r, Assign)]
        assert letters == [] and event.acked == 1
        assert [a.generation for a in assigned] == [(await store.session("s")).generation]

    asyncio.run(run())


def test_a_dead_letter_the_broker_does_not_take_at_once_is_sent_again_until_it_is_out(monkeypatch: Any) -> None:
    """The work failed for good (a bug) and its dead letter timed out: the record was neither
    acked nor refused (faust commits no offset past it). The verdict is sent until it is out."""
    _quick(monkeypatch)
    monkeypatch.setattr(budgets, "RETRY_MAX_S", 0.01)

    async def run() -> None:
        pub = Flaky(DeadLetter, fails=3)
        shell, event = DispatchShell(MemoryGenerationStore("t"), pub, view_ttl_s=0.0), Event()

        async def work() -> None:
            raise RuntimeError("a bug")

        async def refuse(exc: Exception) -> None:
            await shell.refuse(Input("s", 1, "text", "x", 1.0, partition=0, offset=5), f"could not route it ({exc!r})")

        await shell.submit("inputs:s", work, then_ack(event, refuse))
        await asyncio.gather(*shell.chains.tasks.values())
        assert event.acked == 1 and len([r for r in pub.records if isinstance(r, DeadLetter)]) == 1

    asyncio.run(run())


def test_an_input_tried_again_still_names_the_inputs_refused_before_it(monkeypatch: Any) -> None:
    """The gate's refused seqs were taken when the input was read, before its route's first
    await: a try that failed (the store or the broker away) lost them, and the owner waited
    5 s for an input that was never coming. They are let go once a routed input names them."""
    _quick(monkeypatch)

    async def run() -> None:
        store, pub = MemoryGenerationStore("t"), Flaky(RoutedInput, fails=1)
        await store.register_worker("w", 1)
        shell = DispatchShell(store, pub, view_ttl_s=0.0)
        assert await shell.on_session_event(SessionOpened(session_id="s", ts=1.0, prompt="p")) is None
        gen = (await store.session("s")).generation
        await store.claim("s", gen)
        shell.gate.note_refused("s", 1)  # refused for the rate, say
        rec = InputPushed(session_id="s", seq=2, kind="text", payload="x", ts=1.0)
        await shell.submit("inputs:s", lambda: shell.on_input(rec, 0, 7))
        await asyncio.gather(*shell.chains.tasks.values())
        routed = [r for r in pub.records if isinstance(r, RoutedInput)]
        assert [(r.seq, r.refused_before) for r in routed] == [(2, (1,))]
        assert shell.gate.refused_before("s") == ()  # named: let go

    asyncio.run(run())


class Stream:
    """What dispatch's worker-events agent reads: faust's stream, its events acked by hand."""

    def __init__(self, records: list[Record]) -> None:
        from schemas.codec import TYPE_HEADER, encode

        self.events_ = [SimpleEvent(encode(r), [(TYPE_HEADER, r.TAG.encode())]) for r in records]

    def noack(self) -> "Stream":
        return self

    async def events(self) -> Any:
        for e in self.events_:
            yield e


class SimpleEvent(Event):
    def __init__(self, value: bytes, headers: list) -> None:
        super().__init__()
        from types import SimpleNamespace

        self.message = SimpleNamespace(value=value, headers=headers, timestamp=None, topic="worker-events",
                                       partition=0, offset=0, key=None)


def test_a_worker_event_is_acked_once_acted_on_a_death_through_a_store_outage(monkeypatch: Any) -> None:
    """Dispatch's worker events were acked as the next was read, before a chain acted on
    them, and a death met by a store outage escaped the agent: a replica killed or a Redis
    blip lost a WorkerDown, said once, and the worker's sessions were never recovered. An
    input handed back that cannot be routed again (a bug) is refused, not left neither way."""
    from processors.agents.dispatch_streams import worker_events
    from schemas.errors import InfraError
    from schemas.records import CommandRejected, Generation, WorkerDown

    _quick(monkeypatch)
    monkeypatch.setattr(budgets, "RETRY_MAX_S", 0.01)

    async def run() -> None:
        store = MemoryGenerationStore("t")
        await store.register_worker("w1", 1)
        pub = Flaky(DeadLetter, fails=0)
        pub.limit = lambda logical: 1 << 20  # type: ignore[attr-defined]
        pub.event_keys = EventKeys()  # type: ignore[attr-defined]  # worker-event signing off
        shell = DispatchShell(store, pub, view_ttl_s=0.0)
        down = store.set_down
        outage = [InfraError("redis away"), InfraError("redis away")]

        async def set_down(worker: str, ts: float) -> bool:
            if outage:
                raise outage.pop(0)
            return await down(worker, ts)

        store.set_down = set_down  # type: ignore[method-assign]
        rejected = CommandRejected(worker_id="w1", session_id="gone", command=RoutedInput.TAG, reason="not_owner",
                                   ts=1.0, generation=Generation("w1", 1), seq=3, kind="text", payload="x")
        stream = Stream([WorkerDown(worker_id="w1", ts=1.0, reason="missed heartbeats"), rejected])

        async def the_shell() -> DispatchShell:
            return shell

        real = shell.on_worker_event

        async def acting(rec: Record) -> None:
            if isinstance(rec, WorkerDown):
                return await real(rec)
            raise RuntimeError("a bug")  # the refused input cannot be routed again

        shell.on_worker_event = acting  # type: ignore[method-assign]
        await worker_events(stream, the_shell, pub)
        await asyncio.gather(*shell.chains.tasks.values())
        assert [e.acked for e in stream.events_] == [1, 1]
        assert (await store.load_view())["w1"].down  # marked down through the outage
        letters = [r for r in pub.records if isinstance(r, DeadLetter)]
        assert len(letters) == 1 and "could not route it again after its owner refused it (a bug)" in letters[0].reason

    asyncio.run(run())


def test_callers_that_find_the_loads_old_share_one_read() -> None:
    """500 callers at once made 500 reads of the workers' hash (a review's repro); one read
    serves those that find the view old while it is on its way; a forced read is its own."""

    async def run() -> None:
        store = MemoryGenerationStore("t")
        await store.register_worker("w", 4)
        reads = [0]
        real = store.load_view

        async def counted() -> Any:
            reads[0] += 1
            await asyncio.sleep(0.01)
            return await real()

        store.load_view = counted  # type: ignore[method-assign]
        shell = DispatchShell(store, Flaky(Assign, 0), view_ttl_s=0.0)
        views = await asyncio.gather(*(shell.load_view() for _ in range(500)))
        assert reads[0] == 1 and all(v["w"].capacity == 4 for v in views)
        await asyncio.gather(shell.load_view(force=True), shell.load_view(force=True))
        assert reads[0] == 3

    asyncio.run(run())


async def _served(place: str) -> tuple[MemoryGenerationStore, Flaky, DispatchShell]:
    """Session "s" opened (its event at ``place``) and claimed by worker "w"."""
    store, pub = MemoryGenerationStore("t"), Flaky(Assign, fails=0)
    await store.register_worker("w", 2)
    shell = DispatchShell(store, pub, view_ttl_s=0.0)
    assert await shell.on_session_event(SessionOpened(session_id="s", ts=1.0, prompt="p"), place=place) is None
    await store.claim("s", (await store.session("s")).generation)
    return store, pub, shell


def test_an_open_read_again_after_its_session_was_served_and_closed_is_passed_over() -> None:
    """Faust commits up to the first event not acked, so a rebalance or a restart reads again
    events already handled; an open read again after its session closed was refused as an
    open of a closed id, its second verdict (an outside run's restart). The store keeps where
    the open sits; that open is passed over, and any other open of the id refused as before."""
    from schemas.records import SessionClosed

    async def run() -> None:
        store, pub, shell = await _served("0:5")
        opened = SessionOpened(session_id="s", ts=1.0, prompt="p")
        assert (await store.session("s")).opened_by == "0:5"
        assert await shell.on_session_event(SessionClosed(session_id="s", ts=2.0), place="0:6") is None
        await store.release("s", (await store.session("s")).generation, close=True)  # its owner ends it
        sent = len(pub.records)
        assert await shell.on_session_event(opened, place="0:5") is None  # read again: passed over
        assert await shell.on_session_event(opened, again=True, place="0:5") is None  # tried again, the same
        assert len(pub.records) == sent
        refused = await shell.on_session_event(opened, place="0:9")  # an open of the id, later in the log
        assert refused is not None and "was closed: a session id is not used again" in refused

    asyncio.run(run())


def test_a_close_waits_for_the_inputs_read_before_it_to_be_routed(monkeypatch: Any) -> None:
    """After a store outage a session's events and its inputs wake on their own: the close
    woke first and every input pushed before it was refused as closed (an outside run with
    Redis killed: 17-30% of the inputs). A close waits for the inputs this replica read before
    it (at most CLOSE_WAITS_S), so they reach the owner before its Terminate."""
    from schemas.records import SessionClosed, Terminate

    async def run() -> None:
        store, pub, shell = await _served("0:1")
        store_back = asyncio.Event()
        rec = InputPushed(session_id="s", seq=1, kind="text", payload="x", ts=1.0)

        async def route() -> None:  # the store away: the input waits for it
            await store_back.wait()
            await shell.on_input(rec, 0, 3)

        await shell.submit("inputs:s", route)
        await shell.submit("events:s", shell.session_work(SessionClosed(session_id="s", ts=2.0), "0:2"))
        await asyncio.sleep(0.05)
        store_back.set()  # the store answers: both wake
        await asyncio.gather(*shell.chains.tasks.values())
        order = [type(r).__name__ for r in pub.records if isinstance(r, (RoutedInput, Terminate))]
        assert order == ["RoutedInput", "Terminate"]

    asyncio.run(run())


async def _refuse(why: str) -> None:
    raise AssertionError(f"refused: {why}")


def _read_close(shell: DispatchShell, sid: str, done: dict[str, Any], place: str = "0:2",
                refused: Any = _refuse) -> Any:
    """The close of ``sid`` as the events agent submits it, recorded in ``done`` once decided."""
    from schemas.records import SessionClosed

    work = shell.session_work(SessionClosed(session_id=sid, ts=2.0), place)

    async def handle() -> None:
        done[place] = await work()

    return shell.closes.submit(sid, shell.submit(f"events:{sid}", handle, None, refused))


def _read_input(shell: DispatchShell, sid: str, seq: int, done: dict[str, Any], refused: Any = _refuse) -> Any:
    """Input ``seq`` of ``sid`` as the inputs agent submits it, its outcome in ``done``."""
    rec = InputPushed(session_id=sid, seq=seq, kind="text", payload="x", ts=1.0)

    async def route() -> None:
        done[seq] = await shell.on_input(rec, 0, 10 + seq)
    return shell.submit(f"inputs:{sid}", route, None, refused, shell.closes.waited_for(sid))


def _waiting_for_room(shell: DispatchShell, room: asyncio.Event) -> Any:
    """A piece that waits for room until ``room`` is set (an open or a return whose admission waits)."""
    async def waits() -> None:
        with shell.chains.waiting_for_room():
            await room.wait()
    return waits


def test_an_input_read_after_the_close_reaches_the_owner_after_its_terminate() -> None:
    """The close waits behind an earlier event of its session (an open or a return waiting
    for room); an input read before the close is routed ahead of it, one read after it waits
    for it and reaches the owner after the Terminate (which refuses it as closed). Before, the
    close waited for every input read until its turn, and the later one reached the owner
    ahead of the Terminate (an outside producer's input written once the close was
    acknowledged was applied)."""
    from schemas.records import Terminate

    async def run() -> None:
        store, pub, shell = await _served("0:1")
        room, done = asyncio.Event(), {}
        await shell.submit("events:s", _waiting_for_room(shell, room))
        await _read_input(shell, "s", 1, done)
        await _read_close(shell, "s", done)
        await _read_input(shell, "s", 2, done)
        await asyncio.sleep(0.05)
        assert done == {1: None} and shell.chains.parked["inputs:s"] == 1  # 2 waits, holding no place
        room.set()
        await asyncio.gather(*shell.chains.tasks.values())
        order = [(type(r).__name__, getattr(r, "seq", None)) for r in pub.records if isinstance(r, (RoutedInput, Terminate))]
        assert order == [("RoutedInput", 1), ("Terminate", None), ("RoutedInput", 2)]
        assert shell.closes.pending == {}  # forgotten once the close's work ended

    asyncio.run(run())


def test_inputs_read_after_a_close_waiting_for_room_take_no_place_from_it() -> None:
    """Inputs read after a close that waits behind an open waiting for room each took an
    in-flight place and waited for the close; the place the open freed went to the next input,
    and the close waited for a place for ever: the whole replica stopped (a review, with 4
    places; 1,024 by default, which one producer's inputs fill within the admission wait).
    Parked, they hold none: the close runs once room comes, then each of them."""

    async def run() -> None:
        store = MemoryGenerationStore("t")
        await store.register_worker("w", 1)
        shell = DispatchShell(store, Flaky(Assign, fails=0), view_ttl_s=0.0, max_in_flight=4, admission_timeout_s=20.0)
        assert await shell.on_session_event(SessionOpened(session_id="full", ts=1.0, prompt="p"), place="0:0") is None
        done: dict[Any, Any] = {}

        async def open_late() -> None:
            done["open"] = await shell.session_work(SessionOpened(session_id="late", ts=1.0, prompt="p"), "0:1")()

        await shell.submit("events:late", open_late)
        await asyncio.sleep(0.3)  # it waits for room
        await _read_close(shell, "late", done)
        for seq in range(1, 9):  # twice the places
            await asyncio.wait_for(_read_input(shell, "late", seq, done), 1.0)
        gen = (await store.session("full")).generation
        await store.release("full", gen, close=True)  # room
        await asyncio.wait_for(asyncio.gather(*shell.chains.tasks.values()), 10.0)
        assert done["open"] is None and done["0:2"] is None
        assert all(done[seq] is None for seq in range(1, 9))  # routed after the Terminate, as above

    asyncio.run(run())


def test_a_close_refused_for_the_bounds_behind_another_holds_the_inputs_until_that_one_ends() -> None:
    """A duplicate close refused for what may wait behind its session's open replaced the
    first in the record of closes, and ended at once: an input read after both reached the
    owner ahead of the first close's Terminate (a review)."""
    from schemas.records import Terminate

    async def run() -> None:
        store, pub, shell = await _served("0:1")
        room, done, refusals = asyncio.Event(), {}, []

        async def refused(why: str) -> None:
            refusals.append(why)

        async def nothing() -> None:
            pass

        await shell.submit("events:s", _waiting_for_room(shell, room))
        await asyncio.sleep(0.01)
        await _read_close(shell, "s", done, "0:2", refused)
        for _ in range(budgets.MAX_PARKED_PER_KEY - 1):  # other events of s wait behind it
            await shell.submit("events:s", nothing, None, refused)
        await _read_close(shell, "s", done, "0:20", refused)  # a duplicate: refused for the bound
        assert len(refusals) == 1 and "s waits for room, and 16 of its records" in refusals[0]
        await _read_input(shell, "s", 2, done)
        room.set()
        await asyncio.gather(*shell.chains.tasks.values())
        order = [(type(r).__name__, getattr(r, "seq", None)) for r in pub.records if isinstance(r, (RoutedInput, Terminate))]
        assert order == [("Terminate", None), ("RoutedInput", 2)] and shell.closes.pending == {}

    asyncio.run(run())


def test_inputs_behind_a_close_have_bounds_of_their_own_and_say_what_they_wait_for(monkeypatch: Any) -> None:
    """Past what may wait behind a session, an input read after its close is refused saying the
    close is under way (it said the session waited for room); and inputs behind closes do not
    use up the bound of pieces behind waits for room (another session's close behind its
    waiting open was refused for them: a review)."""
    monkeypatch.setattr(budgets, "MAX_PARKED", 4)

    async def run() -> None:
        store, pub, shell = await _served("0:1")
        room, done, refusals = asyncio.Event(), {}, []

        async def refused(why: str) -> None:
            refusals.append(why)

        await shell.submit("events:s", _waiting_for_room(shell, room))
        await asyncio.sleep(0.01)
        await _read_close(shell, "s", done, "0:2", refused)
        for seq in range(1, 6):  # four wait behind the close; the fifth is past the bound of all such
            await _read_input(shell, "s", seq, done, refused)
        assert refusals == ["the close of s is under way, and 4 records wait behind such sessions already"]
        await shell.submit("events:t", _waiting_for_room(shell, room))  # another session's open waits
        await asyncio.sleep(0.01)
        await _read_close(shell, "t", done, "1:2", refused)  # its close parks, the inputs' bound full
        assert len(refusals) == 1, refusals
        room.set()
        await asyncio.gather(*shell.chains.tasks.values())
        assert shell.chains.parked == {} and shell.chains.behind_closes == 0

    asyncio.run(run())


def test_a_close_whose_submission_is_cancelled_holds_no_input() -> None:
    """Its submission waited for a place and was cancelled (the agent stopped): the close stood
    recorded for good, and every later input of its session waited for it (a review)."""

    async def run() -> None:
        store, pub, shell = await _served("0:1")
        shell.chains._places = asyncio.Semaphore(0)  # no place: the close's submission waits
        agent = asyncio.ensure_future(_read_close(shell, "s", {}))
        await asyncio.sleep(0.01)
        assert "s" in shell.closes.pending
        agent.cancel()
        await asyncio.gather(agent, return_exceptions=True)
        assert shell.closes.pending == {}

    asyncio.run(run())


def test_the_recovery_sweep_meeting_the_store_away_says_so_once_and_pauses(caplog: Any) -> None:
    """It logged a traceback every 250 ms while Redis was away (an outside run)."""
    import logging

    from processors.agents.dispatch_streams import sweeper
    from schemas.errors import InfraError

    calls = [0]

    class Away:
        async def sweep(self) -> None:
            calls[0] += 1
            raise InfraError("generation store: Redis unreachable")

    async def shell() -> Any:
        return Away()

    async def run() -> None:
        sweep = sweeper(shell)
        for _ in range(5):
            await sweep()  # starts a sweep beside the timer
            await asyncio.sleep(0.01)

    with caplog.at_level(logging.WARNING):
        asyncio.run(run())
    assert calls[0] == 1  # paused after the first
    assert [r.getMessage() for r in caplog.records] == [
        "dispatch: recovery sweep: the store is away (generation store: Redis unreachable); again in 2 s"]
    assert not any(r.exc_info for r in caplog.records)


def test_a_sweep_still_running_is_not_started_again() -> None:
    """A sweep waiting on a store away held the timer, and faust warned every few seconds that
    its timer overlapped (an outside run): one sweep at a time runs beside it."""
    from processors.agents.dispatch_streams import sweeper

    calls, slow = [0], asyncio.Event()

    class Slow:
        async def sweep(self) -> dict:
            calls[0] += 1
            await slow.wait()
            return {}

    async def shell() -> Any:
        return Slow()

    async def run() -> None:
        sweep = sweeper(shell)
        for _ in range(3):
            await asyncio.wait_for(sweep(), 0.5)  # returns at once
            await asyncio.sleep(0.01)
        assert calls[0] == 1
        slow.set()
        await asyncio.sleep(0.01)
        await sweep()
        await asyncio.sleep(0.01)
        assert calls[0] == 2

    asyncio.run(run())


def test_a_close_whose_first_try_met_the_store_away_waits_for_the_inputs_at_the_next(monkeypatch: Any) -> None:
    """A session running before the outage whose close came during it: the close waited for
    its inputs at its first try only, which the outage spent; when the store answered, the
    close and the inputs raced again (an outside re-run: 2 and 8 inputs refused as closed)."""
    import processors.agents.dispatch as agent
    from schemas.errors import InfraError
    from schemas.records import SessionClosed, Terminate

    _quick(monkeypatch)
    monkeypatch.setattr(agent, "CLOSE_WAITS_S", 0.2)

    async def run() -> None:
        store, pub, shell = await _served("0:1")
        away, back = [True], asyncio.Event()
        read = store.session

        async def session(sid: str) -> Any:
            if away[0]:
                raise InfraError("generation store: Redis unreachable")
            return await read(sid)

        store.session = session  # type: ignore[method-assign]
        rec = InputPushed(session_id="s", seq=1, kind="text", payload="x", ts=1.0)

        async def route() -> None:  # waits for the store, and wakes a little after it answers
            await back.wait()
            await asyncio.sleep(0.02)
            await shell.on_input(rec, 0, 3)

        await shell.submit("inputs:s", route)
        await shell.submit("events:s", shell.session_work(SessionClosed(session_id="s", ts=2.0), "0:2"))
        await asyncio.sleep(0.3)  # the close's first try met the store away
        away[0] = False
        back.set()
        await asyncio.gather(*shell.chains.tasks.values())
        order = [type(r).__name__ for r in pub.records if isinstance(r, (RoutedInput, Terminate))]
        assert order == ["RoutedInput", "Terminate"]

    asyncio.run(run())
