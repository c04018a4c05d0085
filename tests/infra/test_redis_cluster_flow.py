"""The live path on a Redis Cluster: dispatch and torch workers as processes, their generation
store on the namespace's slot master with replica-acknowledged fenced writes."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

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
