"""The watch view's fold (pure), the watch shell on a real broker, and the Prometheus objects."""

from __future__ import annotations

import asyncio
import urllib.request

from prometheus_client import CollectorRegistry

from streams.prom import metrics, observe_heartbeat, start_metrics_server
from infra.watch import WatchState, fold, summary, table
from schemas.records import (ChunkDone, Claimed, CostTick, Generation, Heartbeat, Released,
                             WorkerDown, WorkerUp)

G = Generation("w1", 1)


def run_fold(records):
    state = WatchState()
    for r in records:
        state = fold(state, r)
    return state


def test_fold_tracks_workers_sessions_latency_migrations_and_cost():
    state = run_fold([
        WorkerUp(worker_id="w1", ts=1.0, capacity=8),
        Claimed(worker_id="w1", session_id="a", generation=G, ts=2.0),
        Claimed(worker_id="w1", session_id="b", generation=G, ts=2.0),
        Heartbeat(worker_id="w1", ts=2.0, sessions=2, executing=2, capacity=8, chunk_latency_s=0.02,
                  device_mem_bytes=3 << 20, device_util=0.5),
        Heartbeat(worker_id="w2", ts=2.0, sessions=1, executing=1, capacity=8),
        ChunkDone(worker_id="w1", session_id="a", generation=G, chunk_index=0, ts=3.0, latency_s=0.04),
        ChunkDone(worker_id="w1", session_id="b", generation=G, chunk_index=0, ts=3.0, latency_s=0.01),
        Released(worker_id="w1", session_id="a", generation=G, ts=4.0, reason="migrated",
                 successor=Generation("w2", 2)),
        Claimed(worker_id="w2", session_id="a", generation=Generation("w2", 2), ts=4.1),
        CostTick(ts=5.0, gpus=2, gpu_seconds=10.0, cost=0.5),
        CostTick(ts=5.0, gpus=1, gpu_seconds=3.0, cost=0.1, pool="other"),  # per pool: ignored
    ])
    out = summary(state)
    assert out["sessions"] == 3  # the heartbeats' counts: a migrating session is counted by the next ones
    assert out["chunks"] == 2 and out["worst_chunk_latency_ms"] == 40.0
    assert out["migrations"] == 1 and out["cost"] == 0.5 and out["gpus"] == 2
    w1 = out["workers"]["w1"]
    assert w1["sessions"] == 2 and w1["capacity"] == 8 and w1["device_util"] == 0.5
    assert w1["device_mem_bytes"] == 3 << 20 and w1["chunk_latency_ms"] == 20.0


def test_fold_is_pure_and_counts_the_sessions_held_before_the_view_started():
    """A view started from the end sees no Claimed for the sessions held already: the
    fleet's count comes from the heartbeats, so it matches the worker rows (it read 0 beside a
    worker holding 4 before)."""
    before = run_fold([Heartbeat(worker_id="w2", ts=1.0, sessions=4, executing=4, capacity=4)])
    after = fold(before, Released(worker_id="w1", session_id="a", generation=G, ts=2.0, reason="fenced"))
    assert summary(before)["sessions"] == 4 and before.records == 1
    assert summary(after)["sessions"] == 4 and after.records == 2 and after.migrations == 0
    down = fold(after, WorkerDown(worker_id="w2", ts=3.0))
    assert summary(down)["sessions"] == 0 and not down.workers["w2"].up and summary(after)["sessions"] == 4


def test_table_renders():
    from rich.console import Console

    state = run_fold([WorkerUp(worker_id="w1", ts=1.0, capacity=4)])
    console = Console(record=True, width=120)
    console.print(table(state, now=3.0))
    assert "w1" in console.export_text()


def test_watch_reads_the_real_topics(kafka_bootstrap, redis_url, namespace):
    from infra.watch import watch
    from streams.config import Settings
    from streams.kafka import RecordProducer
    from streams.topics import ensure_topics

    settings = Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(
        kafka_bootstrap, redis_url)

    async def main():
        await ensure_topics(settings)
        async with RecordProducer(settings) as producer:
            await producer.send(Heartbeat(worker_id="w9", ts=1.0, sessions=3, executing=3, capacity=4))
            await producer.send(CostTick(ts=1.0, gpus=1, gpu_seconds=2.0, cost=0.25))
        return await watch(settings, duration_s=2.0, render=False, from_offset=0)

    out = asyncio.run(main())
    assert out["workers"]["w9"]["sessions"] == 3 and out["cost"] == 0.25


def test_prometheus_metrics_and_server():
    registry = CollectorRegistry()
    assert start_metrics_server(None, registry) is None and start_metrics_server(0, registry) is None
    m = metrics(registry)
    assert metrics(registry) is m
    m.consumed.labels("session-events").inc(3)
    observe_heartbeat(Heartbeat(worker_id="w1", ts=1.0, sessions=2, executing=2, capacity=4), m)
    server = start_metrics_server(_free_port(), registry)
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics").read().decode()
    finally:
        server.shutdown()
    assert 'chunkserve_records_consumed_total{topic="session-events"} 3.0' in body
    assert 'chunkserve_worker_sessions{worker="w1"} 2.0' in body


def _free_port() -> int:
    from infra.embedded import free_port

    return free_port()
