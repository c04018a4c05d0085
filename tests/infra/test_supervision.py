"""`chunkserve up` owns its process tree: SIGTERM stops all of it, SIGKILL leaves no orphan."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from schemas import records as r
from streams.config import Settings, child_env

pytestmark = pytest.mark.integration


async def _scale_out(settings: Settings) -> None:
    from streams.kafka import RecordProducer
    from streams.topics import ensure_topics

    producer = await RecordProducer(settings, await ensure_topics(settings), client_id="test").start()
    try:
        await producer.send(r.ScaleOut(pool="default", count=1, ts=time.time(), decision_id="by-hand"))
    finally:
        await producer.stop()


def _start_up(settings: Settings, tmp_path) -> tuple[subprocess.Popen[bytes], list[psutil.Process]]:
    """`up` with every processor, the provisioner and one provisioned worker running."""
    env = {**child_env(settings), "CHUNKSERVE_MIN_WORKERS": "0"}
    up = subprocess.Popen([sys.executable, "-m", "infra", "up", "--log-dir", str(tmp_path / "logs")],
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    asyncio.run(_scale_out(settings))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert up.poll() is None, "up exited early"
        tree = psutil.Process(up.pid).children(recursive=True)
        if any("--worker-id" in p.cmdline() for p in tree if p.is_running()):
            time.sleep(3.0)  # let the worker load its model and register
            return up, psutil.Process(up.pid).children(recursive=True)
        time.sleep(0.5)
    up.kill()
    raise AssertionError("the provisioner started no worker within 120 s")


def _gone_within(procs: list[psutil.Process], timeout_s: float) -> tuple[float, list[psutil.Process]]:
    started = time.monotonic()
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    return time.monotonic() - started, alive


@pytest.fixture
def settings(kafka_bootstrap, redis_url, namespace) -> Settings:
    return Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(kafka_bootstrap, redis_url)


def test_sigterm_to_up_stops_the_whole_tree_within_10_s(settings, tmp_path):
    up, tree = _start_up(settings, tmp_path)
    names = {" ".join(p.cmdline()[3:5]) for p in tree}
    assert {"processor dispatch", "processor control", "processor detector", "processor metrics",
            "provisioner"} <= {n.split(" --")[0] for n in names}
    up.send_signal(signal.SIGTERM)
    elapsed, alive = _gone_within([psutil.Process(up.pid), *tree], 10.0)
    for p in alive:
        p.kill()
    assert alive == [], f"still running {elapsed:.1f} s after SIGTERM: {[p.cmdline() for p in alive]}"
    assert up.wait(timeout=1) == 0
    print(f"SIGTERM to up: {len(tree)} children gone in {elapsed:.1f} s")


def test_children_of_a_killed_up_stop_by_themselves(settings, tmp_path):
    up, tree = _start_up(settings, tmp_path)
    os.kill(up.pid, signal.SIGKILL)
    up.wait(timeout=5)
    elapsed, alive = _gone_within(tree, 15.0)
    for p in alive:
        p.kill()
    assert alive == [], f"orphans {elapsed:.1f} s after SIGKILL of up: {[p.cmdline() for p in alive]}"
    print(f"SIGKILL of up: {len(tree)} children gone in {elapsed:.1f} s")
