"""The embedded broker's own cost: CPU while one consumer keeps up with a steady producer.

Why it exists: on the embedded Tansu (memory storage) a fetch costs time that grows with
how many records the partition already holds, so a long run on one machine slows down as
its topics fill up, whatever chunkserve does. This measures it on its own: a producer sends
``rate`` records per second into ``partitions`` partitions for ``seconds``; a consumer
(assigned, no group) reads them as they come; every ``window_s`` the broker process's CPU
share is sampled, with the one-hop latency (handed to the producer -> read by the consumer)
of the records sent in that window.

``hop_floor_ms`` is that hop on the idle broker, for a few fetch waits: a low-rate producer,
a consumer with ``fetch_max_wait_ms`` = W. A broker that answers a fetch when records arrive
shows about the same hop for every W; one that holds a fetch for its whole wait shows a hop
that grows with W. Against an external broker (``CHUNKSERVE_KAFKA_BOOTSTRAP``) there is no
process to sample and the benchmark refuses.

It runs on this machine's embedded broker (Apache Kafka where Java is here); ``compare``
runs the same load on the other embedded one too, one after the other, in the same run.
Producers are idempotent where the broker has them (Kafka), as chunkserve's are.
"""

from __future__ import annotations

import asyncio
import os
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

from .control_plane import percentiles

__all__ = ["run", "HOP_FLOOR_WAITS_MS"]

HOP_FLOOR_WAITS_MS = (2, 10, 50)
_STAMP = struct.Struct(">d")  # the send time, first in each record's value


async def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    from streams.topics import until_led

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        await admin.close()
    await until_led({"bootstrap_servers": bootstrap}, {topic: partitions})


def _hops_ms(batch: dict[Any, list[Any]]) -> list[float]:
    """The one-hop latency of each record of a ``getmany`` batch, from the send time it carries."""
    now = time.perf_counter()
    return [(now - _STAMP.unpack_from(m.value)[0]) * 1e3 for ms in batch.values() for m in ms]


def _cpu_s(pid: int) -> float:
    import psutil

    return sum(psutil.Process(pid).cpu_times()[:2])  # user + system


async def _load(bootstrap: str, pid: int, rate: int, seconds: int, partitions: int,
                window_s: float, idempotent: bool) -> list[dict[str, float]]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    await _create_topic(bootstrap, "bench-broker", partitions)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=1, acks="all",
                                enable_idempotence=idempotent)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, fetch_max_wait_ms=10, group_id=None)
    await producer.start()
    await consumer.start()
    consumer.assign([TopicPartition("bench-broker", p) for p in range(partitions)])
    hops: list[float] = []  # one-hop latency of each record read, in ms, in reading order

    async def read() -> None:
        while True:
            batch = await consumer.getmany(timeout_ms=100)
            hops.extend(_hops_ms(batch))

    reader = asyncio.create_task(read())
    windows: list[dict[str, float]] = []
    try:
        t0, sent = time.perf_counter(), 0
        mark_t, mark_cpu, mark_hops = t0, _cpu_s(pid), 0
        while sent < rate * seconds:
            await producer.send("bench-broker", _STAMP.pack(time.perf_counter()) + b"x" * 92,
                                key=str(sent).encode())
            sent += 1
            await asyncio.sleep(max(0.0, t0 + sent / rate - time.perf_counter()))
            now = time.perf_counter()
            if now - mark_t >= window_s:
                cpu = _cpu_s(pid)
                windows.append({"t_s": round(now - t0, 1), "records": sent,
                                "broker_cpu_pct": round(100 * (cpu - mark_cpu) / (now - mark_t), 1),
                                "hop_ms": percentiles(hops[mark_hops:])})
                mark_t, mark_cpu, mark_hops = now, cpu, len(hops)
        await producer.flush()
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await consumer.stop()
        await producer.stop()
    return windows


async def _hop_floor(bootstrap: str, wait_ms: int, idempotent: bool, records: int = 100,
                     rate: float = 50.0) -> dict[str, float]:
    """One-hop latency on an otherwise idle broker, the consumer fetching with ``wait_ms``."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    topic = f"bench-hop-{wait_ms}"
    await _create_topic(bootstrap, topic, 1)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0, acks="all",
                                enable_idempotence=idempotent)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, fetch_max_wait_ms=wait_ms, group_id=None)
    await producer.start()
    await consumer.start()
    consumer.assign([TopicPartition(topic, 0)])
    hops: list[float] = []

    async def read() -> None:
        while len(hops) < records:
            batch = await consumer.getmany(timeout_ms=1000)
            hops.extend(_hops_ms(batch))

    reader = asyncio.create_task(read())
    try:
        await asyncio.sleep(0.5)  # the consumer's first fetch is out
        for _ in range(records):
            await producer.send(topic, _STAMP.pack(time.perf_counter()))
            await asyncio.sleep(1 / rate)
        await asyncio.wait_for(reader, 30)
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await consumer.stop()
        await producer.stop()
    return percentiles(hops)


def run(rate: int = 600, seconds: int = 30, partitions: int = 8, window_s: float = 5.0,
        compare: bool = False) -> dict[str, Any]:
    """Start this machine's embedded broker, load it, and return the CPU share per window
    with the one-hop latency; with ``compare``, the other embedded broker's beside it."""
    from ..embedded import embedded_broker_kind

    if os.environ.get("CHUNKSERVE_KAFKA_BOOTSTRAP"):
        raise ValueError("bench broker measures the embedded broker; unset CHUNKSERVE_KAFKA_BOOTSTRAP")
    kind = embedded_broker_kind()
    result = _measure(kind, rate, seconds, partitions, window_s)
    if compare:
        other = "tansu" if kind == "kafka" else "kafka"
        measured = _measure(other, rate, seconds, partitions, window_s)
        result["compare"] = {measured["broker"]["kind"]: measured}
    return result


def _measure(kind: str, rate: int, seconds: int, partitions: int, window_s: float) -> dict[str, Any]:
    from ..embedded import start_embedded_broker

    with tempfile.TemporaryDirectory(prefix="chunkserve-broker-") as folder:
        broker = start_embedded_broker(Path(folder), kind=kind)
        idempotent = broker.kind != "tansu"
        try:
            assert broker.pid is not None
            floor = {str(w): asyncio.run(_hop_floor(broker.bootstrap, w, idempotent))
                     for w in HOP_FLOOR_WAITS_MS}
            windows = asyncio.run(_load(broker.bootstrap, broker.pid, rate, seconds, partitions,
                                        window_s, idempotent))
        finally:
            broker.stop()
    first, last = windows[0]["broker_cpu_pct"], windows[-1]["broker_cpu_pct"]
    return {"broker": broker.describe(), "rate_per_s": rate, "seconds": seconds,
            "partitions": partitions, "windows": windows,
            "first_window_cpu_pct": first, "last_window_cpu_pct": last,
            "growth": round(last / first, 2) if first else None, "hop_floor_ms": floor}
