"""Inputs and events around a full fleet, through the running dispatch processor on the real
broker and Redis: an outside producer sends a session's open and its first input together
while every worker is full, then closes a session and returns to it at once."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import AsyncIterator

import msgpack
import pytest

from infra.flow import EventLog
from infra.local import LocalFleet
from schemas.records import (Assign, DeadLetter, InputAccepted, InputPushed, SessionActive, SessionClosed,
                             SessionOpened, WorkerUp)
from schemas.topics import DEAD_LETTERS, WORKER_COMMANDS, WORKER_EVENTS
from streams.config import Settings
from streams.kafka import RecordProducer
from streams.topics import ensure_topics

pytestmark = pytest.mark.integration


@contextlib.asynccontextmanager
async def _one_slot_taken(settings: Settings, fleet: LocalFleet) -> AsyncIterator[tuple[RecordProducer, EventLog]]:
    """Dispatch and one worker of one slot, held by the session ``full``; a producer and a log
    of dead-letters, worker-commands and worker-events."""
    await ensure_topics(settings)
    fleet.start_processor("dispatch")
    fleet.start_worker("w", capacity=1)
    async with RecordProducer(settings) as producer, \
            EventLog(settings, producer, topics=(DEAD_LETTERS, WORKER_COMMANDS, WORKER_EVENTS)) as log:
        await log.until(lambda rs: any(isinstance(x, WorkerUp) for x in rs), 90, "the worker up")
        await producer.send(SessionOpened(session_id="full", ts=time.time()))
        await log.until(lambda rs: any(isinstance(x, Assign) and x.session_id == "full" for x in rs), 60,
                        "the first session placed")
        yield producer, log


def test_an_input_waits_with_its_open_for_room_and_a_return_after_a_close_is_refused(kafka_bootstrap, redis_url,
                                                                                     namespace, tmp_path):
    """The input of a session whose open waits for room (one worker of one slot, held by
    ``full``) is neither refused nor lost while the open waits past the 10 s an unknown
    session's input is read again for: once ``full`` closes, the open is admitted and the
    input applied (it was refused as "never opened" at 10 s, and the session ran without it).
    A return sent right after its session's close is refused to dead-letters as one after the
    close (it went to the closing owner as a Resume and got no verdict)."""
    settings = Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(kafka_bootstrap, redis_url)
    fleet = LocalFleet(settings, tmp_path / "logs")

    def accepted(rs: list, sid: str) -> list[int]:
        return [x.seq for x in rs if isinstance(x, InputAccepted) and x.session_id == sid]

    async def run() -> tuple[list, list[str], list[str]]:
        async with _one_slot_taken(settings, fleet) as (producer, log):
            await producer.send(SessionOpened(session_id="late", ts=time.time()))
            await producer.send(InputPushed(session_id="late", seq=1, kind="text", payload="hello", ts=time.time()))
            await asyncio.sleep(12.0)  # past the 10 s an unknown session's input is read again for
            waited = [x.reason for x in log.records if isinstance(x, DeadLetter)]
            await producer.send(SessionClosed(session_id="full", ts=time.time()))
            await log.until(lambda rs: accepted(rs, "late") == [1], 60, "the waiting session's input applied")
            await producer.send(SessionClosed(session_id="late", ts=time.time()))
            await producer.send(SessionActive(session_id="late", ts=time.time()))
            await log.until(lambda rs: any(isinstance(x, DeadLetter) and "late was closed" in x.reason for x in rs),
                            60, "the return after the close refused")
            return log.records, waited, [x.reason for x in log.records if isinstance(x, DeadLetter)]

    try:
        records, waited, refused = asyncio.run(run())
    finally:
        fleet.stop_all()
    assert waited == []  # nothing refused while the open waited for room
    assert [a.session_id for a in records if isinstance(a, Assign)][:2] == ["full", "late"]
    assert len(refused) == 1 and "session late was closed: a session id is not used again" in refused[0], refused


def test_an_input_written_after_the_close_of_a_session_waiting_for_room_is_refused(kafka_bootstrap, redis_url,
                                                                                   namespace, tmp_path):
    """A close wins: the session's open waits for room, its input 1 with it; the producer
    closes it, and once the close is acknowledged, sends input 2. When room comes the session
    is admitted and closed; input 2 is refused as one after the close, never applied (an
    outside producer's was, for 3 of 10 sessions: the close, behind the waiting open, waited
    for every input read until its turn, and input 2 reached the owner ahead of the Terminate).
    Input 1, read before the close, ends one way."""
    settings = Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(kafka_bootstrap, redis_url)
    fleet = LocalFleet(settings, tmp_path / "logs")

    def verdicts(rs: list, seq: int) -> list[str]:
        return ([f"accepted by {x.worker_id}" for x in rs if isinstance(x, InputAccepted) and x.session_id == "late"
                 and x.seq == seq]
                + [x.reason for x in rs if isinstance(x, DeadLetter) and x.key == b"late"
                   and msgpack.unpackb(x.raw).get("seq") == seq])

    async def run() -> list:
        async with _one_slot_taken(settings, fleet) as (producer, log):
            await producer.send(SessionOpened(session_id="late", ts=time.time()))
            await producer.send(InputPushed(session_id="late", seq=1, kind="text", payload="before", ts=time.time()))
            await producer.send(SessionClosed(session_id="late", ts=time.time()))
            await asyncio.sleep(0.3)
            await producer.send(InputPushed(session_id="late", seq=2, kind="text", payload="after", ts=time.time()))
            await asyncio.sleep(2.0)
            await producer.send(SessionClosed(session_id="full", ts=time.time()))
            await log.until(lambda rs: verdicts(rs, 1) and verdicts(rs, 2), 60, "a verdict for each input")
            await asyncio.sleep(3.0)  # a second verdict would come within it
            return log.records

    try:
        records = asyncio.run(run())
    finally:
        fleet.stop_all()
    assert [a.session_id for a in records if isinstance(a, Assign)][:2] == ["full", "late"]  # admitted, then closed
    after = verdicts(records, 2)
    assert len(after) == 1 and "session closed before input 2 was applied" in after[0], after
    assert len(verdicts(records, 1)) == 1, verdicts(records, 1)


def test_inputs_refused_behind_a_waiting_open_are_never_applied(kafka_bootstrap, redis_url, namespace, tmp_path):
    """Twenty inputs behind an open that waits for room: past the records a session may park,
    they are refused to dead-letters; once the open is admitted, an input sent later must not
    bring them back. The parked input routed first named them, its owner withdrew none (they
    came after it), the next named none, and the owner applied the refused ones from the log
    (an outside run: each both dead-lettered and accepted). Each input ends one way only."""
    settings = Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(kafka_bootstrap, redis_url)
    fleet = LocalFleet(settings, tmp_path / "logs")

    def accepted(rs: list) -> list[int]:
        return [x.seq for x in rs if isinstance(x, InputAccepted) and x.session_id == "late"]

    async def run() -> list:
        async with _one_slot_taken(settings, fleet) as (producer, log):
            await producer.send(SessionOpened(session_id="late", ts=time.time()))
            for seq in range(1, 21):  # as a front end types: one every 0.2 s
                await producer.send(InputPushed(session_id="late", seq=seq, kind="text", payload=f"p{seq}", ts=time.time()))
                await asyncio.sleep(0.2)
            await log.until(lambda rs: any(isinstance(x, DeadLetter) and "late waits for room" in x.reason for x in rs),
                            20, "the inputs past what a session parks refused")
            await producer.send(SessionClosed(session_id="full", ts=time.time()))
            await log.until(lambda rs: len(accepted(rs)) >= 1, 60, "the parked inputs applied")
            await asyncio.sleep(1.0)
            await producer.send(InputPushed(session_id="late", seq=21, kind="text", payload="p21", ts=time.time()))
            await log.until(lambda rs: 21 in accepted(rs), 60, "the later input applied")
            await asyncio.sleep(8.0)  # past the owner's 5 s gap wait: what it would fill from the log, it has
            return log.records

    try:
        records = asyncio.run(run())
    finally:
        fleet.stop_all()
    refused = {msgpack.unpackb(x.raw)["seq"] for x in records
               if isinstance(x, DeadLetter) and "late waits for room" in x.reason}  # the letter keeps the input's bytes
    applied = accepted(records)
    assert refused and not refused & set(applied), (sorted(refused), applied)
    assert sorted(refused | set(applied)) == list(range(1, 22)) and len(applied) == len(set(applied))


def test_an_open_waiting_for_room_outlives_its_dispatch(kafka_bootstrap, redis_url, namespace, tmp_path):
    """An open and its input wait for room; the dispatch process is SIGKILLed meanwhile. Its
    offsets were committed while they waited (faust acked each as the next was read), so the
    restarted dispatch never read them again: no verdict, the session lost (an outside run).
    Acked only once handled, they are read again, admitted when room comes, the input applied."""
    settings = Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(kafka_bootstrap, redis_url)
    fleet = LocalFleet(settings, tmp_path / "logs")

    async def run() -> list:
        async with _one_slot_taken(settings, fleet) as (producer, log):
            await producer.send(SessionOpened(session_id="late", ts=time.time()))
            await producer.send(InputPushed(session_id="late", seq=1, kind="text", payload="hello", ts=time.time()))
            await asyncio.sleep(8.0)  # past faust's commit interval: what it acked is committed
            fleet.kill("dispatch-0")
            fleet.restart("dispatch-0")
            await asyncio.sleep(5.0)
            await producer.send(SessionClosed(session_id="full", ts=time.time()))
            await log.until(lambda rs: any(isinstance(x, InputAccepted) and x.session_id == "late" for x in rs), 90,
                            "the waiting session admitted and its input applied")
            return log.records

    try:
        records = asyncio.run(run())
    finally:
        fleet.stop_all()
    assert [x.seq for x in records if isinstance(x, InputAccepted) and x.session_id == "late"] == [1]
    assert not [x for x in records if isinstance(x, DeadLetter)], [x.reason for x in records if isinstance(x, DeadLetter)]
