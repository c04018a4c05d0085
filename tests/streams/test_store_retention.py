"""Redis holds a bounded footprint (issue 16, item 6): a closed session's keys and a stopped
worker's entries go after ``store_retention_s``, on a real Redis; the twin records the same
expiries and, told when a key expired, answers as Redis does."""

from __future__ import annotations

import time
from typing import Any, Callable

import pytest

from schemas.errors import ChunkserveError, ConfigError
from schemas.records import Generation
from streams.config import Settings
from streams.config_file import load_settings
from streams.generations import GenerationStore, SyncGenerationStore
from streams.generations_memory import SyncMemoryGenerationStore

pytestmark = pytest.mark.integration

RETENTION_S = 1


def _keys(client: Any, namespace: str) -> dict[str, int]:
    """Every key of the namespace and its expiry in ms (-1: none); SCAN skips expired keys."""
    return {k.decode(): client.pttl(k) for k in client.scan_iter(match=f"{{{namespace}}}:*", count=1000)}


def _until(done: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _answer(call: Callable[[], Any]) -> Any:
    try:
        return "ok", call()
    except ChunkserveError as exc:
        return "err", type(exc).__name__, str(exc)


@pytest.fixture
def stores(redis_client: Any, namespace: str) -> Any:
    real = SyncGenerationStore(redis_client, namespace, retention_s=RETENTION_S)
    twin = SyncMemoryGenerationStore(namespace, retention_s=RETENTION_S)
    yield real, twin
    for key in redis_client.scan_iter(match=f"{{{namespace}}}:*"):
        redis_client.delete(key)


def test_a_closed_session_refuses_until_it_expires_then_is_unknown(stores, redis_client, namespace):
    real, twin = stores
    sid, key = "s1", real.keys.session("s1")
    answers: list[list[Any]] = [[], []]
    for store, out in zip((real, twin), answers):
        store.register_worker("w1", 2)
        store.register_worker("w2", 2)
        gen = store.commit(sid, 0, "w1")
        store.claim(sid, gen)
        store.put_snapshot(sid, gen, b"state" * 50, chunk_index=3, input_seq=1)
        store.release(sid, gen, close=True)
        out.append(_answer(lambda: store.commit(sid, gen.epoch, "w2")))  # a late move
        out.append(_answer(lambda: store.commit(sid, 0, "w2")))  # a redelivered open
        out.append(_answer(lambda: store.write_progress(sid, gen, chunk_index=4)))
        out.append(_answer(lambda: store.session(sid).state))
    assert answers[0] == answers[1]
    assert [a[0] for a in answers[0]] == ["err", "err", "err", "ok"]
    assert "closed" in answers[0][0][2] and answers[0][3] == ("ok", "closed")

    # the snapshot went at the close; the hash carries the retention as its expiry
    keys = _keys(redis_client, namespace)
    assert real.keys.snapdata(sid) not in keys and real.keys.snapdata(sid) not in twin.scripts.data
    assert 0 < keys[key] <= RETENTION_S * 1000 and twin.scripts.ttl == {key: RETENTION_S * 1000}

    # after the retention the session is unknown: an open of that id starts a new session
    _until(lambda: key not in _keys(redis_client, namespace))
    twin.scripts.expire(key)
    after = [[_answer(lambda: s.session(sid)), _answer(lambda: s.commit(sid, 0, "w2"))] for s in (real, twin)]
    assert after[0] == after[1] == [("ok", None), ("ok", Generation("w2", 1))]
    assert _keys(redis_client, namespace)[key] == -1  # a live session does not expire


def test_a_long_run_keeps_a_bounded_key_count(stores, redis_client, namespace):
    """Sessions opened, snapshotted, suspended, resumed and closed for 4 s with a 1 s
    retention: at every sample the namespace holds the live keys plus only the sessions
    closed within the last retention; when the run stops, everything of theirs goes."""
    real, _ = stores
    workers = [f"w{i}" for i in range(4)]
    for w in workers:
        real.register_worker(w, 8)
    closed_at: list[float] = []
    samples: list[tuple[int, int]] = []  # (keys seen, keys allowed)
    n, start = 0, time.monotonic()
    while time.monotonic() - start < 4.0:
        batch = [f"s{n + i}" for i in range(16)]
        n += len(batch)
        for i, sid in enumerate(batch):
            gen = real.commit(sid, 0, workers[i % len(workers)])
            real.claim(sid, gen)
            real.put_snapshot(sid, gen, b"x" * 64, chunk_index=0, input_seq=0)
            if i % 2:  # suspended (slot freed), then resumed elsewhere
                real.release(sid, gen)
                gen = real.commit(sid, gen.epoch, workers[(i + 1) % len(workers)])
            real.release(sid, gen, close=True)
            closed_at.append(time.monotonic())
        seen = len(_keys(redis_client, namespace))
        now = time.monotonic()
        recent = sum(1 for t in closed_at if t > now - RETENTION_S - 0.5)  # 0.5 s for clock skew
        samples.append((seen, 1 + recent))  # the workers hash and the recent closes' hashes
    assert n >= 64 and len(samples) >= 4
    assert all(seen <= allowed for seen, allowed in samples), samples
    assert max(seen for seen, _ in samples) < n / 2  # the count did not grow with the run

    # then only the workers hash is left: no session hash, no snapshot data, no slot set
    _until(lambda: list(_keys(redis_client, namespace)) == [real.keys.workers], timeout_s=RETENTION_S + 10)
    assert set(real.load_view()) == set(workers)


def test_stopped_workers_are_forgotten_after_the_retention(stores, redis_client, namespace):
    real, twin = stores
    for store in (real, twin):
        for w in ("w1", "w2", "w3", "w4"):
            store.register_worker(w, 2)
        store.commit("s1", 0, "w2")  # w2 holds a slot: kept until its session moves
        store.set_down("w1", 100.0)
        store.set_down("w2", 100.0)
        store.set_down("w3", 100.0)
        store.set_up("w3", 100.5)  # heard from again: kept
        store.deregister_worker("w4")  # a clean stop: nothing of it left at once
    assert real.forget_down(100.0 + RETENTION_S - 0.1) == twin.forget_down(100.0 + RETENTION_S - 0.1) == []
    assert real.forget_down(100.0 + RETENTION_S) == twin.forget_down(100.0 + RETENTION_S) == ["w1"]
    for store in (real, twin):
        store.commit("s1", 1, "w3")  # recovered elsewhere: w2's slot freed
    assert real.forget_down(1e9) == twin.forget_down(1e9) == ["w2"]
    assert set(real.load_view()) == set(twin.load_view()) == {"w3"}
    fields = {f.decode() for f in redis_client.hkeys(real.keys.workers)}
    assert fields == {"c:w3", "d:w3", "u:w3"}  # no field of w1, w2 or w4
    assert set(_keys(redis_client, namespace)) == {real.keys.workers, real.keys.slots("w3"), real.keys.session("s1")}
    assert set(twin.scripts.data) == set(_keys(redis_client, namespace))


def test_the_retention_is_a_setting(redis_url):
    assert Settings().store_retention_s == 3600
    settings = load_settings(None, {"CHUNKSERVE_STORE_RETENTION_S": "90", "CHUNKSERVE_REDIS_URL": redis_url})
    assert settings.store_retention_s == 90
    store = GenerationStore.from_settings(settings)
    assert store._ops.retention_s == 90  # the deployment's store closes sessions with it
    with pytest.raises(ConfigError, match="store_retention_s"):
        load_settings(None, {"CHUNKSERVE_STORE_RETENTION_S": "0"})
    with pytest.raises(ConfigError, match="store_retention_s"):
        Settings(store_retention_s=0)
