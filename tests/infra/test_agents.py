"""The control-plane agents and the provisioner on the real broker and Redis, as processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

import pytest

from schemas import records as r
from schemas.codec import encode
from schemas.topics import DEAD_LETTERS, METRICS, SCALING_COMMANDS, SESSION_EVENTS, WORKER_EVENTS
from streams.config import Settings
from streams.generations import GenerationStore
from streams.kafka import RecordConsumer, RecordProducer
from streams.topics import ensure_topics
from processors.agents.detector import DetectorShell
from processors.agents.metrics import cost_tick, fold_cost
from processors.detector import DetectorConfig
from processors.latency import load_profiles
from workers.provisioner import LocalProcessProvisioner, next_index, run_provisioner

pytestmark = pytest.mark.integration


def _settings(bootstrap: str, redis_url: str, namespace: str) -> Settings:
    return Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(bootstrap, redis_url)


def _env(settings: Settings, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(CHUNKSERVE_KAFKA_BOOTSTRAP=settings.kafka.bootstrap, CHUNKSERVE_REDIS_URL=settings.redis.url,
               CHUNKSERVE_TOPIC_PREFIX=settings.topic_prefix, CHUNKSERVE_NAMESPACE=settings.namespace,
               PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **extra)
    return env


def _spawn_processor(name: str, settings: Settings, log: Path, **extra: str) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "infra", "processor", name], env=_env(settings, **extra),
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def _run_then_stop(run: Callable[[], Any], procs: list[subprocess.Popen[bytes]]) -> None:
    try:
        asyncio.run(run())
    finally:
        for proc in procs:
            _stop(proc)


class Reader:
    """Reads logical topics from the beginning, without a group."""

    def __init__(self, settings: Settings, producer: RecordProducer, topics: list[str]) -> None:
        self.settings, self.topics = settings, topics
        self.consumer = RecordConsumer(settings, topics, producer, name="test-reader")
        self.records: list[r.Record] = []

    async def start(self, at: str = "beginning") -> "Reader":
        await self.consumer.start(subscribe=False)
        await self.consumer.assign(dict.fromkeys(self.topics), at)
        return self

    async def wait_for(self, pred: Callable[[r.Record], bool], timeout_s: float, what: str) -> r.Record:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for rec in self.records:
                if pred(rec):
                    return rec
            self.records.extend(d.record for d in await self.consumer.poll(timeout_ms=200))
        raise AssertionError(f"no {what} within {timeout_s}s; saw {[type(x).__name__ for x in self.records]}")


def test_detector_control_and_metrics_agents_answer_events(kafka_bootstrap, redis_url, namespace, tmp_path):
    """The detector publishes a WorkloadSignal (not counting a session event keyed by
    something other than its session); the control agent, seeing sessions and no worker,
    asks for a scale-out and reports it; the metrics agent bills a worker's uptime."""
    settings = _settings(kafka_bootstrap, redis_url, namespace)
    asyncio.run(ensure_topics(settings))
    procs = [_spawn_processor("detector", settings, tmp_path / "detector.log", CHUNKSERVE_DETECTOR_TICK_S="0.5"),
             _spawn_processor("control", settings, tmp_path / "control.log", CHUNKSERVE_CONTROL_TICK_S="0.2",
                              CHUNKSERVE_POOL="p"),
             _spawn_processor("metrics", settings, tmp_path / "metrics.log", CHUNKSERVE_COST_INTERVAL_S="0.5")]

    async def run() -> None:
        async with RecordProducer(settings) as producer:
            now = time.time()
            misfiled = r.SessionOpened(session_id="s-mis", ts=now)  # dispatch refuses it: nobody counts it
            await producer.send_raw(SESSION_EVENTS, encode(misfiled), key=b"someone-else")
            for i in range(3):
                await producer.send(r.SessionOpened(session_id=f"s{i}", ts=now))
            await producer.send(r.SessionIdle(session_id="s0", ts=now + 0.1))
            await producer.send(r.WorkerUp(worker_id="old-0", ts=now - 3600, capacity=4))
            await producer.send(r.WorkerDown(worker_id="old-0", ts=now - 1800))
            reader = await Reader(settings, producer, [METRICS, SCALING_COMMANDS]).start()
            try:
                sig = await reader.wait_for(lambda x: isinstance(x, r.WorkloadSignal) and x.arrivals == 3
                                            and x.to_idle == 1, 45, "workload signal")
                assert sig.active == 2 and 1 <= sig.level <= 10
                scale = await reader.wait_for(lambda x: isinstance(x, r.ScaleOut), 30, "scale-out")
                assert scale.pool == "p" and scale.gpu_type == "cpu"
                decision = await reader.wait_for(lambda x: isinstance(x, r.ScalingDecision), 5, "decision")
                # 2 sessions fit one worker; the default floor of two (N + 1) asks for a second
                # in the same decision (one ScaleOut, or one for the sessions and one for the floor)
                assert decision.current == 0 and decision.target == 2

                def asked() -> int:
                    return sum(x.count for x in reader.records if isinstance(x, r.ScaleOut) and x.ts == decision.ts)

                await reader.wait_for(lambda _x: asked() >= 2, 10, "the floor's two workers asked for")
                assert asked() == 2
                tick = await reader.wait_for(lambda x: isinstance(x, r.CostTick), 20, "cost tick")
                assert tick.gpus == 0 and tick.gpu_seconds == pytest.approx(1800)
                assert tick.cost == pytest.approx(1800 * 0.1 / 3600)  # reference-cpu: 0.10 per hour
            finally:
                await reader.consumer.stop()

    _run_then_stop(run, procs)


def test_a_restarted_metrics_processor_bills_the_workers_already_up(kafka_bootstrap, redis_url, namespace):
    """The metrics agents resume after their group's offsets, past the ``WorkerUp`` of the
    workers running and the opens of the sessions open: the catch-up read from the log's
    start bills those workers and counts those sessions (a restart showed 0 workers and no
    cost beside two workers serving)."""
    from processors.agents.metrics import SessionTally, catch_up
    from streams.topics import TopicCatalogue

    settings = _settings(kafka_bootstrap, redis_url, namespace)
    asyncio.run(ensure_topics(settings))

    async def run() -> tuple[dict, SessionTally]:
        now = time.time()
        async with RecordProducer(settings) as producer:
            await producer.send(r.WorkerUp(worker_id="w-0", ts=now - 100, capacity=4))
            await producer.send(r.WorkerUp(worker_id="w-1", ts=now - 100, capacity=4))
            await producer.send(r.WorkerDown(worker_id="w-1", ts=now - 40))
            await producer.send(r.Heartbeat(worker_id="w-0", ts=now - 1, sessions=2, executing=1, capacity=4))
            for sid in ("a", "b"):
                await producer.send(r.SessionOpened(session_id=sid, ts=now - 50))
            await producer.send(r.SessionIdle(session_id="b", ts=now - 20))
            await producer.send_raw(SESSION_EVENTS, encode(r.SessionOpened(session_id="c", ts=now)), key=b"x")
        sessions = SessionTally()
        return await catch_up(settings, TopicCatalogue.from_settings(settings), {}, sessions), sessions

    spans, sessions = asyncio.run(run())
    tick = cost_tick(spans, time.time(), load_profiles("reference-cpu"))
    assert tick.gpus == 1 and tick.gpu_seconds == pytest.approx(160, abs=5)  # w-0 up 100 s, w-1 60 s
    assert sessions.counts() == {"active": 1, "idle": 1}  # the misfiled open is not counted


async def _wait_committed(settings: Settings, group: str, logical: str, count: int, timeout_s: float) -> None:
    """Until ``group`` has committed offsets past ``count`` records of ``logical`` in all."""
    from aiokafka import TopicPartition

    probe = RecordConsumer(settings, [logical], None, name="test-committed", group_id=group)
    await probe.start(subscribe=False)
    try:
        name, deadline = probe.catalogue.name(logical), time.monotonic() + timeout_s
        tps = [TopicPartition(name, p) for p in await probe.partitions(logical)]
        while time.monotonic() < deadline:
            if sum([await probe.raw.committed(tp) or 0 for tp in tps]) >= count:
                return
            await asyncio.sleep(0.2)
        raise AssertionError(f"{group} did not commit {count} records of {logical} within {timeout_s}s")
    finally:
        await probe.stop()


def _signal(pred: Callable[[r.WorkloadSignal], bool] = lambda s: True) -> Callable[[r.Record], bool]:
    return lambda x: isinstance(x, r.WorkloadSignal) and pred(x)


def test_a_restarted_detector_counts_the_sessions_open_before_it(kafka_bootstrap, redis_url, namespace, tmp_path):
    """The restarted detector's agent resumes after its group's offsets, past the opens of the
    sessions executing: it reads the log from its start first, so its first signal counts them
    and their closes count as departures (a restart was silent until a session event, then
    closed 4 executing sessions as active=0 departures=0)."""
    settings = _settings(kafka_bootstrap, redis_url, namespace)
    asyncio.run(ensure_topics(settings))
    env = dict(CHUNKSERVE_DETECTOR_TICK_S="0.5", CHUNKSERVE_DETECTOR_WINDOW_S="900")  # the opens stay in it
    first = _spawn_processor("detector", settings, tmp_path / "detector.log", **env)
    procs = [first]

    async def run() -> None:
        async with RecordProducer(settings) as producer:
            now = time.time()
            for i in range(5):
                await producer.send(r.SessionOpened(session_id=f"s{i}", ts=now))
            await producer.send(r.SessionIdle(session_id="s4", ts=now + 0.1))
            reader = await Reader(settings, producer, [METRICS]).start()
            try:
                await reader.wait_for(_signal(lambda s: s.active == 4 and s.to_idle == 1), 60, "the first detector's signal")
                await _wait_committed(settings, f"{settings.topic_prefix}detector", SESSION_EVENTS, 6, 30)
                first.kill()  # SIGKILL, as an operator's crash: nothing more from it
                first.wait(timeout=10)
                await reader.consumer.assign({METRICS: None}, "end")  # the new detector's signals only
                reader.records.clear()
                procs.append(_spawn_processor("detector", settings, tmp_path / "detector-2.log", **env))
                sig = await reader.wait_for(_signal(), 60, "the restarted detector's first signal")
                assert (sig.active, sig.arrivals, sig.to_idle, sig.departures) == (4, 5, 1, 0)
                for i in range(4):
                    await producer.send(r.SessionClosed(session_id=f"s{i}", ts=time.time()))
                closed = await reader.wait_for(_signal(lambda s: s.departures == 4), 45, "4 departures")
                assert (closed.active, closed.arrivals) == (0, 5)
            finally:
                await reader.consumer.stop()

    _run_then_stop(run, procs)


def test_a_fresh_detector_signals_an_idle_system_every_tick(kafka_bootstrap, redis_url, namespace, tmp_path):
    """With no session event ever, the detector still publishes active 0 on its tick (it
    published nothing until the first session event)."""
    settings = _settings(kafka_bootstrap, redis_url, namespace)
    asyncio.run(ensure_topics(settings))
    procs = [_spawn_processor("detector", settings, tmp_path / "detector.log", CHUNKSERVE_DETECTOR_TICK_S="0.5")]

    async def run() -> None:
        async with RecordProducer(settings) as producer:
            reader = await Reader(settings, producer, [METRICS]).start()
            try:
                await reader.wait_for(_signal(), 60, "a signal")  # the process's start-up
                await reader.wait_for(lambda x: len([s for s in reader.records if _signal()(s)]) >= 4, 5,
                                      "a signal every tick")
                sigs = [s for s in reader.records if isinstance(s, r.WorkloadSignal)]
                assert all((s.active, s.arrivals, s.departures) == (0, 0, 0) for s in sigs)
                assert sigs[3].ts - sigs[0].ts < 3.0  # 0.5 s ticks
            finally:
                await reader.consumer.stop()

    _run_then_stop(run, procs)


def test_dispatch_admits_where_the_published_admission_plan_says(kafka_bootstrap, redis_url, namespace, tmp_path):
    """A dispatch process reads the admission plans on scaling-commands: where least-loaded
    would pick w-b, the plan says w-a; past the plan, a session waits for its pin."""
    from schemas.topics import WORKER_COMMANDS
    from streams.generations import SyncGenerationStore

    settings = _settings(kafka_bootstrap, redis_url, namespace)
    asyncio.run(ensure_topics(settings))
    store = SyncGenerationStore.from_url(redis_url, namespace)
    try:
        for w in ("w-a", "w-b"):
            store.register_worker(w, 4)
    finally:
        store.client.close()
    procs = [_spawn_processor("dispatch", settings, tmp_path / "dispatch.log")]

    async def run() -> None:
        async with RecordProducer(settings) as producer:
            reader = await Reader(settings, producer, [WORKER_COMMANDS]).start()
            try:
                # no plan yet: least-loaded (ties by id); its Assign also says dispatch is up
                await producer.send(r.SessionOpened(session_id="s0", ts=time.time()))
                probe = await reader.wait_for(lambda x: isinstance(x, r.Assign) and x.session_id == "s0", 90, "s0 assign")
                assert probe.worker_id == "w-a"
                await producer.send(r.AdmissionPlan(pool="default", ts=time.time(), policy="test", fallback=False,
                                                    order=(r.AdmitSlot(worker_id="w-a", count=2),)))
                await asyncio.sleep(2.0)  # read by the replica's plan reader
                await producer.send(r.SessionOpened(session_id="s1", ts=time.time()))
                first = await reader.wait_for(lambda x: isinstance(x, r.Assign) and x.session_id == "s1", 30, "s1 assign")
                assert first.worker_id == "w-a"
                # past the order, without fallback: s2 waits for the policy's pin
                await producer.send(r.SessionOpened(session_id="s2", ts=time.time()))
                await asyncio.sleep(1.0)
                assert not [x for x in reader.records if isinstance(x, r.Assign) and x.session_id == "s2"]
                await producer.send(r.AdmissionPlan(pool="default", ts=time.time(), policy="test", fallback=False,
                                                    pinned={"s2": "w-a"}))
                second = await reader.wait_for(lambda x: isinstance(x, r.Assign) and x.session_id == "s2", 20, "s2 assign")
                assert second.worker_id == "w-a"  # least-loaded would be w-b
            finally:
                await reader.consumer.stop()

    _run_then_stop(run, procs)


def test_control_decisions_survive_a_crashed_leader(kafka_bootstrap, redis_url, namespace, tmp_path):
    """Two control instances; the leader asks for a worker and is killed (SIGKILL). The one left
    takes over from the log: it does not ask again for the worker still booting, and when more
    sessions come it asks only for what that worker does not cover."""
    settings = _settings(kafka_bootstrap, redis_url, namespace)
    asyncio.run(ensure_topics(settings))
    env = dict(CHUNKSERVE_CONTROL_TICK_S="0.2", CHUNKSERVE_POOL="p", CHUNKSERVE_SCALE_DWELL_S="1",
               CHUNKSERVE_BURST_MEMORY_S="0", CHUNKSERVE_BOOT_TIMEOUT_S="600", CHUNKSERVE_MIN_WORKERS="1")
    first = _spawn_processor("control", settings, tmp_path / "control-a.log", **env)
    procs = [first]

    async def run() -> None:
        async with RecordProducer(settings) as producer:
            reader = await Reader(settings, producer, [METRICS, SCALING_COMMANDS]).start()
            try:
                now = time.time()
                for i in range(3):
                    await producer.send(r.SessionOpened(session_id=f"s{i}", ts=now))
                one = await reader.wait_for(lambda x: isinstance(x, r.ScaleOut), 60, "first scale-out")
                assert one.count == 1  # 3 sessions fit one reference-cpu worker (K = 16)
                procs.append(_spawn_processor("control", settings, tmp_path / "control-b.log", **env))
                await asyncio.sleep(8)  # the second instance starts and joins the group
                first.kill()
                first.wait(timeout=10)
                await asyncio.sleep(15)  # the group's session times out; the other instance leads
                assert [x for x in reader.records if isinstance(x, r.ScaleOut)] == [one]  # not asked again
                later = time.time()
                for i in range(3, 23):
                    await producer.send(r.SessionOpened(session_id=f"s{i}", ts=later))
                two = await reader.wait_for(lambda x: isinstance(x, r.ScaleOut) and x.decision_id != one.decision_id,
                                            90, "second scale-out")
                decision = await reader.wait_for(lambda x: isinstance(x, r.ScalingDecision) and x.ts == two.ts,
                                                 10, "its scaling decision")
                assert decision.current == 1  # counts the worker the dead leader booted
                assert decision.target == 1 + two.count
                # the opens may be folded over several decisions (each arrival is a decision
                # epoch): the pool grows to what 23 sessions need at u*, the booting worker
                # counted, and never past it
                u_target = decision.u_target
                want = math.ceil(23 / u_target / 16 - 1e-9)

                def asked() -> int:
                    return sum(x.count for x in reader.records if isinstance(x, r.ScaleOut))

                await reader.wait_for(lambda _x: asked() >= want, 60, f"{want} workers asked for")
                settle = time.monotonic() + 3  # a decision asking for too many would show by now
                while time.monotonic() < settle:
                    reader.records.extend(d.record for d in await reader.consumer.poll(timeout_ms=200))
                assert asked() == want
            finally:
                await reader.consumer.stop()

    _run_then_stop(run, procs)


def test_provisioner_starts_a_worker_and_stops_it_once_empty(kafka_bootstrap, redis_url, namespace, tmp_path):
    settings = _settings(kafka_bootstrap, redis_url, namespace)

    async def run() -> None:
        await ensure_topics(settings)
        stop = asyncio.Event()
        from infra.embedded import free_port

        targets = tmp_path / "workers.json"  # the workers' metrics endpoints, as Prometheus file_sd
        prov = LocalProcessProvisioner(settings, "p", capacity=2, log_dir=tmp_path / "logs",
                                       metrics=("127.0.0.1", free_port()), targets=targets)
        task = asyncio.create_task(run_provisioner(settings, stop, prov, retry_s=0.3))
        store = GenerationStore(settings.redis.async_client(), namespace=namespace)
        try:
            async with RecordProducer(settings) as producer, contextlib.AsyncExitStack() as stack:
                reader = await Reader(settings, producer, [WORKER_EVENTS, DEAD_LETTERS]).start()
                stack.push_async_callback(reader.consumer.stop)
                await producer.send_raw(SCALING_COMMANDS, b"\x00garbage", key=b"p")
                await producer.send(r.ScaleOut(pool="p", count=100, ts=time.time(), decision_id="too-many"))
                await producer.send(r.ScaleOut(pool="other", count=1, ts=time.time(), decision_id="not-ours"))
                await producer.send(r.ScaleOut(pool="p", count=1, ts=time.time(), decision_id="d1"))
                await producer.send(r.ScaleOut(pool="p", count=1, ts=time.time(), decision_id="d1"))  # redelivered
                up = await reader.wait_for(lambda x: isinstance(x, r.WorkerUp), 45, "WorkerUp")
                assert up.worker_id == "p-0" and up.pool == "p" and up.capacity == 2
                await reader.wait_for(lambda x: isinstance(x, r.DeadLetter) and x.reason.startswith("refused"),
                                      5, "refused dead letter")
                letters = [x for x in reader.records if isinstance(x, r.DeadLetter)]
                assert {x.consumer for x in letters} == {"provisioner"} and len(letters) == 2
                assert list(prov.procs) == ["p-0"]  # the duplicate and the other pool started nothing
                listed = json.loads(targets.read_text())
                assert [t["labels"]["process"] for t in listed] == ["p-0"]
                scraped = urllib.request.urlopen(f"http://{listed[0]['targets'][0]}/metrics", timeout=5).read().decode()
                assert "chunkserve_records_produced_total" in scraped  # the worker serves its metrics
                replay = await reader.wait_for(lambda x: isinstance(x, r.CommandRejected), 10, "replay refusal")
                assert replay.reason == "replayed" and replay.command == r.ScaleOut.TAG and "d1" in replay.detail

                gen = await store.commit("s1", 0, "p-0")  # the worker holds a session
                await producer.send(r.Shutdown(pool="p", worker_id="p-0", ts=time.time()))
                await asyncio.sleep(1.5)
                assert prov.procs["p-0"].poll() is None  # not empty: still running
                assert (await store.load_view())["p-0"].draining
                await store.release("s1", gen, close=True)
                down = await reader.wait_for(lambda x: isinstance(x, r.WorkerDown)
                                             and x.reason == "shutdown by provisioner", 20, "WorkerDown")
                assert down.worker_id == "p-0"
                assert "p-0" not in prov.procs and "p-0" not in await store.load_view()
                assert json.loads(targets.read_text()) == []  # no longer listed
                await prov.start(1, "cpu")
                assert len(json.loads(targets.read_text())) == 1
                await prov.close()  # as when the provisioner stops
                assert json.loads(targets.read_text()) == []
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
            await store.aclose()

    asyncio.run(run())


def test_cost_fold_bills_each_worker_from_up_to_down():
    model = load_profiles("reference-cpu")
    spans: dict = {}
    for rec in [r.WorkerUp(worker_id="a", ts=0, capacity=4), r.WorkerUp(worker_id="a", ts=0, capacity=4),
                r.WorkerUp(worker_id="b", ts=100, capacity=4),
                r.Heartbeat(worker_id="b", ts=150, sessions=0, executing=0, capacity=4),
                r.WorkerDown(worker_id="a", ts=3600), r.WorkerDown(worker_id="a", ts=3600),
                r.WorkerUp(worker_id="a", ts=3000, capacity=4),  # stale redelivery: ignored
                r.ChunkDone(worker_id="b", session_id="s", generation=r.Generation("b", 1), chunk_index=0, ts=1)]:
        spans = fold_cost(spans, rec)
    tick = cost_tick(spans, 160.0, model, stale_s=30)
    assert tick.gpus == 1 and tick.gpu_seconds == pytest.approx(3600 + 60)
    silent = cost_tick(spans, 1000.0, model, stale_s=30)  # b went silent at 150: billed to 180
    assert silent.gpus == 0 and silent.gpu_seconds == pytest.approx(3600 + 80)
    assert silent.cost == pytest.approx((3600 + 80) * 0.1 / 3600)


def test_detector_shell_holds_back_bursts_and_ticks():
    clock = [99.0]
    shell = DetectorShell(DetectorConfig(window_s=10, slot_s=1), clock=lambda: clock[0])
    idle = shell.tick()  # nothing seen yet: an idle system, said every tick
    assert (idle.active, idle.arrivals, idle.departures, idle.ts) == (0, 0, 0, 99.0)
    clock[0] = 100.0
    first = shell.on_event(r.SessionOpened(session_id="a", ts=100))
    assert first is not None and (first.active, first.arrivals) == (1, 1)
    assert shell.on_event(r.SessionIdle(session_id="a", ts=100)) is None and shell.held
    clock[0] = 101.0
    sig = shell.tick()
    assert sig is not None and (sig.active, sig.to_idle, sig.to_active) == (0, 1, 0) and not shell.held


def test_next_index_follows_the_highest_worker_of_the_pool():
    assert next_index("p", []) == 0
    assert next_index("p", ["p-0", "p-7", "q-9", "p-x", "pp-12"]) == 8


def test_dispatch_tries_work_again_while_the_store_is_away_then_reports_it(monkeypatch):
    """An event whose handling meets the store away (InfraError) is handled again after a
    pause, as long as it is away (given up on after 8 s, an outside run's Redis, down 20 s,
    had dispatch refuse closes, opens and inputs); work that fails otherwise (a bug) goes to
    ``failed`` at once (an input is refused, not lost)."""
    from processors.agents import dispatch as agent
    from processors.agents import input_budgets
    from schemas.errors import InfraError

    monkeypatch.setattr(input_budgets, "STORE_RETRY_S", (0.0, 0.0))
    monkeypatch.setattr(input_budgets, "RETRY_MAX_S", 0.0)
    shell = agent.DispatchShell(store=None, publisher=None)  # type: ignore[arg-type]
    tries: list[str] = []
    failures: list[Exception] = []

    def work(key: str, fail_first: int) -> Callable[[], Any]:
        async def run() -> None:
            tries.append(key)
            if tries.count(key) <= fail_first:
                raise InfraError("generation store: Redis unreachable")
        return run

    async def failed(exc: Exception) -> None:
        failures.append(exc)

    async def bug() -> None:
        tries.append("c")
        raise RuntimeError("a bug")

    async def go() -> None:
        await shell.submit("a", work("a", 2), failed)  # fails twice, then is handled
        await shell.submit("b", work("b", 40), failed)  # away for 40 tries: handled on the 41st
        await shell.submit("c", bug, failed)  # not the store: reported at once
        await asyncio.gather(*list(shell.chains.tasks.values()))

    asyncio.run(go())
    assert tries.count("a") == 3 and tries.count("b") == 41 and tries.count("c") == 1
    assert [str(e) for e in failures] == ["a bug"]
