"""``worker-events`` bound to the worker that wrote them: with CHUNKSERVE_EVENT_KEYS, a
worker's events are signed with its own key (derived from the masters, handed to it by the
fleet), and dispatch acts on none that its worker did not sign. An outside run's worker
principal sent a ``WorkerDown`` for a healthy worker, whose session was taken from it."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import pytest

from infra.flow import EventLog
from infra.local import LocalFleet
from infra.replay import replay, session_log
from schemas.codec import TYPE_HEADER, encode
from schemas.records import Assign, Claimed, DeadLetter, Frozen, SessionOpened, WorkerDown, WorkerUp
from schemas.topics import DEAD_LETTERS, WORKER_COMMANDS, WORKER_EVENTS
from streams.config import Settings
from streams.generations import SyncGenerationStore
from streams.kafka import RecordProducer
from streams.signing import EVENT_KEYS_ENV, EVENT_REFUSALS, WORKER_EVENT_KEY_ENV, EventKeys
from streams.topics import ensure_topics

pytestmark = pytest.mark.integration
MASTER = "ab" * 32


def test_dispatch_acts_on_no_worker_event_its_worker_did_not_sign(kafka_bootstrap, redis_url, namespace, tmp_path):
    base = Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(kafka_bootstrap, redis_url)
    masters = EventKeys.from_env({EVENT_KEYS_ENV: f"k1:{MASTER}"})
    signed = replace(base, event_keys=masters)  # the test reads as dispatch does
    fleet = LocalFleet(base, tmp_path / "logs", extra_env={EVENT_KEYS_ENV: f"k1:{MASTER}"})
    store = SyncGenerationStore.from_url(redis_url, namespace)

    def as_worker(worker_id: str) -> Settings:  # a worker taken over: it holds its own key only
        return replace(base, event_keys=EventKeys.from_env({WORKER_EVENT_KEY_ENV: masters.for_worker(worker_id)}))

    async def run() -> tuple[str, list[str], bool, bool, Any, Any, Any, bool]:
        await ensure_topics(base)
        fleet.start_processor("dispatch")
        fleet.start_worker("w-a", capacity=2)
        fleet.start_worker("w-b", capacity=2)
        async with RecordProducer(base) as producer, \
                EventLog(signed, producer, topics=(DEAD_LETTERS, WORKER_COMMANDS, WORKER_EVENTS)) as log:
            await log.until(lambda rs: {x.worker_id for x in rs if isinstance(x, WorkerUp)} == {"w-a", "w-b"},
                            90, "both workers up")
            await producer.send(SessionOpened(session_id="s1", ts=time.time()))
            await log.until(lambda rs: any(isinstance(x, Claimed) and x.session_id == "s1" for x in rs), 60,
                            "s1 claimed")
            owner = next(x.worker_id for x in log.records if isinstance(x, Assign) and x.session_id == "s1")
            gen = store.session("s1").generation
            other = "w-b" if owner == "w-a" else "w-a"
            down = WorkerDown(worker_id=owner, ts=time.time(), reason="forged")
            async with RecordProducer(as_worker(other)) as p:  # signed with the other worker's key
                await p.send(down)
            async with RecordProducer(replace(base, event_keys=EventKeys())) as p:  # no signature
                await p.send(down)
            # keyed by the attacker's own id and signed with its own key, but speaking for the
            # owner: a WorkerDown, and a Frozen of the owner's session with the attacker as target
            frozen = Frozen(worker_id=other, session_id="s1", generation=gen, target_worker=other, ts=time.time())
            async with RecordProducer(as_worker(other)) as p:
                for rec in (down, frozen):
                    data = encode(rec)
                    headers = [(TYPE_HEADER, rec.TAG.encode()),
                               *p.settings.event_keys.sign(WORKER_EVENTS, other.encode(), data)]
                    await p._send(p.catalogue.name(WORKER_EVENTS), data, other.encode(), headers, True)
            await log.until(lambda rs: sum(isinstance(x, DeadLetter) for x in rs) >= 4, 60, "four dead letters")
            reasons = [x.reason for x in log.records if isinstance(x, DeadLetter)]
            await asyncio.sleep(2.0)  # a WorkerDown acted on marks the worker down at once
            kept = not store.load_view()[owner].down and store.session("s1").generation == gen
            own = replace(down, reason="its own", ts=time.time())
            async with RecordProducer(as_worker(owner)) as p:  # its own: acted on (the session is
                await p.send(own)  # recovered: a new generation)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and store.session("s1").generation.epoch == gen.epoch:
                await asyncio.sleep(0.2)
            # its next heartbeat marks it up; that WorkerDown written again (the same bytes and
            # tag: a copy, which verifies) is older than the heartbeat read before it
            while time.monotonic() < deadline and store.load_view()[owner].down:
                await asyncio.sleep(0.2)
            await producer.send(SessionOpened(session_id="s2", ts=time.time()))  # to the least loaded: the owner
            await log.until(lambda rs: any(isinstance(x, Claimed) and x.session_id == "s2" for x in rs), 60,
                            "s2 claimed")
            gen2 = store.session("s2").generation
            async with RecordProducer(as_worker(owner)) as p:
                await p.send(own)
            await asyncio.sleep(3.0)  # a WorkerDown acted on strands s2 at once, and its recovery follows
            copied_down = gen2.worker_id != owner or store.session("s2").generation != gen2
            # an operator's replay and story, holding the masters as the fleet does: what the
            # fleet refused is neither folded nor told as done; without them, nothing is checked
            replayed = await replay(signed, "control")
            story = await session_log(signed, "s1")
            unchecked = await replay(base, "control")
            return (owner, reasons, kept, store.session("s1").generation.epoch > gen.epoch,
                    replayed, story, unchecked, copied_down)

    try:
        owner, reasons, kept, taken, replayed, story, unchecked, copied_down = asyncio.run(run())
    finally:
        fleet.stop_all()
    assert kept, "a WorkerDown its worker did not sign took the session from its owner"
    assert sorted(reasons) == sorted([f"refused: {EVENT_REFUSALS[why]}" for why in (
        "forged", "unsigned", "another_worker", "another_worker")]), reasons
    assert taken, f"{owner}'s own WorkerDown was not acted on"
    assert not copied_down, f"a copy of {owner}'s WorkerDown, written after it was up again, took its session"
    assert replayed["refused"] == 4 and unchecked["refused"] == 0, (replayed, unchecked)
    told = [(e["what"], e["detail"]) for e in story["entries"]]
    assert story["refused"] == 4 and told.count(("worker.down", "its own")) >= 1, told
    assert sorted(d for w, d in told if w != "DeadLetter" and d.startswith("refused: ")) == sorted(
        f"refused: {why}" for why in ("forged", "unsigned", "another_worker", "another_worker")), told
    assert ("worker.frozen", "refused: another_worker") in told, told
    # the fleet handed each worker its own key and not the masters
    log = (tmp_path / "logs" / "w-a.log").read_text(errors="replace")
    assert "holds CHUNKSERVE_EVENT_KEYS" not in log
