"""The generation store on a real Redis Cluster (three masters, a replica each): the same
scripts on the namespace's slot master, namespaces spread over the masters, and fenced writes
that count only once a replica holds them, so a failover never loses an authority acted on."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from infra.redis_cluster import EmbeddedRedisCluster
from schemas.errors import InfraError, StaleGenerationError
from schemas.records import Generation
from streams.config import RedisSettings, Settings
from streams.generations import GenerationStore, Keys

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmbeddedRedisCluster]:
    with EmbeddedRedisCluster(tmp_path / "cluster", node_timeout_ms=3000) as c:
        yield c


def test_no_node_takes_the_port_of_another_nodes_cluster_bus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node listens on its port and on port + 10000 (the cluster bus): a node given 55301
    beside one on 45301 could not start (a CI run waited 30 s for it)."""
    import infra.redis_cluster as rc

    offered = iter([45301, 55301, 45301, 35301, 36000, 37000, 38000, 39000, 40000])
    monkeypatch.setattr(rc, "_free_port", lambda: next(offered))
    ports = EmbeddedRedisCluster(tmp_path / "c").ports  # 55301 is 45301's bus, 35301's bus is 45301
    assert ports == [45301, 36000, 37000, 38000, 39000, 40000]


def test_a_node_that_exits_at_start_is_named_at_once(tmp_path: Path) -> None:
    """Its port taken: the start fails with the node's own last log line, not a 30 s wait."""
    import socket

    cluster = EmbeddedRedisCluster(tmp_path / "c")
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", cluster.ports[0]))
        blocker.listen()
        started = time.monotonic()
        with pytest.raises(InfraError, match=f"Redis node {cluster.ports[0]} exited with code 1: .*Failed listening on port"):
            cluster.start()
        assert time.monotonic() - started < 20


def _store(cluster: EmbeddedRedisCluster, namespace: str, acks: int | None = None, timeout_ms: int = 300) -> GenerationStore:
    settings = Settings(namespace=namespace, redis=RedisSettings(url=cluster.url, cluster="on", replica_acks=acks,
                                                                 replica_ack_timeout_ms=timeout_ms))
    return GenerationStore.from_settings(settings)


async def _first_commit(cluster: EmbeddedRedisCluster, ns: str) -> Generation:
    store = _store(cluster, ns)
    await store.register_worker("w1", 4)
    gen = await store.commit("s", 0, "w1")
    await store.aclose()
    return gen


def _master_or_none(cluster: EmbeddedRedisCluster, key: str) -> int | None:
    try:
        return cluster.master_of(key)
    except InfraError:  # between the master's death and its replica's promotion
        return None


def _until(check: Any, timeout_s: float = 20.0) -> float:
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout_s, "timed out"
        time.sleep(0.1)
    return time.monotonic() - started


def test_the_store_runs_unchanged_on_a_cluster_and_namespaces_spread(cluster: EmbeddedRedisCluster) -> None:
    namespaces = [f"pool-{i}" for i in range(12)]
    masters = {ns: cluster.master_of(Keys(ns).workers) for ns in namespaces}
    assert len(set(masters.values())) >= 2, masters  # one slot per namespace, many masters

    async def run() -> None:
        for ns in namespaces[:4]:
            store = _store(cluster, ns)  # one replica acknowledges every fenced write
            await store.register_worker("w1", 2)
            gen = await store.commit("s", 0, "w1")
            await store.claim("s", gen)
            assert await store.release_chunks([("s", gen, 0)]) == [(True, "ok")]
            await store.put_snapshot("s", gen, b"state" * 10, chunk_index=0, input_seq=0)
            got = await store.read_snapshot("s")
            assert got is not None and got[1] == b"state" * 10
            with pytest.raises(StaleGenerationError):
                await store.commit("s", 0, "w1")
            assert (await store.acquire_lease("worker:w1", "h:1:a", 5000)).ours  # the namespace's slot too
            assert (await store.acquire_lease("worker:w1", "h:2:b", 5000)).holder == "h:1:a"
            assert await store.release_lease("worker:w1", "h:1:a")
            other = store.for_namespace(ns + "-b")
            await other.register_worker("w2", 1)
            assert (await other.load_view())["w2"].capacity == 1
            await other.aclose()
            await store.aclose()

    asyncio.run(run())


def test_a_committed_generation_survives_its_master_failing(cluster: EmbeddedRedisCluster) -> None:
    ns = "failover"
    gen = asyncio.run(_first_commit(cluster, ns))
    master = cluster.master_of(Keys(ns).workers)
    cluster.kill(master)
    killed = time.monotonic()

    async def after() -> tuple[Generation | None, float]:
        store = _store(cluster, ns)
        current = await store.current("s")  # waits for the promotion, following the new master
        back = time.monotonic() - killed
        with pytest.raises(StaleGenerationError):
            await store.commit("s", 0, "w1")  # the authority acted on is still fenced
        assert (await store.commit("s", gen.epoch, "w1")).epoch == gen.epoch + 1
        await store.aclose()
        return current, back

    current, back = asyncio.run(after())
    assert current == gen
    assert back < 20.0
    assert cluster.master_of(Keys(ns).workers) != master


def test_without_a_replica_a_fenced_write_is_not_counted_and_without_acks_it_can_be_lost(
        cluster: EmbeddedRedisCluster) -> None:
    """The replica is cut off from the master's stream (SIGSTOPped, its link killed): with
    acknowledgements the commit is refused as not done; without them it succeeds, the master
    dies, the stale replica is promoted, and the generation acted on is gone -- what the
    acknowledgement prevents."""
    ns = "lossy"
    master = cluster.master_of(Keys(ns).workers)
    (replica,) = cluster.replicas_of(master)
    first = asyncio.run(_first_commit(cluster, ns))
    cluster.pause(replica)
    cluster.cli(master, "client", "kill", "type", "replica")  # nothing more reaches it

    async def writes() -> Generation:
        acked = _store(cluster, ns, acks=1)
        with pytest.raises(InfraError, match="0 of 1 replicas"):
            await acked.commit("s", first.epoch, "w1")
        await acked.aclose()
        bare = _store(cluster, ns, acks=0)
        view = await bare.session("s")
        gen = await bare.commit("s", view.generation.epoch, "w1")
        await bare.aclose()
        return gen

    unacked = asyncio.run(writes())
    cluster.kill(master)
    cluster.resume(replica)
    _until(lambda: _master_or_none(cluster, Keys(ns).workers) == replica, 30.0)

    async def read() -> Generation | None:
        store = _store(cluster, ns, acks=0)
        got = await store.current("s")
        await store.aclose()
        return got

    survived = asyncio.run(read())
    assert survived is not None and survived.epoch < unacked.epoch, (survived, unacked)


def test_a_redis_cluster_setting_the_redis_does_not_have_is_one_line(cluster: EmbeddedRedisCluster, redis_url: str) -> None:
    """`redis.cluster = on` against a plain Redis was an 88-line traceback; off against a
    cluster node passed the check and failed later (MovedError). Both name the setting."""
    from schemas.errors import ConfigError
    from streams.preflight import check

    def refused(url: str, mode: str) -> str:
        with pytest.raises(ConfigError) as exc:
            asyncio.run(check(Settings(redis=RedisSettings(url=url, cluster=mode)), {}, kafka=False, timeout_s=10))
        return str(exc.value)

    said = refused(redis_url, "on")
    assert "redis.cluster: on, and the Redis at" in said and "not a cluster node" in said, said
    said = refused(cluster.url, "off")
    assert "redis.cluster: off, and the Redis at" in said and "a Redis Cluster node: set it on" in said, said
    asyncio.run(check(Settings(redis=RedisSettings(url=cluster.url, cluster="on")), {}, kafka=False, timeout_s=10))


def test_replica_acks_past_the_replicas_there_are_is_said(cluster: EmbeddedRedisCluster,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """`redis.replica_acks` 2 on masters of one replica each: a fenced write waits for the one
    there is, as before, and it is said once (it was lowered without a word)."""
    async def run() -> Generation:
        store = _store(cluster, "acks2", acks=2)
        try:
            await store.register_worker("w1", 4)
            gen = await store.commit("s", 0, "w1")
            await store.commit("t", 0, "w1")
            return gen
        finally:
            await store.aclose()

    with caplog.at_level("WARNING", logger="streams.store_backends"):
        assert asyncio.run(run()) == Generation("w1", 1)
    said = [r.getMessage() for r in caplog.records if "replica_acks" in r.getMessage()]
    assert said == ["redis.replica_acks is 2, and the namespace's master has 1 replica(s) now: a fenced write waits for 1"]


def test_with_its_seed_node_dead_a_process_starts_through_the_other_seeds(cluster: EmbeddedRedisCluster) -> None:
    """`redis.url` was the only node a starting process asked: with it dead, a healthy cluster
    refused every new worker and stalled a restarted dispatch (an outside run). `redis.seeds`
    names more: the start-up check and the store go through them."""
    from schemas.errors import ConfigError
    from streams.preflight import check

    seed = int(cluster.url.rsplit(":", 1)[1])
    ns = next(f"seeded{i}" for i in range(100) if cluster.master_of(Keys(f"seeded{i}").workers) != seed)
    others = ",".join(f"127.0.0.1:{p}" for p in cluster.ports if p != seed)
    url = cluster.url
    cluster.kill(seed)

    def settings(seeds: str) -> Settings:
        return Settings(namespace=ns, redis=RedisSettings(url=url, cluster="on", seeds=seeds))

    with pytest.raises(ConfigError, match="redis.url: no Redis answers"):
        asyncio.run(check(settings(""), {}, kafka=False, timeout_s=5))
    asyncio.run(check(settings(others), {}, kafka=False, timeout_s=10))

    async def commit() -> Generation:
        store = GenerationStore.from_settings(settings(others))
        try:
            await store.register_worker("w1", 4)
            return await store.commit("s", 0, "w1")
        finally:
            await store.aclose()

    assert asyncio.run(commit()) == Generation("w1", 1)
    with pytest.raises(ConfigError, match="redis.seeds"):
        RedisSettings(url=url, seeds=others)  # a cluster's nodes: refused with the cluster off
    with pytest.raises(ConfigError, match="give host:port entries"):
        RedisSettings(url=url, cluster="on", seeds="127.0.0.1")
