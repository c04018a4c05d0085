"""``chunkserve handoff``: what the store must show before an operator's move is sent.

The move itself runs in the end-to-end flows (``infra.flow`` hands session 0 over with
``hand_off`` and checks the target claimed it, chunk indices unbroken)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from infra.handoff import handoff_refusal
from schemas.records import Generation
from streams.generations import SessionView, StoreState, WorkerLoad

GEN = Generation("w0", 3)
LIVE = SessionView(GEN, StoreState.ACTIVE, True, 10, 4, None)
LOADS = {"w0": WorkerLoad(2, 4, False), "w1": WorkerLoad(1, 4, False), "w2": WorkerLoad(4, 4, False),
         "w3": WorkerLoad(0, 4, True), "w4": WorkerLoad(0, 4, False, True)}


def test_a_claimed_active_session_moves_to_a_registered_worker_with_room():
    assert handoff_refusal(LIVE, LOADS, "s", "w1") is None


@pytest.mark.parametrize("view,target,why", [
    (None, "w1", "session s is not known to the store"),
    (replace(LIVE, state=StoreState.SUSPENDED), "w1", "session s is suspended: only an active session moves"),
    (replace(LIVE, state=StoreState.CLOSED), "w1", "session s is closed"),
    (replace(LIVE, close_requested=True), "w1", "session s is closing"),
    (replace(LIVE, stranded_epoch=3), "w1", "lost its owner w0: the recovery places it"),
    (replace(LIVE, claimed=False), "w1", "not claimed yet by w0@3"),
    (LIVE, "w0", "session s is on w0 already"),
    (LIVE, "w9", "worker w9 is not registered (registered: w0, w1, w2, w3, w4)"),
    (LIVE, "w2", "worker w2 is full (4 of 4 slots)"),
    (LIVE, "w3", "worker w3 is draining"),
    (LIVE, "w4", "worker w4 is down"),
])
def test_a_move_the_store_shows_cannot_happen_is_refused_with_the_reason(view, target, why):
    got = handoff_refusal(view, LOADS, "s", target)
    assert got is not None and why in got and "\n" not in got


@pytest.mark.integration
def test_the_command_refuses_an_unknown_session_in_one_line(kafka_bootstrap, redis_url, namespace):
    from tests.infra.test_config_errors import _one_line, _run

    import asyncio
    import time

    from streams.config import Settings
    from streams.topics import ensure_topics

    asyncio.run(ensure_topics(Settings(topic_prefix=f"{namespace}.").with_endpoints(kafka_bootstrap, redis_url)))
    env = {"CHUNKSERVE_KAFKA_BOOTSTRAP": kafka_bootstrap, "CHUNKSERVE_REDIS_URL": redis_url,
           "CHUNKSERVE_TOPIC_PREFIX": f"{namespace}.", "CHUNKSERVE_NAMESPACE": namespace}
    rc, out = _run(["handoff", "nope", "worker-1"], env)
    assert rc == 1 and "handoff refused: session nope is not known to the store" in _one_line(out), out
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as folder:  # --json writes the refusal as the outcome (it wrote nothing)
        rc, out = _run(["handoff", "nope", "worker-1", "--json", f"{folder}/o.json"], env)
        got = json.loads(open(f"{folder}/o.json").read())
    assert rc == 1 and got["moved"] is False and "is not known to the store" in got["refused"], (out, got)
    # on a prefix with no topics: one line at once (it took 41 s and 394 lines of aiokafka's warnings)
    began = time.monotonic()
    rc, out = _run(["handoff", "nope", "worker-1"], {**env, "CHUNKSERVE_TOPIC_PREFIX": f"{namespace}-none."})
    line = _one_line(out)
    assert rc == 2 and f"no topic {namespace}-none.worker-commands on the broker" in line, out
    assert time.monotonic() - began < 30
