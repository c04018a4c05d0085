"""The consumer path on the real broker: valid records processed, garbage dead-lettered."""

from __future__ import annotations

import asyncio
import os
import random
import time
from dataclasses import replace

import pytest
from aiokafka.errors import OutOfOrderSequenceNumber

from schemas.records import DeadLetter, InputPushed, SessionOpened
from schemas.topics import DEAD_LETTERS, SESSION_EVENTS, SESSION_INPUTS
from streams.client import SessionClient
from streams.config import Settings
from streams.kafka import RecordConsumer, RecordProducer
from streams.topics import ensure_topics

pytestmark = pytest.mark.integration


def _settings(bootstrap: str, redis_url: str, namespace: str) -> Settings:
    return Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(
        bootstrap, redis_url)


async def _drain(consumer: RecordConsumer, want: int, timeout_s: float = 20.0) -> list:
    got: list = []
    deadline = asyncio.get_running_loop().time() + timeout_s
    while len(got) < want and asyncio.get_running_loop().time() < deadline:
        got.extend(await consumer.poll(timeout_ms=200))
        await consumer.commit()
    return got


def test_consumer_dead_letters_garbage_and_keeps_going(kafka_bootstrap, redis_url, namespace):
    settings = _settings(kafka_bootstrap, redis_url, namespace)
    rng = random.Random(7)

    async def run() -> None:
        await ensure_topics(settings)
        async with RecordProducer(settings) as producer:
            valid, garbage = [], []
            for i in range(60):
                if rng.random() < 0.4:
                    raw = rng.randbytes(rng.randrange(1, 40))
                    garbage.append(raw)
                    await producer.send_raw(SESSION_EVENTS, raw, key=b"junk")
                else:
                    rec = SessionOpened(session_id=f"s{i}", ts=time.time() + i, prompt=f"p{i}")
                    valid.append(rec)
                    await producer.send(rec)
            consumer = RecordConsumer(settings, [SESSION_EVENTS], producer, name="test-consumer",
                                      group_id=f"{namespace}-g")
            await consumer.start()
            got = await _drain(consumer, len(valid))
            await consumer.stop()
            assert [d.record for d in sorted(got, key=lambda d: d.record.ts)] == valid
            assert consumer.dead_lettered == len(garbage)

            dl = RecordConsumer(settings, [DEAD_LETTERS], producer, name="dl-reader",
                                group_id=f"{namespace}-dl")
            await dl.start()
            letters = await _drain(dl, len(garbage))
            await dl.stop()
            assert len(letters) == len(garbage)
            for d in letters:
                rec = d.record
                assert isinstance(rec, DeadLetter)
                assert rec.source_topic == f"{namespace}.{SESSION_EVENTS}"
                assert rec.consumer == "test-consumer"
                assert rec.reason.startswith("schema:")
                assert rec.key == b"junk"
            assert sorted(d.record.raw for d in letters) == sorted(garbage)

            # committed past the garbage: a new member of the group reads nothing again
            again = RecordConsumer(settings, [SESSION_EVENTS], producer, name="again",
                                   group_id=f"{namespace}-g")
            await again.start()
            assert await again.poll(timeout_ms=1500) == []
            await again.stop()

    asyncio.run(run())


def test_session_client_numbers_inputs(kafka_bootstrap, redis_url, namespace):
    settings = _settings(kafka_bootstrap, redis_url, namespace)

    async def run() -> None:
        await ensure_topics(settings)
        async with SessionClient(settings) as client:
            await client.open("a", prompt="a cat")
            seqs = [await client.push("a", f"line {i}") for i in range(3)]
            await client.close("a")
        assert seqs == [1, 2, 3]
        async with RecordProducer(settings) as producer:
            consumer = RecordConsumer(settings, [SESSION_INPUTS, SESSION_EVENTS], producer,
                                      name="reader", group_id=f"{namespace}-r")
            await consumer.start()
            got = await _drain(consumer, 5)
            await consumer.stop()
        inputs = [d.record for d in got if isinstance(d.record, InputPushed)]
        assert [(i.seq, i.payload) for i in inputs] == [(1, "line 0"), (2, "line 1"), (3, "line 2")]
        assert {type(d.record).__name__ for d in got} == {"InputPushed", "SessionOpened",
                                                           "SessionClosed"}

    asyncio.run(run())



def test_a_session_client_on_a_prefix_with_no_topics_is_refused_at_once(kafka_bootstrap, redis_url, namespace):
    """A producer on the wrong prefix (the fleet's set in a file it did not read) wrote to
    topics no processor reads, which the broker made on first use; it is refused in one line."""
    from schemas.errors import ConfigError

    settings = _settings(kafka_bootstrap, redis_url, f"{namespace}-elsewhere")

    async def run() -> str:
        with pytest.raises(ConfigError) as info:
            async with SessionClient(settings) as client:
                await client.open("a")
        return str(info.value)

    said = asyncio.run(run())
    assert f"no topic {namespace}-elsewhere.session-events, {namespace}-elsewhere.session-inputs on the broker" in said
    # and no producer is left unclosed behind the refusal (aiokafka said so after the line)
    import subprocess
    import sys

    script = ("import asyncio\nfrom streams.client import SessionClient\nfrom streams.config_file import settings_from_env\n"
              "async def main():\n    try:\n        async with SessionClient(settings_from_env()):\n            pass\n"
              "    except Exception as exc:\n        print(type(exc).__name__)\nasyncio.run(main())\n")
    env = {**os.environ, "CHUNKSERVE_KAFKA_BOOTSTRAP": kafka_bootstrap, "CHUNKSERVE_TOPIC_PREFIX": f"{namespace}-elsewhere.",
           "PYTHONWARNINGS": "always"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ConfigError" and "Unclosed" not in done.stderr, done.stdout + done.stderr

def test_the_broker_refuses_a_record_over_its_topics_bound(kafka_bootstrap, redis_url, namespace):
    """A producer that skips chunkserve's own size check meets the topic's max.message.bytes."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import MessageSizeTooLargeError

    from streams.topics import TOPIC_FRAMING_BYTES

    settings = _settings(kafka_bootstrap, redis_url, namespace)

    async def run() -> None:
        catalogue = await ensure_topics(settings)
        limit = catalogue.limit(SESSION_INPUTS) + TOPIC_FRAMING_BYTES
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, max_request_size=8 * limit,
                                    acks="all", enable_idempotence=True)
        await producer.start()
        try:
            topic = catalogue.name(SESSION_INPUTS)
            await producer.send_and_wait(topic, b"x" * (limit // 2), key=b"s")  # within bound
            with pytest.raises(MessageSizeTooLargeError):
                await producer.send_and_wait(topic, b"x" * (2 * limit), key=b"s")
        finally:
            await producer.stop()

    asyncio.run(run())


def test_topics_carry_their_bounds_and_producers_are_idempotent(kafka_bootstrap, redis_url, namespace):
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    from streams.topics import TOPIC_FRAMING_BYTES

    settings = _settings(kafka_bootstrap, redis_url, namespace)

    async def run() -> None:
        catalogue = await ensure_topics(settings)
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            name = catalogue.name(SESSION_INPUTS)
            [resp] = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)])
            entries = resp.to_object()["resources"][0]["config_entries"]
            configs = {c["config_names"]: c["config_value"] for c in entries}
            assert int(configs["max.message.bytes"]) == catalogue.limit(SESSION_INPUTS) + TOPIC_FRAMING_BYTES
            [topic] = await admin.describe_topics([name])
            assert len(topic["partitions"]) == settings.partitions[SESSION_INPUTS]
        finally:
            await admin.close()
        async with RecordProducer(settings) as producer:
            assert producer._producer._txn_manager is not None  # idempotent: a producer id, sequence numbers
            await producer.send(InputPushed(session_id="s1", ts=1.0, seq=1, kind="text", payload="hi"))
            assert producer._producer._txn_manager.producer_id >= 0  # the broker gave it an id

    asyncio.run(run())


def test_a_groupless_read_starts_where_asked_and_stops_at_the_end(kafka_bootstrap, redis_url, namespace):
    """``assign`` from the beginning, from an offset, the last n records and the end;
    ``read_to`` yields what was there when it assigned and stops, whatever follows."""
    settings = _settings(kafka_bootstrap, redis_url, namespace)

    late = iter(range(101, 200))

    async def seqs(start: str | int) -> list[int]:
        consumer = RecordConsumer(settings, [SESSION_INPUTS], None, name="t")
        await consumer.start(subscribe=False)
        try:
            ends = await consumer.assign({SESSION_INPUTS: None}, start)
            async with RecordProducer(settings) as producer:  # after the assignment: not this read's
                await producer.send(InputPushed(session_id="one", seq=next(late), kind="text", payload="late",
                                                ts=time.time()))
            return [d.record.seq async for d in consumer.read_to(ends)]  # type: ignore[attr-defined]
        finally:
            await consumer.stop()

    async def run() -> None:
        await ensure_topics(settings)
        async with RecordProducer(settings, linger_ms=50) as producer:  # batches of several records
            await producer.send_many([InputPushed(session_id="one", seq=i, kind="text", payload="t", ts=time.time())
                                      for i in range(1, 11)])
        assert await seqs("beginning") == list(range(1, 11))
        assert await seqs(4) == [5, 6, 7, 8, 9, 10, 101]  # offsets 4.. of the session's partition
        assert await seqs(-3) == [10, 101, 102]
        assert await seqs(-100) == [*range(1, 11), 101, 102, 103]  # clamped to what the partition holds
        assert await seqs("end") == []
        with pytest.raises(ValueError, match="start must be"):
            await seqs("middle")

    asyncio.run(run())


def test_a_producer_whose_sequence_the_broker_refuses_takes_a_new_id_and_sends_again(
        kafka_bootstrap, redis_url, namespace):
    """On the real broker: a gap in an idempotent producer's sequence (as a batch that failed
    between two the broker took leaves) makes the broker refuse every later batch to that
    partition (OutOfOrderSequenceNumber; an outside run's producer and workers failed so for
    minutes after the cluster restarted). The send is taken through a new producer id, once,
    and so are the sends after it, waited for or not."""
    from aiokafka import TopicPartition

    settings = _settings(kafka_bootstrap, redis_url, namespace)

    async def run() -> None:
        catalogue = await ensure_topics(settings)
        topic = catalogue.name(SESSION_INPUTS)
        rec = InputPushed(session_id="s1", ts=time.time(), seq=1, kind="text", payload="hi")
        async with RecordProducer(settings) as producer:
            first = await producer.send(rec)
            tp, old = TopicPartition(topic, first.partition), producer._producer
            old._txn_manager.increment_sequence_number(tp, 3)  # a gap the broker never saw
            again = await producer.send(replace(rec, seq=2))
            assert producer.renewals == 1 and producer._producer is not old
            assert producer._producer._txn_manager.producer_id != old._txn_manager.producer_id
            assert again.partition == first.partition and again.offset > first.offset
            fresh = producer._producer
            fresh._txn_manager.increment_sequence_number(tp, 3)
            fut = await producer.send(replace(rec, seq=3), wait=False)
            with pytest.raises(OutOfOrderSequenceNumber):
                await fut  # refused: the caller sends it again, as the workers' outbox does
            assert (await producer.send(replace(rec, seq=3))).partition == first.partition
            assert producer.renewals == 2
        consumer = RecordConsumer(settings, [SESSION_INPUTS], None, name="t")
        await consumer.start(subscribe=False)
        try:
            ends = await consumer.assign({SESSION_INPUTS: None}, "beginning")
            seqs = [d.record.seq async for d in consumer.read_to(ends)]  # type: ignore[attr-defined]
        finally:
            await consumer.stop()
        assert seqs == [1, 2, 3], seqs  # each once: nothing the broker refused was written

    asyncio.run(run())
