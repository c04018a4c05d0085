"""Input bounds at the router: the per-session rate rule and a payload limit."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from processors.agents.dispatch import DispatchShell
from processors.input_gate import MAX_REFUSED, InputGate
from schemas.errors import SchemaError
from schemas.input_rate import RateCount, rate_counted, rate_window
from schemas.records import InputPushed
from tests.processors.test_recovery import Sent  # the publisher that keeps what dispatch sends


def test_the_rate_rule_passes_the_first_burst_of_each_window_of_burst_over_rate_seconds() -> None:
    counts = RateCount(rate=2.0, burst=3.0)  # windows of 1.5 s
    assert [counts.passes("s", t, seq) for seq, t in enumerate((0.0, 0.1, 0.2, 0.3, 1.4), 1)] == [True, True, True, False, False]
    assert counts.passes("s", 1.5, 6) and counts.passes("t", 1.4, 1)  # a new window; another session
    assert rate_window(1.49, 2.0, 3.0) == 0 and rate_window(1.5, 2.0, 3.0) == 1
    seeded = RateCount(rate=2.0, burst=3.0)
    seeded.seed("s", 0, [1, 2])  # two inputs of the window read back from the log
    assert [seeded.passes("s", t, seq) for seq, t in ((3, 1.0), (4, 1.1))] == [True, False]
    assert seeded.known("s", 0) and not seeded.known("s", 1) and seeded.start_s(2) == 3.0


def test_a_repeated_seq_in_a_window_counts_once_and_keeps_its_first_verdict() -> None:
    """A producer's retry or a redelivery: a copy of an input that passed is not refused (its
    owner applies the seq once) and does not use up the burst; a copy of a refused one is
    refused again."""
    counts = RateCount(rate=1.0, burst=2.0)  # windows of 2 s
    got = [counts.passes("s", 0.1 * i, seq) for i, seq in enumerate((1, 2, 1, 2, 1, 3, 3, 2))]
    assert got == [True, True, True, True, True, False, False, True]
    again = RateCount(rate=1.0, burst=2.0)
    again.seed("s", 0, [1, 1, 2])  # read back with its repeats: the same count
    assert again.passes("s", 1.0, 2) and not again.passes("s", 1.0, 3)


def test_the_rate_rule_counts_only_inputs_within_the_other_bounds() -> None:
    def rec(seq: int, payload: str = "ok") -> InputPushed:
        return InputPushed(session_id="s", seq=seq, kind="text", payload=payload, ts=0.0)

    assert rate_counted(rec(1), b"s", 10)
    assert not rate_counted(rec(1, "x" * 11), b"s", 10)  # over the size bound
    assert not rate_counted(rec(1), b"other", 10)  # keyed by another id


def test_a_dispatch_that_starts_inside_a_rate_window_counts_what_the_log_holds_of_it() -> None:
    """A restart, or a partition taken over: the window began before this process read the
    partition, so its count starts at the session's inputs read back from the log."""
    asked: list[tuple[int, int, float]] = []

    async def count_in_window(partition: int, offset: int, start_s: float) -> dict[str, list[int]]:
        asked.append((partition, offset, start_s))
        return {"s": [1, 2], "u": [1, 2, 3]}

    shell = DispatchShell(store=None, publisher=None, input_rate=1.0, input_burst=3.0,
                          count_in_window=count_in_window)
    inp = InputPushed(session_id="s", seq=3, kind="text", payload="ok", ts=0.0)

    async def admit(rec: InputPushed, offset: int, at: float) -> str | None:
        await shell.rate_windows.read(rec, rec.session_id.encode(), 0, offset, at)
        return shell.admit_input(rec, rec.session_id.encode(), at)

    assert asyncio.run(admit(inp, 7, 10.0)) is None  # the window of 9-12 s began before 10.0
    assert asked == [(0, 7, 9.0)]
    assert "input rate" in asyncio.run(admit(InputPushed(session_id="s", seq=4, kind="text", payload="ok", ts=0.0), 8, 10.5))
    assert len(asked) == 1  # known since
    assert asyncio.run(admit(InputPushed(session_id="t", seq=1, kind="text", payload="ok", ts=0.0), 9, 12.0)) is None
    assert len(asked) == 1  # a window that began after this process started reading: all of it was read here
    # another session of the partition in the window read back: counted from the same read
    assert "input rate" in asyncio.run(admit(InputPushed(session_id="u", seq=4, kind="text", payload="ok", ts=0.0), 9, 11.0))
    assert len(asked) == 1


def test_router_refuses_oversized_and_too_frequent_inputs_with_a_reason() -> None:
    shell = DispatchShell(store=None, publisher=None, max_input_bytes=10, input_rate=0.001,
                          input_burst=2)

    def push(seq: int, payload: str) -> str | None:
        return shell.admit_input(InputPushed(session_id="s", seq=seq, kind="text",
                                             payload=payload, ts=0.0), b"s", 5.0)

    assert push(1, "x" * 11) is not None and "over the 10-byte limit" in push(1, "x" * 11)
    assert push(1, "ok") is None and push(2, "ok") is None
    assert "input rate" in push(3, "ok")
    assert shell.admit_input(InputPushed(session_id="other", seq=1, kind="text", payload="ok",
                                         ts=0.0), b"other", 5.0) is None  # counts are per session
    misfiled = InputPushed(session_id="other", seq=2, kind="text", payload="ok", ts=0.0)
    assert "not the session id" in shell.admit_input(misfiled, b"s", 5.0)
    assert shell.gate.refused_before("other") == (2,)  # named on the session's next routed input


def test_an_input_off_its_keys_partition_is_refused_with_the_partitioner_to_use() -> None:
    """librdkafka's default partitioner (CRC32) puts a key elsewhere than murmur2 does, where
    a recovery's replay of the session's inputs would not find it: refused at once, named."""
    from streams.topics import misplaced, partition_for_key

    shell = DispatchShell(store=None, publisher=None)
    rec = InputPushed(session_id="s", seq=1, kind="text", payload="ok", ts=0.0)
    home = partition_for_key(b"s", 8)
    assert misplaced(b"s", home, 8) is None and shell.admit_input(rec, b"s", 5.0, None) is None
    why = shell.admit_input(rec, b"s", 5.0, misplaced(b"s", (home + 1) % 8, 8))
    assert f"hashes to partition {home} of 8" in why and "partitioner=murmur2_random" in why
    assert shell.gate.refused_before("s") == (1,)  # named on the session's next routed input
    assert misplaced(b"t", 5, None) is None  # the count not known yet: unchecked
    assert misplaced(b"t", 0, 1) is None and misplaced(None, 3, 8) is None  # one partition; no key


def test_the_partition_count_comes_from_the_groups_snapshot_else_the_clusters_metadata() -> None:
    """Only the group's leader keeps aiokafka's snapshot of partition counts; another replica
    reads the cluster metadata (a stand-in for faust's consumer: its two lookups only)."""
    from types import SimpleNamespace

    from processors.agents.dispatch_streams import partitions_of

    def stream(snapshot: int | None, cluster: set[int] | None) -> object:
        aio = SimpleNamespace(partitions_for_topic=lambda topic: cluster)
        consumer = SimpleNamespace(topic_partitions=lambda topic: snapshot,
                                   _thread=SimpleNamespace(_ensure_consumer=lambda: aio))
        return SimpleNamespace(app=SimpleNamespace(consumer=consumer))

    assert partitions_of(stream(8, None), "t") == 8
    assert partitions_of(stream(None, {0, 1, 2}), "t") == 3
    assert partitions_of(stream(None, None), "t") is None
    assert partitions_of(SimpleNamespace(app=SimpleNamespace(consumer=None)), "t") is None


def test_a_seq_below_one_is_no_input() -> None:
    """Refused by the schema (the AsyncAPI document's minimum), so dispatch dead-letters it
    as undecodable; it said minimum 0 while dispatch refused 0."""
    with pytest.raises(SchemaError, match="seq: must be >= 1, got 0"):
        InputPushed(session_id="s", seq=0, kind="text", payload="hi", ts=0.0)


def test_the_gate_hands_its_refused_seqs_to_the_next_routed_input_once() -> None:
    gate = InputGate(max_bytes=10, rate=1000.0, burst=1000.0)
    assert gate.refuse("s", 2, 11, 0.0) is not None and gate.refuse("s", 3, 11, 0.0) is not None
    assert gate.refuse("s", 4, 2, 0.0) is None
    gate.note_refused("t", 7)  # refused elsewhere (a misfiled key)
    assert gate.refused_before("s") == (2, 3) and gate.refused_before("s") == ()
    assert gate.refused_before("t") == (7,)
    for seq in range(1, 200):  # bounded per session: the latest kept
        gate.refuse("u", seq, 11, 0.0)
    kept = gate.refused_before("u")
    assert len(kept) == MAX_REFUSED and kept[-1] == 199


def test_a_refused_seq_after_the_routed_input_waits_for_a_later_one() -> None:
    """Inputs 18-20 refused behind a session's open (16 records parked already), then 17, parked,
    routed once the open was admitted: it named 18-20, which its owner does not withdraw (they
    come after it), and 21 named nothing, so the owner applied 18-20 from the log although
    each was dead-lettered (an outside run). A seq is named on the first input routed after it."""
    gate = InputGate(max_bytes=10, rate=1000.0, burst=1000.0)
    for seq in (18, 19, 20):
        gate.note_refused("s", seq)
    assert gate.refused_before("s", 17) == ()  # 17 names none of them
    assert gate.refused_before("s", 21) == (18, 19, 20) and gate.refused_before("s", 22) == ()


def test_an_input_refused_on_its_route_is_named_on_the_next_routed_one() -> None:
    """An input for a session dispatch did not know yet (its open still admitting) is refused
    on its route, not at the gate: it is named too, so its owner neither waits for it nor
    applies it from the log when it meets the gap."""
    from processors.dispatch import Input

    letters = Sent()
    shell = DispatchShell(store=None, publisher=letters)
    asyncio.run(shell.refuse(Input("s", 1, "text", "hi", partition=0, offset=5), "no owner for session"))
    assert len(letters.records) == 1 and shell.gate.refused_before("s") == (1,)


def test_an_input_refused_for_its_schema_is_named_on_the_next_routed_one() -> None:
    """An input dead-lettered for its schema (a wrong cs-t header, found by an outside
    producer) held the session's later inputs 5 s, its owner waiting for the gap: the seq its
    bytes name is noted as refused, when keyed by the session they name, as any refusal is."""
    from types import SimpleNamespace

    from schemas.codec import encode

    from processors.agents.dispatch_streams import schema_refused

    body = encode(InputPushed(session_id="s", seq=4, kind="text", payload="hi", ts=1.0))
    cut = encode(InputPushed(session_id="t", seq=9, kind="text", payload="x", ts=1.0))[:-3]
    said = [schema_refused(SimpleNamespace(key=key, value=value), 1 << 20)
            for key, value in ((b"s", body), (b"other", body), (b"s", b"\xc1 not msgpack"), (b"t", cut),
                               (b"s", body.replace(b"\x04", b"\x00")))]  # seq 0: no seq it could be
    assert said == [("s", 4), None, None, None, None]  # keyed otherwise, not msgpack, cut short: nothing


def test_a_worker_with_another_rate_rule_is_named() -> None:
    """A worker started by hand with other rate settings would replay with another rule:
    dispatch names the difference (it logs it as an error when the worker comes up)."""
    gate = InputGate(100, rate=5.0, burst=10.0)
    assert gate.other_rule(5.0, 10.0) is None and gate.other_rule(0.0, 0.0) is None  # the same; not said
    why = gate.other_rule(50.0, 100.0)
    assert why is not None and "50/s, burst 100" in why and "5/s, burst 10" in why


def test_an_input_routed_again_names_the_inputs_refused_before_it() -> None:
    """Its owner refused it (the session had moved on): dispatch routes it again, naming the
    session's inputs refused for the rate below it, as its first routing did, so the new owner
    does not wait for them (a re-routed copy named none, and the new owner waited until the
    close refused what followed)."""
    from processors.dispatch import Publish, RouteAgain
    from schemas.records import Generation, RoutedInput

    sent = Sent()
    shell = DispatchShell(store=None, publisher=sent, input_rate=0.001, input_burst=1)
    for seq in (1, 2, 3):  # 2 and 3 over the rate
        shell.admit_input(InputPushed(session_id="s", seq=seq, kind="text", payload="ok", ts=0.0), b"s", 5.0)
    assert shell.gate.refused_before("s") == (2, 3)  # named on the first routing of input 4
    again = RoutedInput(worker_id="w", session_id="s", generation=Generation("w", 2), seq=4, kind="text",
                        payload="ok", ts=0.0, source_partition=0, source_offset=8)  # its own place in the log
    asyncio.run(shell.carry_out(RouteAgain(again), []))
    first = RoutedInput(worker_id="w", session_id="s", generation=Generation("w", 2), seq=5, kind="text",
                        payload="ok", ts=0.0, source_partition=0, source_offset=9)
    asyncio.run(shell.carry_out(Publish(first), []))
    assert [r.refused_before for r in sent.records] == [(2, 3), ()]  # a first routing keeps its own names


def test_a_flood_of_inputs_for_sessions_nobody_opened_does_not_hold_up_the_others() -> None:
    """Inputs of unknown sessions are read again (their open may be in flight) within a
    budget of their own: past it they are refused at once, so 1,024 of them (each a new id,
    which the per-session rate rule does not see) no longer hold every in-flight place for
    10 s while an input of a live session waits behind them."""
    from schemas.records import DeadLetter, Generation, RoutedInput
    from streams.generations import StoreState
    from streams.store_records import SessionView

    class Store:
        async def session(self, sid: str) -> SessionView | None:
            await asyncio.sleep(0)  # answers later, as Redis does: every input is read before one pauses
            return SessionView(Generation("w1", 1), StoreState.ACTIVE, True, None, None, None) if sid == "live" else None

        async def load_view(self) -> dict:
            return {}

    async def run() -> tuple[int, Sent, DispatchShell]:
        sent = Sent()
        shell = DispatchShell(Store(), sent, owner_wait_s=3.0)  # 64 of them read again, the rest refused
        for i in range(1024):
            rec = InputPushed(session_id=f"made-up-{i}", seq=1, kind="text", payload="x", ts=0.0)
            await shell.submit(f"inputs:{rec.session_id}", lambda rec=rec: shell.on_input(rec))
        live = InputPushed(session_id="live", seq=1, kind="text", payload="hi", ts=0.0)
        # the consumer loop hands it over at once (the old shell held every place for 3 s)
        await asyncio.wait_for(shell.submit("inputs:live", lambda: shell.on_input(live)), 0.5)
        await asyncio.sleep(0.5)
        routed = len(sent.of(RoutedInput))
        await asyncio.gather(*list(shell.chains.tasks.values()))  # the budgeted ones' re-reads run out
        return routed, sent, shell

    routed, sent, shell = asyncio.run(run())
    assert routed == 1  # the live session's input went out before the made-up ones' re-reads ended
    refusals = sent.of(DeadLetter)
    assert len(refusals) == 1024 and all("no owner for session" in d.reason for d in refusals)
    assert not shell.rereads.now  # the budget is given back


def test_a_flood_of_opens_while_the_fleet_is_full_does_not_hold_up_the_others() -> None:
    """Opens that find every worker full wait for room within a budget of their own (256 at
    once): past it they are refused at once, so 1,024 opens of new ids no longer hold every
    in-flight place for the admission timeout while an input of a live session waits behind
    them. Each refused open is dead-lettered with its reason (the caller's ``dead_letter``);
    a flood of one id waits once."""
    from types import SimpleNamespace

    from processors.dispatch_types import MAX_WAITING
    from schemas.records import Generation, RoutedInput, SessionOpened
    from streams.generations import StoreState
    from streams.store_records import SessionView

    class Store:
        async def session(self, sid: str) -> SessionView | None:
            return SessionView(Generation("w1", 1), StoreState.ACTIVE, True, None, None, None) if sid == "live" else None

        async def load_view(self) -> dict:
            return {"w1": SimpleNamespace(used=4, capacity=4, draining=False, down=False)}

    async def run() -> tuple[int, list[str], DispatchShell, float]:
        sent, refused = Sent(), []
        shell = DispatchShell(Store(), sent, admission_timeout_s=2.0)

        async def opened(sid: str) -> None:
            why = await shell.on_session_event(SessionOpened(session_id=sid, ts=0.0, prompt=""))
            if why is not None:
                refused.append(why)

        for i in range(1024):
            await shell.submit(f"events:new-{i}", lambda i=i: opened(f"new-{i}"))
        live = InputPushed(session_id="live", seq=1, kind="text", payload="hi", ts=0.0)
        await asyncio.wait_for(shell.submit("inputs:live", lambda: shell.on_input(live)), 0.5)
        await asyncio.sleep(0.5)
        routed = len(sent.of(RoutedInput))
        await asyncio.gather(*list(shell.chains.tasks.values()))
        start = time.monotonic()
        for _ in range(300):  # one id, over and over: the first waits, the rest follow it at once
            await shell.submit("events:same", lambda: opened("same"))
        await asyncio.gather(*list(shell.chains.tasks.values()))
        return routed, refused, shell, time.monotonic() - start

    routed, refused, shell, same_s = asyncio.run(run())
    assert routed == 1  # the live session's input went out while the opens waited
    at_once = [w for w in refused if "other sessions wait for room already" in w]
    timed_out = [w for w in refused if "within 2 s" in w]
    again = [w for w in refused if "gave up" in w]
    assert len(at_once) == 1024 - MAX_WAITING and len(timed_out) == MAX_WAITING + 1 and len(again) == 299
    assert same_s < 2.0 + 1.5  # 300 opens of one id took about one admission timeout, not 300
    assert shell.waiting == 0  # the budget is given back


def _full_fleet_store(live: str = "live") -> object:
    from types import SimpleNamespace

    from schemas.records import Generation
    from streams.generations import StoreState
    from streams.store_records import SessionView

    class Store:
        async def session(self, sid: str) -> SessionView | None:
            return SessionView(Generation("w1", 1), StoreState.ACTIVE, True, None, None, None) if sid == live else None

        async def load_view(self) -> dict:
            return {"w1": SimpleNamespace(used=4, capacity=4, draining=False, down=False)}

    return Store()


def test_records_behind_a_waiting_open_wait_without_an_in_flight_place() -> None:
    """256 opens wait for room (the budget), each followed by three more records of its
    session: those wait behind it without a place, so the 1,024 places are not all held for
    the admission timeout and an input of a live session is handed over while the opens still
    wait (before, 256 + 768 pieces held all 1,024 until the opens were refused)."""
    from processors.dispatch_types import MAX_WAITING
    from schemas.records import RoutedInput, SessionActive, SessionOpened

    async def run() -> tuple[int, int, list[str], DispatchShell, int]:
        sent, refused = Sent(), []
        shell = DispatchShell(_full_fleet_store(), sent, admission_timeout_s=3.0)

        async def handle(rec: object) -> None:
            why = await shell.on_session_event(rec)
            if why is not None:
                refused.append(why)

        async def refuse(why: str) -> None:
            refused.append(why)

        for i in range(MAX_WAITING):
            sid = f"new-{i}"
            await shell.submit(f"events:{sid}", lambda sid=sid: handle(SessionOpened(session_id=sid, ts=0.0, prompt="")),
                               refused=refuse)
        await asyncio.sleep(0.2)  # each open has found the fleet full and waits
        for i in range(MAX_WAITING):
            sid = f"new-{i}"
            for _ in range(3):
                await shell.submit(f"events:{sid}", lambda sid=sid: handle(SessionActive(session_id=sid, ts=0.0)),
                                   refused=refuse)
        parked = shell.chains.parked.total()
        live = InputPushed(session_id="live", seq=1, kind="text", payload="hi", ts=0.0)
        await asyncio.wait_for(shell.submit("inputs:live", lambda: shell.on_input(live)), 2.0)
        for _ in range(200):  # polled, not slept: a loaded machine is slower, not wrong
            if sent.of(RoutedInput):
                break
            await asyncio.sleep(0.01)
        routed, refused_then = len(sent.of(RoutedInput)), len(refused)
        await asyncio.gather(*list(shell.chains.tasks.values()))
        return routed, refused_then, refused, shell, parked

    routed, refused_then, refused, shell, parked = asyncio.run(run())
    assert parked == 3 * MAX_WAITING
    assert routed == 1 and refused_then == 0  # the live session's input went out while the opens still waited
    assert len([w for w in refused if "within 3 s" in w]) == MAX_WAITING
    assert len(refused) == 4 * MAX_WAITING  # every record ended refused (the sessions were never admitted)
    assert not shell.chains.parked and shell.waiting == 0  # the budgets are given back


def test_past_its_bound_a_record_behind_a_waiting_open_is_refused_at_once_with_the_reason() -> None:
    from processors.agents.input_budgets import MAX_PARKED_PER_KEY
    from schemas.records import SessionActive, SessionOpened

    async def run() -> tuple[list[str], list[str], DispatchShell]:
        shell, handled, at_once = DispatchShell(_full_fleet_store(), Sent(), admission_timeout_s=1.0), [], []

        async def handle(rec: object) -> None:
            handled.append(type(rec).__name__)
            await shell.on_session_event(rec)

        async def refuse(why: str) -> None:
            at_once.append(why)

        await shell.submit("events:s", lambda: handle(SessionOpened(session_id="s", ts=0.0, prompt="")), refused=refuse)
        await asyncio.sleep(0.2)
        for _ in range(MAX_PARKED_PER_KEY + 4):
            await shell.submit("events:s", lambda: handle(SessionActive(session_id="s", ts=0.0)), refused=refuse)
        refused_before_timeout = list(at_once)
        await asyncio.gather(*list(shell.chains.tasks.values()))
        return refused_before_timeout, handled, shell

    refused, handled, shell = asyncio.run(run())
    assert refused == [f"s waits for room, and {MAX_PARKED_PER_KEY} of its records wait behind it already"] * 4
    assert handled == ["SessionOpened"] + ["SessionActive"] * MAX_PARKED_PER_KEY  # the parked ones, in order
    assert not shell.chains.parked


def test_an_input_refused_behind_its_sessions_wait_is_dead_lettered_and_named_on_the_next_routed_one() -> None:
    letters: list[tuple[object, str, str]] = []

    class Publisher:
        async def dead_letter(self, msg: object, reason: str, source: str) -> None:
            letters.append((msg, reason, source))

    shell = DispatchShell(store=None, publisher=None)
    rec = InputPushed(session_id="s", seq=7, kind="text", payload="x", ts=0.0)
    asyncio.run(shell.refuse_parked(rec, "the record", "s waits for room", Publisher()))
    assert letters == [("the record", "refused: s waits for room", "dispatch")]
    assert 7 in shell.gate.refused_before("s")


async def _waiting_open_fleet(admission_timeout_s: float) -> tuple[Any, DispatchShell, Sent]:
    """One worker of one slot, taken by session ``full``; dispatch waits ``owner_wait_s`` 0.2 s
    for an unknown session's open."""
    from schemas.records import SessionOpened
    from streams.generations_memory import MemoryGenerationStore

    store, sent = MemoryGenerationStore("t"), Sent()
    shell = DispatchShell(store, sent, view_ttl_s=0.0, admission_timeout_s=admission_timeout_s, owner_wait_s=0.2)
    await store.register_worker("w1", 1)
    await shell.on_session_event(SessionOpened(session_id="full", ts=0.0, prompt="p"))
    return store, shell, sent


def test_an_input_behind_an_open_that_waits_for_room_waits_with_it_and_is_routed_once_admitted() -> None:
    """An outside producer's open and first input, sent together while every worker is full:
    the input waits as long as its open waits for room (not only the 0.2 s an unknown
    session's input is read again for), the session's next inputs wait behind it, and all
    are routed once a slot frees up and the open is admitted."""
    from schemas.records import Assign, RoutedInput, SessionOpened

    async def run() -> tuple[list[int], list[str]]:
        store, shell, sent = await _waiting_open_fleet(admission_timeout_s=5.0)
        refused: list[str] = []

        async def event(rec: object) -> None:
            why = await shell.on_session_event(rec)
            if why is not None:
                refused.append(why)

        async def refuse(why: str) -> None:
            refused.append(why)

        await shell.submit("events:s", lambda: event(SessionOpened(session_id="s", ts=0.0, prompt="p")), refused=refuse)
        for seq in (1, 2, 3):
            rec = InputPushed(session_id="s", seq=seq, kind="text", payload="x", ts=0.0)
            await shell.submit("inputs:s", lambda rec=rec: shell.on_input(rec), refused=refuse)
        await asyncio.sleep(1.0)  # five times the unknown session's wait
        assert not sent.of(RoutedInput) and not refused
        gen = (await store.session("full")).generation
        await store.claim("full", gen)
        await store.release("full", gen, close=True)  # the user of `full` leaves: a slot frees up
        await asyncio.gather(*list(shell.chains.tasks.values()))
        assert [a.session_id for a in sent.of(Assign)] == ["full", "s"]
        return [r.seq for r in sent.of(RoutedInput)], refused

    routed, refused = asyncio.run(run())
    assert routed == [1, 2, 3] and refused == []


def test_an_input_behind_an_open_that_found_no_room_is_refused_with_the_open_and_says_why() -> None:
    from schemas.records import DeadLetter, SessionOpened

    async def run() -> tuple[list[str], list[str]]:
        store, shell, sent = await _waiting_open_fleet(admission_timeout_s=0.6)
        opens: list[str] = []

        async def event(rec: object) -> None:
            opens.append(await shell.on_session_event(rec) or "")

        await shell.submit("events:s", lambda: event(SessionOpened(session_id="s", ts=0.0, prompt="p")))
        rec = InputPushed(session_id="s", seq=1, kind="text", payload="x", ts=0.0)
        await shell.submit("inputs:s", lambda: shell.on_input(rec))
        await asyncio.gather(*list(shell.chains.tasks.values()))
        return opens, [d.reason for d in sent.of(DeadLetter)]

    opens, inputs = asyncio.run(run())
    assert len(opens) == 1 and "no worker had room for session s" in opens[0]
    assert len(inputs) == 1 and "its open was refused (no worker had room for session s)" in inputs[0], inputs


def test_past_the_bound_a_busy_sessions_rate_count_is_kept_and_a_quiet_ones_forgotten(monkeypatch: Any) -> None:
    """The bound forgot the sessions first seen longest ago, which in a long-lived fleet are
    the ones still streaming: a busy session's count started again mid-window, and dispatch
    routed inputs a recovery's replay of the log refuses (a review's repro). It forgets the
    sessions seen longest ago."""
    import schemas.input_rate as rate

    monkeypatch.setattr(rate, "MAX_SESSIONS", 10)
    counts = RateCount(rate=1.0, burst=5.0)  # windows of 5 s
    assert all(counts.passes("hot", 0.1, seq) for seq in range(1, 6))
    for i in range(12):  # other sessions come and go while the hot one keeps streaming
        counts.passes(f"quiet-{i}", 0.2, 1)
        assert not counts.passes("hot", 0.2, 6 + i)  # over its burst in this window: refused
    assert not counts.known("quiet-0", 0)  # seen longest ago: forgotten
    gate = InputGate(10, 1.0, 5.0)  # the refused seqs the next routed input names: the same bound
    for i in range(12):
        gate.note_refused("hot", i + 1)
        gate.note_refused(f"quiet-{i}", 1)
    assert gate.pending("hot") == tuple(range(1, 13)) and gate.pending("quiet-0") == ()
