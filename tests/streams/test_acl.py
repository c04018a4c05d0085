"""The documented Redis ACL runs chunkserve's store and refuses everything else."""

from __future__ import annotations

import time
import uuid

import pytest
import redis

from schemas.records import Generation
from streams.acl import acl_rules
from streams.generations import SyncGenerationStore

pytestmark = pytest.mark.integration


def test_acl_user_runs_the_store_and_nothing_else(redis_url, namespace):
    admin = redis.Redis.from_url(redis_url)
    user, password = f"cs-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    admin.execute_command("ACL", "SETUSER", user, "on", f">{password}", *acl_rules(namespace))
    admin.set(f"other-{namespace}", "secret")
    limited = redis.Redis.from_url(redis_url, username=user, password=password)
    store = SyncGenerationStore(limited, namespace)
    try:
        store.register_worker("w1", 2)
        gen = store.commit("s1", 0, "w1")
        store.claim("s1", gen)
        assert store.release_chunks([("s1", gen, 0)]) == [(True, "ok")]
        store.put_snapshot("s1", gen, b"state" * 100, chunk_index=0, input_seq=0)
        assert store.read_snapshot("s1")[1] == b"state" * 100
        store.release("s1", gen, close=True)  # and its hash expires (PEXPIRE)
        assert store.current("s1") is None and gen == Generation("w1", 1)
        store.register_worker("w2", 1)
        store.set_down("w2", 1.0)
        assert store.forget_down(time.time()) == ["w2"] and "w2" not in store.load_view()
        assert store.acquire_lease("worker:w1", "h:1:a", 5000).ours  # GET, SET ... PX
        held = store.acquire_lease("worker:w1", "h:2:b", 5000)  # PTTL
        assert not held.ours and held.holder == "h:1:a"
        assert store.release_lease("worker:w1", "h:1:a")  # DEL
        assert store.bind_log("p", 3, True) == ("ok", 0) and store.bind_log("p", 1, True) == ("behind", 3)  # HGET, HSET, HKEYS
        with pytest.raises(redis.exceptions.NoPermissionError):
            limited.flushall()
        with pytest.raises(redis.exceptions.NoPermissionError):
            limited.get(f"other-{namespace}")
        with pytest.raises(redis.exceptions.NoPermissionError):
            limited.keys("*")
    finally:
        limited.close()
        admin.execute_command("ACL", "DELUSER", user)
        admin.delete(f"other-{namespace}")
        for key in admin.scan_iter(f"{{{namespace}}}*"):
            admin.delete(key)
        admin.close()


def test_a_user_without_a_command_the_store_runs_is_refused_in_one_line(redis_url, namespace):
    """On one Redis too: the store's script refused ``pexpire`` (a close) is reported naming
    the user, the operation and the command (from the script's line), not as a Lua error."""
    from schemas.errors import AccessDeniedError

    admin = redis.Redis.from_url(redis_url)
    user, password = f"cs-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    rules = [r for r in acl_rules(namespace) if r != "+pexpire"]
    admin.execute_command("ACL", "SETUSER", user, "on", f">{password}", *rules)
    limited = redis.Redis.from_url(redis_url, username=user, password=password)
    store = SyncGenerationStore(limited, namespace)
    try:
        store.register_worker("w1", 1)
        gen = store.commit("s1", 0, "w1")
        with pytest.raises(AccessDeniedError) as refused:
            store.release("s1", gen, close=True)
        line = str(refused.value)
        assert line.startswith(f"Redis refused user {user!r} release on key {{{namespace}}}:s:s1 ("), line
        assert "'pexpire' command" in line and "\n" not in line and password not in line, line
    finally:
        limited.close()
        admin.execute_command("ACL", "DELUSER", user)
        for key in admin.scan_iter(f"{{{namespace}}}*"):
            admin.delete(key)
        admin.close()


def test_acl_user_runs_the_recovery_queue(redis_url, namespace):
    """A dead worker's sessions are queued and swept under the documented ACL (its rules
    lacked the sorted-set commands the queue runs: an outside run's dispatch crashed when a
    worker died, and no session of it was recovered)."""
    import asyncio

    from streams.generations import GenerationStore

    admin = redis.Redis.from_url(redis_url)
    user, password = f"cs-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    admin.execute_command("ACL", "SETUSER", user, "on", f">{password}", *acl_rules(namespace))

    async def run() -> None:
        import redis.asyncio as aredis

        client = aredis.Redis.from_url(redis_url, username=user, password=password)
        store = GenerationStore(client, namespace)
        try:
            await store.register_worker("w1", 2)
            gen = await store.commit("s1", 0, "w1")
            await store.claim("s1", gen)
            await store.set_down("w1", time.time())
            assert await store.strand("w1", time.time()) == 1  # ZADD
            count, due = await store.recovery_due(time.time() + 1, 8)  # ZCARD, ZRANGEBYSCORE
            assert count == 1 and [sid for sid, _ in due] == ["s1"]
            now = time.time() + 1
            assert await store.recovery_take("s1", now, now + 30)  # ZADD XX INCR 0: the score read
            assert not await store.recovery_take("s1", now, now + 30)  # taken: not due again
            await store.recovery_mark("s1", None)  # ZREM
            assert (await store.recovery_due(time.time() + 1, 8))[0] == 0
        finally:
            await client.aclose()

    try:
        asyncio.run(run())
    finally:
        admin.execute_command("ACL", "DELUSER", user)
        for key in admin.scan_iter(f"{{{namespace}}}*"):
            admin.delete(key)
        admin.close()


def test_the_acl_grants_every_command_the_store_scripts_run():
    """Every ``redis.call`` in the store's Lua scripts is one the rules allow (the rules
    missed the recovery queue's four)."""
    import re
    from pathlib import Path

    from streams.acl import COMMANDS

    lua = Path(__file__).resolve().parents[2] / "streams" / "lua"
    called = {m.lower() for f in lua.glob("*.lua") for m in re.findall(r"redis\.call\('([A-Za-z]+)'", f.read_text())}
    assert called and called <= set(COMMANDS), sorted(called - set(COMMANDS))
