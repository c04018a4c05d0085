"""A worker with command keys refuses unsigned, forged and unknown-key commands, and reports
each as CommandRejected; a command signed with the previous key is still taken (rotation)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest

from infra.flow import EventLog
from infra.local import LocalFleet
from schemas.records import Assign, Claimed, CommandRejected, Generation, WorkerUp
from streams.config import Settings
from streams.generations import SyncGenerationStore
from streams.kafka import RecordProducer
from streams.signing import CommandKeys
from streams.topics import ensure_topics

pytestmark = pytest.mark.integration
OLD, NEW, OTHER = "11" * 16, "22" * 16, "33" * 16


def test_worker_refuses_unauthentic_commands(kafka_bootstrap, redis_url, namespace, tmp_path):
    base = Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(
        kafka_bootstrap, redis_url)
    worker_keys = {"CHUNKSERVE_COMMAND_KEYS": f"old:{OLD},new:{NEW}", "CHUNKSERVE_COMMAND_KEY_ID": "new"}
    signer_old = replace(base, command_keys=CommandKeys.from_env({"CHUNKSERVE_COMMAND_KEYS": f"old:{OLD}"}))
    unsigned = replace(base, command_keys=CommandKeys())
    stranger = replace(base, command_keys=CommandKeys.from_env({"CHUNKSERVE_COMMAND_KEYS": f"x:{OTHER}"}))
    forger = replace(base, command_keys=CommandKeys.from_env({"CHUNKSERVE_COMMAND_KEYS": f"new:{OTHER}"}))

    store = SyncGenerationStore.from_url(redis_url, namespace)
    fleet = LocalFleet(base, tmp_path / "logs", extra_env=worker_keys)

    async def run() -> list:
        await ensure_topics(base)
        fleet.start_worker("w-auth", capacity=4, chunk_interval_s=0.5)
        async with RecordProducer(base) as reader_producer:
            log = EventLog(base, reader_producer)
            await log.start()
            await log.until(lambda rs: any(isinstance(r, WorkerUp) for r in rs), 90, "the worker")
            gens = {sid: store.commit(sid, 0, "w-auth") for sid in ("s-unsigned", "s-stranger",
                                                                      "s-forged", "s-rotated")}
            for sid, settings in (("s-unsigned", unsigned), ("s-stranger", stranger),
                                  ("s-forged", forger), ("s-rotated", signer_old)):
                async with RecordProducer(settings) as p:
                    await p.send(Assign(worker_id="w-auth", session_id=sid, generation=gens[sid],
                                        ts=time.time()))
            await log.until(lambda rs: sum(isinstance(r, (CommandRejected, Claimed)) for r in rs) >= 4,
                            60, "the worker's answers")
            # a replay: the exact signed Assign again, once the session has a newer generation
            store.register_worker("w-elsewhere", 4)
            store.commit_migration("s-rotated", gens["s-rotated"], "w-elsewhere")
            async with RecordProducer(signer_old) as p:
                await p.send(Assign(worker_id="w-auth", session_id="s-rotated",
                                    generation=gens["s-rotated"], ts=time.time()))
            await log.until(lambda rs: sum(isinstance(r, CommandRejected) for r in rs) >= 4, 60,
                            "the replay's refusal")
            await log.stop()
            return log.records

    try:
        records = asyncio.run(run())
    finally:
        fleet.stop_all()
        store.client.close()
    rejected = {r.session_id: r.reason for r in records if isinstance(r, CommandRejected)}
    claimed = {r.session_id for r in records if isinstance(r, Claimed)}
    assert rejected == {"s-unsigned": "unsigned", "s-stranger": "unknown_key", "s-forged": "forged",
                        "s-rotated": "stale_epoch"}
    assert claimed == {"s-rotated"}
    assert Generation("w-auth", 1) == store_generation_of(redis_url, namespace, "s-forged")


def test_a_worker_handed_an_ed25519_key_holds_its_public_half_and_verifies_with_it(
        kafka_bootstrap, redis_url, namespace, tmp_path):
    """Given the private key of an Ed25519 pair, the fleet hands a worker only the public half
    (a worker taken over holds nothing that signs a command); with it the worker takes an
    Assign the private key signed and refuses one signed by another key under the same id."""
    import psutil

    from streams.signing import new_key

    private, public = new_key("e1")
    intruder, _ = new_key("e1")
    base = Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(kafka_bootstrap, redis_url)
    signer = replace(base, command_keys=CommandKeys.from_env({"CHUNKSERVE_COMMAND_KEYS": private}))
    forger = replace(base, command_keys=CommandKeys.from_env({"CHUNKSERVE_COMMAND_KEYS": intruder}))
    store = SyncGenerationStore.from_url(redis_url, namespace)
    fleet = LocalFleet(base, tmp_path / "logs", extra_env={"CHUNKSERVE_COMMAND_KEYS": private})

    async def run() -> tuple[list, str]:
        await ensure_topics(base)
        fleet.start_worker("w-ed", capacity=4, chunk_interval_s=0.5)
        held = psutil.Process(fleet.procs["w-ed"].pid).environ()["CHUNKSERVE_COMMAND_KEYS"]
        async with RecordProducer(base) as reader_producer:
            log = EventLog(base, reader_producer)
            await log.start()
            await log.until(lambda rs: any(isinstance(r, WorkerUp) for r in rs), 90, "the worker")
            for sid, settings in (("s-signed", signer), ("s-intruder", forger)):
                gen = store.commit(sid, 0, "w-ed")
                async with RecordProducer(settings) as p:
                    await p.send(Assign(worker_id="w-ed", session_id=sid, generation=gen, ts=time.time()))
            await log.until(lambda rs: sum(isinstance(r, (CommandRejected, Claimed)) for r in rs) >= 2,
                            60, "the worker's answers")
            await log.stop()
            return log.records, held

    try:
        records, held = asyncio.run(run())
    finally:
        fleet.stop_all()
        store.client.close()
    assert held == public and private.split(":")[-1] not in held
    assert {r.session_id: r.reason for r in records if isinstance(r, CommandRejected)} == {"s-intruder": "forged"}
    assert {r.session_id for r in records if isinstance(r, Claimed)} == {"s-signed"}


def store_generation_of(url: str, ns: str, sid: str) -> Generation | None:
    store = SyncGenerationStore.from_url(url, ns)
    try:
        return store.current(sid)
    finally:
        store.client.close()


def test_control_folds_no_unauthentic_scaling_command(kafka_bootstrap, redis_url, namespace):
    """The control processor's view takes only signed scaling commands, as the provisioner
    does (an outside run's unsigned Drain took a worker out of its admission plans, an unsigned
    ScaleOut held its scale-out for 120 s, an unsigned PolicyState stopped its scaling)."""
    from processors.agents.control import ControlShell, _fold_log
    from schemas.records import Drain

    keys = CommandKeys.from_env({"CHUNKSERVE_COMMAND_KEYS": f"new:{NEW}"})
    signed = replace(Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(
        kafka_bootstrap, redis_url), command_keys=keys)
    shell = ControlShell()

    async def run() -> None:
        catalogue = await ensure_topics(signed)
        for settings, worker in ((replace(signed, command_keys=CommandKeys()), "w-unsigned"),
                                 (replace(signed, command_keys=CommandKeys.from_env(
                                     {"CHUNKSERVE_COMMAND_KEYS": f"new:{OTHER}"})), "w-forged"),
                                 (signed, "w-signed")):
            async with RecordProducer(settings) as p:
                await p.send(Drain(pool="default", worker_id=worker, ts=time.time()))
        caught_up = {"done": False}
        fold = asyncio.create_task(_fold_log(signed, catalogue, shell, caught_up))
        deadline = time.monotonic() + 60
        while not caught_up["done"] and time.monotonic() < deadline and not fold.done():
            await asyncio.sleep(0.2)
        fold.cancel()
        await asyncio.gather(fold, return_exceptions=True)
        assert caught_up["done"]

    asyncio.run(run())
    assert set(shell.view.workers) == {"w-signed"}, shell.view.workers
