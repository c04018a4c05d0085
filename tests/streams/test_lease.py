"""Leases in the store's in-memory twin: one holder at a time, refreshed by its token alone,
released only by it; ``streams.lease.Lease`` waits out a holder that may have died, keeps its
lease, takes one that expired again and reports one another holder took."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from schemas.errors import InfraError
from streams.generations import LeaseAnswer, LeaseState
from streams.generations_memory import MemoryGenerationStore, SyncMemoryGenerationStore
from streams.lease import LEASE_MARGIN_S, RETRY_S, Lease, holder_of, holder_token


def test_one_holder_at_a_time_refreshed_and_released_by_its_token_only() -> None:
    s = SyncMemoryGenerationStore("ns")
    key = s.keys.lease("worker:w1")
    assert key == "{ns}:lease:worker:w1"  # the namespace's hash tag: the same cluster slot
    assert s.acquire_lease("worker:w1", "a:1:x", 5000) == LeaseAnswer(LeaseState.ACQUIRED, "a:1:x", 5000)
    assert s.acquire_lease("worker:w1", "a:1:x", 7000) == LeaseAnswer(LeaseState.REFRESHED, "a:1:x", 7000)
    assert s.scripts.ttl[key] == 7000
    held = s.acquire_lease("worker:w1", "b:2:y", 5000)
    assert held == LeaseAnswer(LeaseState.HELD, "a:1:x", 7000) and not held.ours
    assert s.scripts.data[key] == "a:1:x" and s.scripts.ttl[key] == 7000  # left as it was
    assert s.release_lease("worker:w1", "b:2:y") is False and s.scripts.data[key] == "a:1:x"
    assert s.acquire_lease("worker:w2", "b:2:y", 5000).ours  # another name, another lease
    assert s.release_lease("worker:w1", "a:1:x") is True and key not in s.scripts.data
    assert key not in s.scripts.ttl
    assert s.release_lease("worker:w1", "a:1:x") is False
    assert s.acquire_lease("worker:w1", "b:2:y", 5000).state is LeaseState.ACQUIRED


def test_a_lease_lives_in_its_namespaces_cluster_slot() -> None:
    from redis.crc import key_slot

    from streams.generations import Keys

    for ns in ("cs", "pool-1", "x"):
        keys = Keys(ns)
        assert key_slot(keys.lease("worker:w{1}").encode()) == key_slot(keys.workers.encode())


def test_an_expired_lease_goes_to_the_next_taker() -> None:
    s = SyncMemoryGenerationStore("ns")
    s.acquire_lease("metrics", "a:1:x", 5000)
    s.scripts.expire(s.keys.lease("metrics"))
    assert s.acquire_lease("metrics", "b:2:y", 5000) == LeaseAnswer(LeaseState.ACQUIRED, "b:2:y", 5000)


def test_lease_arguments_are_checked() -> None:
    s = SyncMemoryGenerationStore("ns")
    for name, token, ttl in (("", "t", 5000), ("n", "", 5000), ("n", "t", 0)):
        with pytest.raises(ValueError):
            s.acquire_lease(name, token, ttl)
    assert s.scripts.calls == 0


def test_tokens_name_the_host_and_process() -> None:
    import os
    import socket

    a, b = holder_token(), holder_token()
    assert a != b and holder_of(a) == holder_of(b) == f"{socket.gethostname()}:{os.getpid()}"
    assert holder_of("plain") == "plain"


class _Time:
    """A monotonic clock the lease's sleeps advance (no real waiting)."""

    def __init__(self) -> None:
        self.now, self.sleeps = 100.0, 0
        self.during_sleep = lambda: None

    def __call__(self) -> float:
        return self.now

    async def sleep(self, s: float) -> None:
        self.now += s
        self.sleeps += 1
        self.during_sleep()


def test_take_waits_out_a_live_holder_then_gives_its_answer() -> None:
    store, t = MemoryGenerationStore("ns"), _Time()
    store.scripts.data[store.keys.lease("worker:w1")] = "a:1:x"
    store.scripts.ttl[store.keys.lease("worker:w1")] = 8000  # more than ours: its time counts
    lease = Lease(store, "worker:w1", 5.0, token="b:2:y", monotonic=t, sleep=t.sleep)
    answer = asyncio.run(lease.take())
    assert answer == LeaseAnswer(LeaseState.HELD, "a:1:x", 8000)
    assert t.now - 100.0 == pytest.approx(8.0 + LEASE_MARGIN_S, abs=RETRY_S)
    assert t.sleeps == pytest.approx((8.0 + LEASE_MARGIN_S) / RETRY_S, abs=1)


def test_take_goes_on_once_a_dead_holders_lease_expires() -> None:
    store, t = MemoryGenerationStore("ns"), _Time()
    key = store.keys.lease("worker:w1")
    store.scripts.data[key], store.scripts.ttl[key] = "a:1:x", 5000
    t.during_sleep = lambda: store.scripts.expire(key) if t.now >= 104.0 else None  # its 5 s run out
    lease = Lease(store, "worker:w1", 5.0, token="b:2:y", monotonic=t, sleep=t.sleep)
    answer = asyncio.run(lease.take())
    assert answer.state is LeaseState.ACQUIRED and store.scripts.data[key] == "b:2:y"
    assert 104.0 <= t.now < 105.0


def test_take_with_no_holder_does_not_wait() -> None:
    store, t = MemoryGenerationStore("ns"), _Time()
    lease = Lease(store, "worker:w1", 5.0, monotonic=t, sleep=t.sleep)
    assert asyncio.run(lease.take()).state is LeaseState.ACQUIRED and t.sleeps == 0
    assert asyncio.run(lease.take()).state is LeaseState.REFRESHED and t.sleeps == 0


class _Flaky(MemoryGenerationStore):
    """Redis away for the first ``failures`` acquires."""

    def __init__(self, failures: int) -> None:
        super().__init__("ns")
        self.failures = failures

    async def acquire_lease(self, name: str, token: str, ttl_ms: int) -> LeaseAnswer:
        if self.failures > 0:
            self.failures -= 1
            raise InfraError("generation store: Redis unreachable: test")
        return await super().acquire_lease(name, token, ttl_ms)


def test_keep_refreshes_retakes_an_expired_lease_and_rides_out_redis_errors() -> None:
    async def run() -> tuple[int, bool]:
        store = _Flaky(failures=0)
        lease = Lease(store, "worker:w1", 0.3, token="b:2:y")
        await lease.take()
        key = store.keys.lease("worker:w1")
        stop = asyncio.Event()
        keeping = asyncio.create_task(lease.keep(stop, 0.02))
        await asyncio.sleep(0.1)
        store.scripts.expire(key)  # Redis restarted, or this process paused past its time
        store.failures = 3  # then Redis is away for three refreshes
        await asyncio.sleep(0.3)
        held_again = store.scripts.data.get(key) == "b:2:y"
        stop.set()
        assert await asyncio.wait_for(keeping, 5) is None  # stopped, not lost
        return store.failures, held_again

    failures, held_again = asyncio.run(run())
    assert failures == 0 and held_again  # three failed refreshes, then taken again


def test_keep_reports_another_holder_and_release_leaves_its_lease() -> None:
    async def run() -> tuple[LeaseAnswer | None, bool, str]:
        store = MemoryGenerationStore("ns")
        lease = Lease(store, "worker:w1", 0.3, token="b:2:y")
        await lease.take()
        key = store.keys.lease("worker:w1")
        store.scripts.data[key] = "a:1:x"  # this one could not refresh for a lease time; taken
        taken = await asyncio.wait_for(lease.keep(asyncio.Event(), 0.02), 5)
        return taken, await lease.release(), store.scripts.data[key]

    taken, released, holder = asyncio.run(run())
    assert taken is not None and taken.state is LeaseState.HELD and taken.holder == "a:1:x"
    assert released is False and holder == "a:1:x"


def test_release_with_redis_away_is_not_an_error() -> None:
    class Away(MemoryGenerationStore):
        async def release_lease(self, name: str, token: str) -> bool:
            raise InfraError("generation store: Redis unreachable: test")

    assert asyncio.run(Lease(Away("ns"), "metrics", 5.0).release()) is False


def test_the_twin_counts_each_acquire_as_one_script_call() -> None:
    s = SyncMemoryGenerationStore("ns")
    for _ in itertools.repeat(None, 3):
        s.acquire_lease("metrics", "a:1:x", 5000)
    s.release_lease("metrics", "a:1:x")
    assert s.scripts.calls == 4


def test_a_store_is_bound_to_how_far_its_log_reached() -> None:
    """A store records, per topic prefix, the ``session-events`` end offset it served up to:
    a log holding records it knows nothing of (and no worker) is refused, unless adopted; a
    log shorter than recorded (topics made anew) is refused; otherwise the offset grows."""
    s = SyncMemoryGenerationStore("ns")
    assert s.bind_log("p", 0, False) == ("ok", 0)  # a new log and a new store
    assert s.bind_log("p", 7, True) == ("ok", 0) and s.bind_log("p", 9, True) == ("ok", 7)
    assert s.bind_log("p", 3, True) == ("behind", 9)  # the topics were made anew
    assert s.bind_log("p", 9, True) == ("ok", 9)
    lost = SyncMemoryGenerationStore("ns")  # a Redis that lost its data
    assert lost.bind_log("p", 9, True) == ("unknown", 0) and lost.scripts.data == {}
    assert lost.bind_log("p", 9, False) == ("ok", 0)  # retention removed every record: nothing to know
    other = SyncMemoryGenerationStore("ns")
    assert other.bind_log("p", 9, True, adopt=True) == ("ok", 0) and other.bind_log("p", 9, True) == ("ok", 9)
    known = SyncMemoryGenerationStore("ns")  # a store from before the binding, with its workers
    known.register_worker("w1", 2)
    assert known.bind_log("p", 9, True) == ("ok", 0)
    assert known.bind_log("q", 0, False) == ("ok", 0)  # another prefix, its own record
