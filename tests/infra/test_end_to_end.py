"""One session flow end to end: real broker, real Redis, dispatch and torch workers as processes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.flow import run_flow
from streams.config import Settings
from streams.generations import SyncGenerationStore

pytestmark = pytest.mark.integration


def test_sessions_flow_end_to_end(kafka_bootstrap, redis_url, namespace, tmp_path):
    settings = Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(
        kafka_bootstrap, redis_url)
    summary = asyncio.run(run_flow(settings, tmp_path / "logs", sessions=3, chunks=5, workers=2,
                                   inputs=2, chunk_interval_s=0.02, timeout_s=90,
                                   garbage=2))
    assert summary.problems == []
    assert summary.sessions == 3 and summary.workers == 2
    for sid, indices in summary.chunk_indices.items():
        assert len(indices) >= 5
        assert indices == list(range(len(indices)))          # 0..n-1, in order
        assert len(summary.generations[sid]) == 1            # one generation
        assert summary.generations[sid][0].endswith("@1")    # the first commit's epoch
        assert summary.released[sid] == "closed"             # released on close
        assert summary.inputs_accepted[sid] == [1, 2]        # inputs once, in order
    assert summary.metrics_records >= 1                      # placement reports (throttled)
    assert summary.rejected == 0
    assert summary.dead_letters == 2  # the garbage on session-events and session-inputs
    assert {d.consumer for d in summary.letters} == {"dispatch"}
    assert all(d.reason.startswith("schema:") for d in summary.letters)

    store = SyncGenerationStore.from_url(redis_url, namespace)
    try:  # closed in Redis too: no current generation, every slot given back
        for sid in summary.chunk_indices:
            assert store.current(sid) is None
        assert all(load.used == 0 for load in store.load_view().values())
    finally:
        store.client.close()


def test_sessions_survive_offload_restore_and_migration(kafka_bootstrap, redis_url, namespace,
                                                         tmp_path):
    settings = Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(
        kafka_bootstrap, redis_url)
    summary = asyncio.run(run_flow(settings, tmp_path / "logs", sessions=3, chunks=4, workers=2,
                                   inputs=2, chunk_interval_s=0.02, timeout_s=90,
                                   flips=True, handoff=True))
    assert summary.problems == []
    for sid, indices in summary.chunk_indices.items():
        # one chunk sequence across generations: no chunk lost or repeated by a move
        assert indices == list(range(len(indices))) and len(indices) >= 8
        epochs = sorted(int(g.split("@")[1]) for g in summary.generations[sid])
        assert epochs[:2] == [1, 2]                          # idle/active gave a new generation
        assert summary.released[sid] == "closed"
    assert len(summary.generations["session-0"]) == 3       # ...and the migration a third
    workers_of_0 = {g.split("@")[0] for g in summary.generations["session-0"]}
    assert len(workers_of_0) == 2


def test_a_model_of_your_own_serves_through_offload_restore_and_migration(kafka_bootstrap, redis_url, namespace,
                                                                          tmp_path):
    """Workers started with `CHUNKSERVE_WORKER_MODEL=examples.models.walk:LatentWalk` serve
    sessions with that model: every chunk's checksum is the one the model makes for that
    session alone, across an offload to Redis and back and a move to the other worker."""
    from examples.models.walk import LatentWalk
    from workers.commands import session_seed

    settings = Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(
        kafka_bootstrap, redis_url)
    root = str(Path(__file__).resolve().parents[2])
    own = {"CHUNKSERVE_WORKER_MODEL": "examples.models.walk:LatentWalk", "PYTHONPATH": root}
    summary = asyncio.run(run_flow(settings, tmp_path / "logs", sessions=2, chunks=4, workers=2,
                                   inputs=0, chunk_interval_s=0.02, timeout_s=90,
                                   flips=True, handoff=True, role_env={"worker": own}))
    assert summary.problems == [] and len(summary.generations["session-0"]) == 3  # offloaded, restored, moved
    model = LatentWalk()
    for sid, sums in summary.checksums.items():
        state = model.init_state(sid, f"a paper boat on a river, take {sid}", session_seed(sid))
        assert len(sums) >= 8 and sums == [model.run_batch([state])[0].checksum for _ in sums]
    for log in ("worker-0.log", "worker-1.log"):  # and each says so
        assert "serves the model examples.models.walk:LatentWalk" in (tmp_path / "logs" / log).read_text()


def test_crashed_worker_sessions_recover_from_snapshot_and_replayed_inputs(
        kafka_bootstrap, redis_url, namespace, tmp_path):
    settings = Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(
        kafka_bootstrap, redis_url)
    summary = asyncio.run(run_flow(settings, tmp_path / "logs", sessions=2, chunks=20, workers=2,
                                   inputs=2, chunk_interval_s=0.02, timeout_s=90, crash=True))
    assert summary.problems == []
    for sid, indices in summary.chunk_indices.items():
        assert indices == sorted(set(indices))  # recomputed chunks are not released twice
        # at most the one batch in flight when the worker died: released in Redis, unpublished
        assert len(summary.missing[sid]) <= 1 and len(indices) >= 40
        assert summary.inputs_accepted[sid] == [1, 2, 3, 4]  # none lost across the crash
        assert summary.released[sid] == "closed"
    assert len(summary.generations["session-0"]) == 2  # the recovery's new generation


def test_rebalancer_migrates_live_sessions_onto_new_workers(kafka_bootstrap, redis_url,
                                                            namespace, tmp_path):
    settings = Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(
        kafka_bootstrap, redis_url)
    summary = asyncio.run(run_flow(settings, tmp_path / "logs", sessions=4, chunks=5, workers=2,
                                   inputs=1, chunk_interval_s=0.05, timeout_s=120, rebalance=True))
    assert summary.problems == []
    moved = [sid for sid, gens in summary.generations.items()
             if len({g.split("@")[0] for g in gens}) > 1]
    assert moved  # the control processor's Handoff moved live sessions at chunk boundaries
    for sid, indices in summary.chunk_indices.items():
        assert indices == list(range(len(indices)))  # no chunk lost or repeated by the move
        assert summary.released[sid] == "closed"


def test_smoke_command_prints_and_writes_summary(tmp_path):
    out = tmp_path / "smoke.json"
    env = dict(os.environ)
    env.pop("CHUNKSERVE_KAFKA_BOOTSTRAP", None)  # the command starts its own embedded broker
    proc = subprocess.run(
        [sys.executable, "-m", "infra", "smoke", "--sessions", "2", "--chunks", "3",
         "--workers", "1", "--json", str(out), "--log-dir", str(tmp_path / "logs")],
        env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "audit: every chunk in order" in proc.stdout
    summary = json.loads(out.read_text())
    assert summary["sessions"] == 2 and summary["problems"] == []
    assert summary["chunks"] >= 6


def test_scale_in_moves_sessions_off_the_drained_worker(kafka_bootstrap, redis_url, namespace,
                                                        tmp_path):
    """Two workers each hold a session; the load is one worker's worth, so the control
    processor (turboserve) drains the less loaded one, its placement moves that worker's
    sessions off at chunk boundaries, and once it is empty the worker is shut down."""
    settings = Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(
        kafka_bootstrap, redis_url)
    summary = asyncio.run(run_flow(settings, tmp_path / "logs", sessions=3, chunks=4, workers=2,
                                   inputs=1, chunk_interval_s=0.05, timeout_s=120, scale_in=True))
    assert summary.problems == []
    drains = [s.split()[1] for s in summary.scaling if s.startswith("drain")]
    shutdowns = [s.split()[1] for s in summary.scaling if s.startswith("shutdown")]
    assert len(set(drains)) == 1 and shutdowns and set(shutdowns) == set(drains)
    assert summary.scaling.index(f"shutdown {drains[0]}") > summary.scaling.index(f"drain {drains[0]}")
    drained = drains[0]
    moved = [sid for sid, gens in summary.generations.items()
             if any(g.startswith(drained + "@") for g in gens)]
    assert moved  # the drained worker held sessions...
    for sid in moved:  # ...and each went on, on the worker kept (the shutdown came once none was left)
        assert {g.split("@")[0] for g in summary.generations[sid]} - {drained}
    for sid, indices in summary.chunk_indices.items():
        assert indices == list(range(len(indices)))  # no chunk lost or repeated by the moves
        assert summary.released[sid] == "closed"
