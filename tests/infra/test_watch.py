"""The watch view's fold (pure), the watch shell on a real broker, and the Prometheus objects."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

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


def test_the_cost_line_says_how_old_it_is():
    """The GPU count and cost are the last CostTick's: a view of a stopped fleet showed its last
    count as current."""
    from infra.watch import cost_age

    fresh = run_fold([CostTick(ts=100.0, gpus=3, gpu_seconds=30.0, cost=1.0)])
    assert cost_age(fresh, now=105.0) == "" and summary(fresh)["gpus_ts"] == 100.0
    assert cost_age(fresh, now=160.0) == " (60 s ago)"
    assert cost_age(run_fold([]), now=5.0) == " (no cost tick seen)" and summary(run_fold([]))["gpus_ts"] is None


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
    assert out["unread"] == 0  # it read to the log's end

    async def cut_short():  # stopped before its first read: what it left unread is said
        return await watch(settings, duration_s=0.0, render=False, from_offset=0)

    assert asyncio.run(cut_short())["unread"] == 2


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


def _watch_until_signalled(tmp_path, settings, json_out, signum, before_signal=lambda: None):
    """``chunkserve watch --no-render --json OUT`` (no --duration) run as an operator runs it,
    stopped by ``signum`` once it says it follows the topics; returns (rc, stdout, stderr)."""
    from streams.config_file import child_env
    from streams.topics import ensure_topics

    asyncio.run(ensure_topics(settings))
    env = child_env(settings, base={k: v for k, v in os.environ.items() if not k.startswith("CHUNKSERVE_")})
    err = tmp_path / "watch.err"
    with open(err, "w") as err_file:
        proc = subprocess.Popen([sys.executable, "-m", "infra", "watch", "--no-render", "--json", str(json_out)],
                                env=env, stdout=subprocess.PIPE, stderr=err_file, text=True)
        try:
            deadline = time.monotonic() + 90
            while "Ctrl-C or SIGTERM stops it" not in err.read_text() and proc.poll() is None:
                assert time.monotonic() < deadline, err.read_text()
                time.sleep(0.2)
            time.sleep(2.0)
            before_signal()
            proc.send_signal(signum)
            out, _ = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    return proc.returncode, out, err.read_text()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_watch_stopped_by_a_signal_still_writes_its_summary(kafka_bootstrap, redis_url, namespace, tmp_path,
                                                           signum):
    """Without --duration, Ctrl-C (SIGINT) or SIGTERM ended watch without its summary."""
    from streams.config import Settings

    settings = Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(kafka_bootstrap, redis_url)
    json_out = tmp_path / "summary.json"
    rc, out, err = _watch_until_signalled(tmp_path, settings, json_out, signum)
    assert rc == 0 and "Traceback" not in out + err, out + err
    summary = json.loads(json_out.read_text())
    assert {"workers", "sessions", "chunks", "records"} <= set(summary)


def test_watch_whose_json_fails_at_the_end_prints_the_summary(kafka_bootstrap, redis_url, namespace, tmp_path):
    """The file checked at the start can still fail at the end: the summary goes to stdout,
    the failure is one line, exit code 2."""
    from streams.config import Settings

    settings = Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(kafka_bootstrap, redis_url)
    folder = tmp_path / "out"
    json_out = folder / "summary.json"

    def break_the_folder():  # it becomes a file while watch runs
        folder.rmdir()
        folder.write_text("")

    rc, out, err = _watch_until_signalled(tmp_path, settings, json_out, signal.SIGINT, break_the_folder)
    assert rc == 2 and "Traceback" not in out + err, out + err
    assert '"records":' in out and f"{json_out}: --json: cannot write" in err  # the result, then the error
