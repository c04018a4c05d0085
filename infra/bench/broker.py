"""The embedded broker's own cost: CPU while one consumer keeps up with a steady producer.

Why it exists: on the embedded Tansu (memory storage) a fetch costs time that grows with
how many records the partition already holds, so a long run on one machine slows down as
its topics fill up, whatever chunkserve does. This measures it on its own: a producer sends
``rate`` records per second into ``partitions`` partitions for ``seconds``; a consumer
(assigned, no group) reads them as they come; every ``window_s`` the broker process's CPU
share is sampled. Against an external broker (``CHUNKSERVE_KAFKA_BOOTSTRAP``)
there is no process to sample and the benchmark refuses.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["run"]


def _cpu_s(pid: int) -> float:
    import psutil

    return sum(psutil.Process(pid).cpu_times()[:2])  # user + system


async def _load(bootstrap: str, pid: int, rate: int, seconds: int, partitions: int,
                window_s: float) -> list[dict[str, float]]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic("bench-broker", partitions, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=1, acks="all",
                                enable_idempotence=False)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, fetch_max_wait_ms=10, group_id=None)
    await producer.start()
    await consumer.start()
    consumer.assign([TopicPartition("bench-broker", p) for p in range(partitions)])
    consumed = 0

    async def read() -> None:
        nonlocal consumed
        while True:
            batch = await consumer.getmany(timeout_ms=100)
            consumed += sum(len(v) for v in batch.values())

    reader = asyncio.create_task(read())
    windows: list[dict[str, float]] = []
    try:
        t0, sent = time.perf_counter(), 0
        mark_t, mark_cpu = t0, _cpu_s(pid)
        while sent < rate * seconds:
            await producer.send("bench-broker", b"x" * 100, key=str(sent).encode())
            sent += 1
            await asyncio.sleep(max(0.0, t0 + sent / rate - time.perf_counter()))
            now = time.perf_counter()
            if now - mark_t >= window_s:
                cpu = _cpu_s(pid)
                windows.append({"t_s": round(now - t0, 1), "records": sent,
                                "broker_cpu_pct": round(100 * (cpu - mark_cpu) / (now - mark_t), 1)})
                mark_t, mark_cpu = now, cpu
        await producer.flush()
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await consumer.stop()
        await producer.stop()
    return windows


def run(rate: int = 600, seconds: int = 30, partitions: int = 8, window_s: float = 5.0) -> dict[str, Any]:
    """Start an embedded broker, load it, and return the CPU share per window."""
    from ..embedded import EmbeddedBroker

    if os.environ.get("CHUNKSERVE_KAFKA_BOOTSTRAP"):
        raise ValueError("bench broker measures the embedded broker; unset CHUNKSERVE_KAFKA_BOOTSTRAP")
    with tempfile.TemporaryDirectory(prefix="chunkserve-broker-") as logs:
        broker = EmbeddedBroker(log_path=Path(logs) / "tansu.log").start()
        try:
            assert broker.pid is not None
            windows = asyncio.run(_load(broker.bootstrap, broker.pid, rate, seconds, partitions, window_s))
        finally:
            broker.stop()
    first, last = windows[0]["broker_cpu_pct"], windows[-1]["broker_cpu_pct"]
    return {"rate_per_s": rate, "seconds": seconds, "partitions": partitions, "windows": windows,
            "first_window_cpu_pct": first, "last_window_cpu_pct": last,
            "growth": round(last / first, 2) if first else None}
