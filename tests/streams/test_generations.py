"""The generation store's scripts against a real Redis (DESIGN.md §3)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.crc

from schemas.errors import (
    NoCapacityError,
    NotOwnerError,
    SnapshotCorruptError,
    StaleGenerationError,
    UnknownSessionError,
)
from schemas.records import Generation
from streams.generations import SCRIPTS, GenerationStore, SyncGenerationStore, WorkerLoad
from streams.generations import _AsyncBackend

pytestmark = pytest.mark.integration


def drop_namespace(client: Any, namespace: str) -> None:
    """Delete this test's keys (never FLUSHDB: the Redis may be shared)."""
    keys = list(client.scan_iter(match=f"{{{namespace}}}:*", count=500))
    if keys:
        client.delete(*keys)


@pytest.fixture(autouse=True)
def _own_keys_only(redis_client: Any, namespace: str) -> Any:
    yield
    drop_namespace(redis_client, namespace)


def arun(redis_url: str, namespace: str, body: Any, **kwargs: Any) -> Any:
    """Run ``body(store)`` on a fresh async store and close it."""

    async def main() -> Any:
        store = GenerationStore.from_url(redis_url, namespace, **kwargs)
        try:
            return await body(store)
        finally:
            await store.aclose()

    return asyncio.run(main())


def test_commit_admits_by_epoch_and_capacity(redis_url: str, namespace: str) -> None:
    async def body(s: GenerationStore) -> None:
        await s.register_worker("w1", 1)
        await s.register_worker("w2", 2)
        g = await s.commit("a", 0, "w1")
        assert g == Generation("w1", 1) and await s.current("a") == g
        with pytest.raises(NoCapacityError, match="no free slot"):
            await s.commit("b", 0, "w1")
        with pytest.raises(StaleGenerationError) as stale:
            await s.commit("a", 0, "w2")
        assert (stale.value.epoch, stale.value.current) == (0, 1)
        with pytest.raises(UnknownSessionError):
            await s.commit("nope", 3, "w2")
        with pytest.raises(NoCapacityError, match="not registered"):
            await s.commit("b", 0, "ghost")
        await s.set_draining("w2", True)
        with pytest.raises(NoCapacityError, match="draining"):
            await s.commit("b", 0, "w2")
        await s.set_draining("w2", False)
        # recovery in place keeps the one slot; moving away frees it in the same step
        assert await s.commit("a", 1, "w1") == Generation("w1", 2)
        assert (await s.load_view())["w1"] == WorkerLoad(1, 1, False)
        assert await s.commit("a", 2, "w2") == Generation("w2", 3)
        assert await s.load_view() == {"w1": WorkerLoad(0, 1, False), "w2": WorkerLoad(1, 2, False)}
        assert await s.sessions_of("w2") == ["a"] and await s.sessions_of("w1") == []

    arun(redis_url, namespace, body)


def test_commit_with_wrong_owner_hint_retries(redis_url: str, namespace: str) -> None:
    async def body(s: GenerationStore) -> None:
        other = GenerationStore.from_url(redis_url, namespace)
        try:
            for w in ("w1", "w2", "w3"):
                await s.register_worker(w, 2)
            await s.commit("a", 0, "w1")
            await other.commit("a", 1, "w2")  # s still believes w1 owns it
            assert await s.commit("a", 2, "w3") == Generation("w3", 3)
            assert {w: v.used for w, v in (await s.load_view()).items()} == {"w1": 0, "w2": 0, "w3": 1}
        finally:
            await other.aclose()

    arun(redis_url, namespace, body)


def test_migration_is_guarded_by_the_source_generation(redis_url: str, namespace: str) -> None:
    async def body(s: GenerationStore) -> None:
        await s.register_worker("w1", 1)
        await s.register_worker("w2", 1)
        g1 = await s.commit("a", 0, "w1")
        with pytest.raises(NotOwnerError):
            await s.commit_migration("a", Generation("w2", 1), "w2")
        g2 = await s.commit_migration("a", g1, "w2")
        assert g2 == Generation("w2", 2)
        with pytest.raises(StaleGenerationError):
            await s.commit_migration("a", g1, "w1")
        with pytest.raises(UnknownSessionError):
            await s.commit_migration("zz", g1, "w1")

    arun(redis_url, namespace, body)


def test_claim_release_chunks_release(redis_url: str, namespace: str) -> None:
    async def body(s: GenerationStore) -> None:
        await s.register_worker("w1", 2)
        await s.register_worker("w2", 2)
        g1 = await s.commit("a", 0, "w1")
        b1 = await s.commit("b", 0, "w1")
        await s.claim("a", g1)
        assert (await s.session("a")).claimed
        g2 = await s.commit("a", 1, "w2")
        with pytest.raises(StaleGenerationError):
            await s.claim("a", g1)
        with pytest.raises(NotOwnerError):
            await s.claim("a", Generation("w1", 2))
        calls = []
        real = s._backend.call

        async def counting(name: str, keys: list[str], args: list[Any]) -> Any:
            calls.append(name)
            return await real(name, keys, args)

        s._backend.call = counting  # type: ignore[method-assign]
        verdicts = await s.release_chunks([("a", g1, 0), ("a", g2, 0), ("b", b1, 0), ("zz", g1, 0),
                                           ("a", Generation("w1", 2), 0)])
        assert calls == ["release_chunks"]  # one round trip for the batch
        assert verdicts == [(False, "stale_epoch"), (True, "ok"), (True, "ok"), (False, "unknown_session"),
                            (False, "not_owner")]
        await s.release("a", g2)
        assert (await s.load_view())["w2"].used == 0 and (await s.session("a")).state == "suspended"
        with pytest.raises(NoCapacityError, match="holds no slot"):
            await s.claim("a", g2)  # a released generation confers no execution
        await s.release("a", g2)  # idempotent
        g3 = await s.commit("a", 2, "w2")
        await s.release("a", g3, close=True)
        await s.release("a", g3, close=True)  # redelivered: still fine
        assert await s.current("a") is None and (await s.session("a")).state == "closed"
        with pytest.raises(UnknownSessionError, match="closed"):
            await s.commit("a", 3, "w1")
        with pytest.raises(UnknownSessionError, match="closed"):
            await s.commit("a", 0, "w1")
        assert await s.release_chunks([("a", g3, 1)]) == [(False, "closed")]
        with pytest.raises(StaleGenerationError):
            await s.release("b", Generation("w1", 7))

    arun(redis_url, namespace, body)


def test_deregister_only_when_empty_unless_forced(redis_url: str, namespace: str) -> None:
    async def body(s: GenerationStore) -> None:
        await s.register_worker("w1", 2)
        await s.register_worker("w2", 2)
        g = await s.commit("a", 0, "w1")
        with pytest.raises(NoCapacityError, match="deregister refused"):
            await s.deregister_worker("w1")
        with pytest.raises(NoCapacityError, match="below"):
            await s.register_worker("w1", 0)
        assert await s.deregister_worker("w1", force=True) == ["a"]
        assert "w1" not in await s.load_view()
        with pytest.raises(NoCapacityError, match="holds no slot"):
            await s.claim("a", g)  # the dead incarnation's generation is unslotted
        await s.register_worker("w1", 1)  # a fresh incarnation: no inherited slot
        assert (await s.load_view())["w1"] == WorkerLoad(0, 1, False)
        assert await s.commit("a", 1, "w2") == Generation("w2", 2)
        assert (await s.load_view())["w1"].used == 0  # nothing freed that was not held
        assert await s.deregister_worker("ghost") == []

    arun(redis_url, namespace, body)


def test_fenced_progress_and_snapshots(redis_url: str, namespace: str, redis_client: Any) -> None:
    async def body(s: GenerationStore) -> None:
        await s.register_worker("w1", 1)
        await s.register_worker("w2", 1)
        g1 = await s.commit("a", 0, "w1")
        await s.write_progress("a", g1, chunk_index=4)
        await s.set_input_seq("a", g1, 9)
        data = bytes(range(256)) * 5
        m = await s.put_snapshot("a", g1, data, chunk_index=4, input_seq=9)
        assert m.parts == 80 and m.size == len(data)
        assert await s.read_snapshot("a") == (m, data)
        g2 = await s.commit_migration("a", g1, "w2")
        with pytest.raises(StaleGenerationError):
            await s.write_progress("a", g1, chunk_index=5)
        with pytest.raises(StaleGenerationError):
            await s.put_snapshot("a", g1, b"stale")
        view = await s.session("a")
        assert (view.chunk_index, view.input_seq, view.snapshot) == (4, 9, m)
        await s.set_input_seq("a", g2, 12, [7, 10])  # 7 and 10 given up on after the gap wait
        await s.set_input_seq("a", g2, 13)  # none new: the list stays
        view = await s.session("a")
        assert (view.input_seq, view.skipped) == (13, (7, 10))
        m2 = await s.put_snapshot("a", g2, b"new state")
        assert await s.read_snapshot("a") == (m2, b"new state")
        assert redis_client.hlen(s.keys.snapdata("a")) == 1  # old parts dropped with the manifest
        redis_client.hset(s.keys.snapdata("a"), f"{m2.snap_id}:0", b"tampered")
        with pytest.raises(SnapshotCorruptError):
            await s.read_snapshot("a")
        await s.release("a", g2, close=True)
        assert await s.read_snapshot("a") is None and not redis_client.exists(s.keys.snapdata("a"))

    arun(redis_url, namespace, body, part_size=16)


def test_a_stale_writer_mid_snapshot_is_cut_off(redis_url: str, namespace: str) -> None:
    async def body(s: GenerationStore) -> None:
        await s.register_worker("w1", 1)
        await s.register_worker("w2", 1)
        g1 = await s.commit("a", 0, "w1")
        real = s._backend.call
        parts = 0

        async def migrate_midway(name: str, keys: list[str], args: list[Any]) -> Any:
            nonlocal parts
            if name == "snap_part":
                parts += 1
                if parts == 2:
                    await real("commit", *_migration_call(s, g1))
            return await real(name, keys, args)

        s._backend.call = migrate_midway  # type: ignore[method-assign]
        with pytest.raises(StaleGenerationError):
            await s.put_snapshot("a", g1, b"x" * 40)
        assert await s.read_snapshot("a") is None

    arun(redis_url, namespace, body, part_size=16)


def _migration_call(s: GenerationStore, g1: Generation) -> tuple[list[str], list[Any]]:
    k = s.keys
    return [k.session("a"), k.workers, k.slots("w2"), k.slots("w1")], ["a", g1.epoch, "w2", "w1", "w1"]


def test_noscript_reloads_and_all_keys_share_one_slot(redis_url: str, namespace: str, redis_client: Any) -> None:
    async def body(s: GenerationStore) -> None:
        await s.register_worker("w1", 1)
        await s.commit("a", 0, "w1")
        # a script source the server has never seen: EVALSHA answers NOSCRIPT, we reload
        fresh = _AsyncBackend(s.client, {n: f"{src}\n-- {namespace}" for n, src in SCRIPTS.items()})
        fresh.loaded = set(SCRIPTS)  # pretend it was loaded before a failover
        t = GenerationStore(s.client, namespace, backend=fresh)
        assert await t.current("a") == Generation("w1", 1)
        await t.put_snapshot("a", Generation("w1", 1), b"abc")

    arun(redis_url, namespace, body)
    keys = redis_client.keys(f"{{{namespace}}}*")
    assert len(keys) == 4
    assert len({redis.crc.key_slot(k) for k in keys}) == 1


def test_sync_facade(redis_url: str, namespace: str) -> None:
    s = SyncGenerationStore.from_url(redis_url, namespace)
    try:
        s.register_worker("w1", 1)
        g = s.commit("a", 0, "w1")
        s.claim("a", g)
        assert s.release_chunks([("a", g, 0)]) == [(True, "ok")]
        s.release("a", g)
        assert s.load_view() == {"w1": WorkerLoad(0, 1, False)}
    finally:
        s.close()


def test_dispatch_race_admits_exactly_one(redis_url: str, namespace: str) -> None:
    """Two dispatch replicas, two clients, one free slot: one commit wins."""

    async def main() -> None:
        a = GenerationStore.from_url(redis_url, namespace)
        b = GenerationStore.from_url(redis_url, namespace)
        try:
            await a.register_worker("w1", 3)
            await a.commit("x", 0, "w1")
            await a.commit("y", 0, "w1")
            for round_ in range(20):
                sid_a, sid_b = f"p{round_}", f"q{round_}"
                res = await asyncio.gather(a.commit(sid_a, 0, "w1"), b.commit(sid_b, 0, "w1"),
                                           return_exceptions=True)
                won = [r for r in res if isinstance(r, Generation)]
                lost = [r for r in res if isinstance(r, NoCapacityError)]
                assert len(won) == 1 and len(lost) == 1, res
                assert (await a.load_view())["w1"].used == 3
                winner = sid_a if isinstance(res[0], Generation) else sid_b
                await a.release(winner, won[0], close=True)
            # the same session raced from its no-generation state: one epoch 1
            res = await asyncio.gather(a.commit("z", 0, "w1"), b.commit("z", 0, "w1"), return_exceptions=True)
            assert sorted(type(r).__name__ for r in res) == ["Generation", "StaleGenerationError"]
        finally:
            await a.aclose()
            await b.aclose()

    asyncio.run(main())


def test_a_burst_past_the_pool_waits_for_a_connection_instead_of_failing(redis_url):
    """More callers at once than the client has connections (each holding one 0.2 s): with
    redis-py's default pool the 101st raises MaxConnectionsError; the store's waits its turn."""
    import redis.asyncio as aioredis
    from redis.exceptions import MaxConnectionsError

    from streams.config import REDIS_POOL_CONNECTIONS, redis_client

    async def burst(client: Any, n: int) -> list[Any]:
        try:
            return await asyncio.gather(*[client.blpop([f"pool-test-{i}"], timeout=0.2) for i in range(n)],
                                        return_exceptions=True)
        finally:
            await client.aclose()

    n = 3 * REDIS_POOL_CONNECTIONS + 10
    stock = asyncio.run(burst(aioredis.Redis.from_url(redis_url), n))
    assert any(isinstance(x, MaxConnectionsError) for x in stock)  # what the store met before
    ours = asyncio.run(burst(redis_client(redis_url), n))
    assert ours == [None] * n  # every call answered (nothing popped: the lists are empty)
