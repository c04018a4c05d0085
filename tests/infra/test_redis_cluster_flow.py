"""The live path on a Redis Cluster: dispatch and torch workers as processes, their generation
store on the namespace's slot master with replica-acknowledged fenced writes; and the chaos
run killing that master."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from infra.chaos import AUDIT_KEYS, ChaosConfig, redis_kill_times, run_chaos, unclean, unserved_across
from infra.flow import run_flow
from infra.redis_cluster import EmbeddedRedisCluster
from streams.config import Settings
from streams.generations import GenerationStore, Keys

pytestmark = pytest.mark.integration


def test_sessions_flow_on_a_redis_cluster(kafka_bootstrap, namespace, tmp_path):
    with EmbeddedRedisCluster(tmp_path / "cluster") as cluster:
        # seeded with a node that does not serve the namespace: a plain client would be MOVED
        seed = next(p for p in cluster.live_ports() if p != cluster.master_of(Keys(namespace).workers))
        base = Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(
            kafka_bootstrap, f"redis://127.0.0.1:{seed}")
        settings = replace(base, redis=replace(base.redis, cluster="on"))
        assert settings.redis.acks == 1
        summary = asyncio.run(run_flow(settings, tmp_path / "logs", sessions=3, chunks=4, workers=2,
                                       inputs=2, chunk_interval_s=0.02, timeout_s=90))
        assert summary.problems == []
        assert summary.chunk_indices and summary.unserved(4, [1, 2]) == []

        async def check() -> None:
            store = GenerationStore.from_settings(settings)
            try:
                for sid in summary.chunk_indices:
                    assert await store.current(sid) is None
                assert all(load.used == 0 for load in (await store.load_view()).values())
            finally:
                await store.aclose()

        asyncio.run(check())


def test_redis_kills_are_spread_and_one_meets_the_recovery():
    assert redis_kill_times(ChaosConfig(redis_faults=1, process_faults=False)) == [0.3]
    spread = redis_kill_times(ChaosConfig(redis_faults=10, process_faults=False, duration_s=100.0))
    assert spread[0] == pytest.approx(0.1) and spread[-1] == pytest.approx(0.85) and len(spread) == 10
    # the worker killed at 45% of the run is declared dead and recovered while the slot is down
    with_worker_kill = redis_kill_times(ChaosConfig(redis_faults=10, duration_s=100.0))
    assert 0.455 in with_worker_kill and len(with_worker_kill) == 10


def test_unserved_across_a_kill_runs_to_the_next_chunk_or_the_end():
    assert unserved_across({"a": [1.0, 2.0, 6.0], "b": [2.5, 3.5]}, 3.0, 10.0) == 4.0  # a: 2 -> 6
    assert unserved_across({"b": [1.5]}, 3.0, 10.0) == 8.5  # never served again: until the end
    assert unserved_across({"c": []}, 3.0, 10.0) == 7.0


def test_chaos_fails_the_namespace_master_over_twice(kafka_bootstrap, namespace, tmp_path):
    with EmbeddedRedisCluster(tmp_path / "cluster") as cluster:
        base = Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(kafka_bootstrap, cluster.url)
        settings = replace(base, redis=replace(base.redis, cluster="on"))
        cfg = ChaosConfig(sessions=4, duration_s=20.0, workers=3, capacity=4, process_faults=False, redis_faults=2)
        result = asyncio.run(run_chaos(settings, cfg, tmp_path / "logs", redis_cluster=cluster))
    redis = result["redis"]
    assert {k: redis[k] for k in ("masters", "replicas", "failovers", "replica_ack")} == {
        "masters": 3, "replicas": 3, "failovers": 2, "replica_ack": True}
    first, second = redis["events"]
    # the second kill found the promoted replica serving the slot, and the first victim back as its replica
    assert second["killed"] == first["promoted"] and second["promoted"] == first["killed"]
    assert result["chunks"] > 0 and result["inputs_pushed"] > 0
    assert not [k for k in AUDIT_KEYS if result[k]], unclean(result)
