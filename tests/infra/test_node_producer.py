"""The Node.js producer of ``examples/node-producer`` against a running fleet (issue 16, item 1).

The example is written from ``docs/asyncapi.json`` alone (kafkajs and @msgpack/msgpack from
the npm registry, pinned by its lockfile): it opens sessions, pushes inputs, sends idle and
active, closes, and exits 0 only when it read every input accepted on ``worker-events`` and
every session released as closed. Here it runs against dispatch and one worker on the
embedded broker; chunkserve's own reader and Redis then confirm what it claims.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from infra.flow import EventLog
from infra.local import LocalFleet
from schemas.records import Claimed, DeadLetter, InputAccepted, Released, WorkerUp
from schemas.topics import DEAD_LETTERS, SESSION_EVENTS, SESSION_INPUTS, WORKER_EVENTS
from streams.config import Settings
from streams.generations import SyncGenerationStore
from streams.kafka import RecordProducer
from streams.topics import ensure_topics, partition_for_key

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "node-producer"
SESSIONS, INPUTS = 3, 4


def _node_example(into: Path) -> Path:
    """The example with its dependencies installed from the lockfile (npm's cache makes a
    second install local), in a folder of its own so runs never share a node_modules."""
    for tool in ("node", "npm"):
        assert shutil.which(tool), f"{tool} is missing: make tools (Debian's nodejs and npm)"
    for name in ("package.json", "package-lock.json", "producer.js"):
        shutil.copy(EXAMPLE / name, into / name)
    proc = subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--prefer-offline"], cwd=into,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return into / "producer.js"


def test_node_producer_written_from_the_contract(kafka_bootstrap, redis_url, namespace, tmp_path):
    if os.environ.get("CHUNKSERVE_KAFKA_IDEMPOTENCE") == "off":
        pytest.skip("the broker is Tansu: no idempotent producers")
    script = _node_example(tmp_path)
    prefix = f"{namespace}."
    settings = Settings(topic_prefix=prefix, namespace=namespace).with_endpoints(kafka_bootstrap, redis_url)
    fleet = LocalFleet(settings, tmp_path / "logs")
    store = SyncGenerationStore.from_url(redis_url, namespace)

    async def run() -> tuple[subprocess.CompletedProcess[str], list[Any]]:
        await ensure_topics(settings)
        fleet.start_processor("dispatch")
        fleet.start_worker("worker-0", capacity=SESSIONS + 1, chunk_interval_s=0.05)
        async with RecordProducer(settings, client_id="audit") as audit_producer:
            log = EventLog(settings, audit_producer, (WORKER_EVENTS, DEAD_LETTERS))
            await log.start()
            try:
                await log.until(lambda rs: any(isinstance(r, WorkerUp) for r in rs), 60, "the worker")
                node = await asyncio.to_thread(
                    subprocess.run,
                    ["node", str(script), "--bootstrap", kafka_bootstrap, "--prefix", prefix,
                     "--sessions", str(SESSIONS), "--inputs", str(INPUTS), "--timeout-s", "90",
                     "--contract", str(ROOT / "docs" / "asyncapi.json")],
                    capture_output=True, text=True, timeout=150)
                if node.returncode == 0:  # read until chunkserve's reader has seen the closes too
                    ids = json.loads(node.stdout.strip().splitlines()[-1])["sessions"]
                    await log.until(lambda rs: {r.session_id for r in rs if isinstance(r, Released)
                                                and r.reason == "closed"} >= set(ids), 30, "the closes")
            finally:
                await log.stop()
        return node, log.records

    try:
        node, records = asyncio.run(run())
    finally:
        fleet.stop_all()
    assert node.returncode == 0, f"stdout: {node.stdout[-2000:]}\nstderr: {node.stderr[-4000:]}"
    summary = json.loads(node.stdout.strip().splitlines()[-1])
    sessions = summary["sessions"]
    assert len(sessions) == SESSIONS and summary["pushed"] == summary["accepted"] == SESSIONS * INPUTS
    assert summary["closed"] == SESSIONS and summary["refused"] == []

    # what chunkserve itself read: each input applied once, in order, and each session
    # suspended and brought back (idle, active) before its close
    for sid in sessions:
        assert [r.seq for r in records if isinstance(r, InputAccepted) and r.session_id == sid] \
            == list(range(1, INPUTS + 1)), sid
        reasons = [r.reason for r in records if isinstance(r, Released) and r.session_id == sid]
        assert reasons[-1] == "closed" and "suspended" in reasons, (sid, reasons)
        assert len({r.generation for r in records if isinstance(r, Claimed) and r.session_id == sid}) >= 2
        assert store.session(sid).state == "closed"  # and kept only for the retention
        assert 0 < store.client.pttl(store.keys.session(sid)) <= settings.store_retention_s * 1000
    assert not [r for r in records if isinstance(r, DeadLetter)]  # every record decoded and taken
    store.client.close()

    # the keyed records landed where chunkserve's readers (a recovery's replay) look for them
    count = {prefix + t: settings.partitions[t] for t in (SESSION_EVENTS, SESSION_INPUTS)}
    placed = [(topic, part, partition_for_key(key.encode(), count[topic]))
              for topic, part, key in summary["delivered"]]
    assert len(placed) == SESSIONS * (INPUTS + 4)  # open, idle, active, close and the inputs
    assert all(part == expected for _t, part, expected in placed), placed
