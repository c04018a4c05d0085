"""Recovery by replay: processors killed mid-run; the state rebuilt from the topics is whole."""

from __future__ import annotations

import asyncio
import logging

import pytest

from infra.flow import run_flow
from infra.replay import replay
from streams.config import Settings

pytestmark = pytest.mark.integration


def test_processor_restart_and_replayed_view(kafka_bootstrap, redis_url, namespace, tmp_path):
    settings = Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(
        kafka_bootstrap, redis_url)
    summary = asyncio.run(run_flow(settings, tmp_path / "logs", sessions=3, chunks=4, workers=2,
                                   inputs=1, chunk_interval_s=0.02, timeout_s=90,
                                   restart_dispatch=True))
    assert summary.problems == []
    for sid in summary.chunk_indices:  # the restarted dispatch routed and closed every session
        assert summary.inputs_accepted[sid] == [1, 2]
        assert summary.released[sid] == "closed"

    rebuilt = asyncio.run(replay(settings, "control"))
    assert set(rebuilt["sessions"]) == set(summary.chunk_indices)  # none lost, none duplicated
    assert rebuilt["session_states"] == {"terminated": 3}
    assert all(s["owner"] is None for s in rebuilt["sessions"].values())  # released on close
    assert set(rebuilt["workers"]) == {"worker-0", "worker-1"}

    detector = asyncio.run(replay(settings, "detector"))
    assert detector["records"] == 6 and detector["signal"]["active"] == 0  # 3 opens, 3 closes

    again = asyncio.run(replay(settings, "control"))  # replay is deterministic
    assert again["sessions"] == rebuilt["sessions"]

    # an operator's view of one session (`chunkserve story`): opened, claimed, closed, released
    from infra.replay import session_log

    sid = sorted(summary.chunk_indices)[0]
    story = asyncio.run(session_log(settings, sid))
    assert story["chunks"] == len(summary.chunk_indices[sid]) and story["inputs_accepted"] == 2
    tags = " ".join(story["story"])
    assert "session.opened" in tags and "worker.claimed" in tags and "session.closed" in tags, story["story"]
    assert story["story"][-1].startswith("last chunk +")
    # and as data (--json): the same entries, each a time, an owner, a type and a detail
    whats = [e["what"] for e in story["entries"]]
    assert whats[0] == "session.opened" and "worker.claimed" in whats and "session.closed" in whats
    assert all(set(e) == {"t", "who", "what", "detail", "topic", "partition", "offset"} for e in story["entries"])
    assert story["left_out"] == 0
    # each where it sits: a reader of the topic meets it there (an outside run's story put a
    # Terminate before the input its worker read first, by their times alone)
    at = {(e["topic"], e["partition"], e["offset"]) for e in story["entries"]}
    assert len(at) == len(story["entries"]) and all(t.startswith(settings.topic_prefix) for t, _, _ in at), at
    placed = asyncio.run(_by_place(settings))
    for e in story["entries"]:
        got = placed[(e["topic"], e["partition"], e["offset"])]
        assert got.TAG == e["what"] and getattr(got, "session_id", sid) == sid, (e, got)
    assert story["last_chunk_t"] is not None and story["story"][-1] == f"last chunk +{story['last_chunk_t']:.1f}"
    cut = asyncio.run(session_log(settings, sid, last=2))
    assert cut["entries"] == story["entries"][-2:] and cut["left_out"] == len(story["entries"]) - 2
    # from the command line: the story as text alone, the rebuilt state as JSON alone
    import json
    import os
    import subprocess
    import sys

    from streams.config_file import child_env

    env = child_env(settings, base={k: v for k, v in os.environ.items() if not k.startswith("CHUNKSERVE_")})
    told = subprocess.run([sys.executable, "-m", "infra", "story", sid], env=env, capture_output=True, text=True,
                          timeout=120)
    lines = told.stdout.strip().splitlines()
    assert told.returncode == 0 and all(ln.startswith(f"{sid} ") for ln in lines[:-1]), told.stdout + told.stderr
    assert lines[-1].endswith("inputs accepted") and '"story"' not in told.stdout  # no JSON after it (it was both)
    state = subprocess.run([sys.executable, "-m", "infra", "replay", "control"], env=env, capture_output=True,
                           text=True, timeout=120)
    assert state.returncode == 0 and json.loads(state.stdout)["session_states"] == {"terminated": 3}, state.stderr

    from infra.replay import read_log
    from schemas.records import WorkerUp
    from schemas.topics import WORKER_EVENTS

    log = asyncio.run(read_log(settings, (WORKER_EVENTS,)))
    ups = [x for x in log.records if isinstance(x, WorkerUp)]
    assert ups and all(u.pid > 0 for u in ups)  # each worker says its process id (it said 0)


async def _by_place(settings: Settings) -> dict:
    """Every record of the story's topics by (topic, partition, offset), read on its own."""
    from infra.replay import STORY_TOPICS
    from streams.kafka import RecordConsumer

    consumer = RecordConsumer(settings, list(STORY_TOPICS), None, name="test-places")
    await consumer.start(subscribe=False)
    try:
        ends = await consumer.assign(dict.fromkeys(STORY_TOPICS), 0, deployed=True)
        return {(d.topic, d.partition, d.offset): d.record async for d in consumer.read_to(ends)}
    finally:
        await consumer.stop()


def test_replay_reads_to_the_true_end_of_multi_record_batches_and_publishes_nothing(
        kafka_bootstrap, redis_url, namespace, caplog):
    from aiokafka import TopicPartition

    from schemas.records import SessionClosed, SessionOpened
    from schemas.topics import DEAD_LETTERS, SESSION_EVENTS
    from streams.kafka import RecordConsumer, RecordProducer
    from streams.topics import ensure_topics

    settings = Settings(topic_prefix=f"{namespace}.", namespace=namespace,
                        partitions={SESSION_EVENTS: 2}).with_endpoints(kafka_bootstrap, redis_url)

    async def publish() -> None:
        await ensure_topics(settings)
        # a long linger: each partition's records go out as a few batches of many records
        async with RecordProducer(settings, linger_ms=200) as producer:
            await producer.send_many([SessionOpened(session_id=f"s{i}", ts=1.0 + i) for i in range(20)])
            await producer.send_many([SessionClosed(session_id=f"s{i}", ts=30.0 + i) for i in range(20)])
            await producer.send_raw(SESSION_EVENTS, b"\xc1 not msgpack", key=b"s0")

    async def dead_letters_end() -> int:
        reader = RecordConsumer(settings, [DEAD_LETTERS], None, name="probe")
        await reader.start(subscribe=False)
        try:
            tp = TopicPartition(reader.catalogue.name(DEAD_LETTERS), 0)
            return (await reader.raw.end_offsets([tp]))[tp]
        finally:
            await reader.stop()

    asyncio.run(publish())
    before = asyncio.run(dead_letters_end())
    for _ in range(2):
        rebuilt = asyncio.run(replay(settings, "control"))
        assert rebuilt["records"] == 40 and rebuilt["undecodable"] == 1
        assert rebuilt["session_states"] == {"terminated": 20}  # every close seen, none short
        detector = asyncio.run(replay(settings, "detector"))
        assert detector["records"] == 40 and detector["signal"]["active"] == 0
    assert asyncio.run(dead_letters_end()) == before  # replay published nothing
    # the bad record is counted, not warned of at each read (`story` printed a line per bad record every call)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "undecodable" in r.getMessage()]


def test_a_session_known_only_from_owner_records_reads_unseen():
    """`replay --offset N` past a session's events knows it from its claims only: its state
    reads "unseen", not null, and the summary counts it under that name (it printed a
    Python dict with a 'None' key; found by an outside run)."""
    from infra.replay import cluster_summary, cluster_view
    from schemas import records as r

    gen = r.Generation(worker_id="w-0", epoch=1)
    view = cluster_view([r.SessionOpened(session_id="a", ts=1.0),
                         r.Claimed(worker_id="w-0", session_id="b", generation=gen, ts=2.0)])
    summary = cluster_summary(view)
    assert summary["sessions"]["b"]["state"] == "unseen" and summary["session_states"] == {"execution": 1, "unseen": 1}


def test_a_worker_heard_from_after_its_death_is_up_and_ended_sessions_are_nobodys():
    """`replay dispatch` showed a worker resumed after a SIGSTOP (declared dead, then beating
    again and serving) as down, and counted closed sessions on a worker long gone (an outside
    run)."""
    from infra.replay import cluster_summary, cluster_view
    from schemas import records as r

    gen = r.Generation(worker_id="w-1", epoch=1)
    view = cluster_view([
        r.WorkerUp(worker_id="w-1", capacity=4, ts=1.0),
        r.SessionOpened(session_id="a", ts=1.5), r.Claimed(worker_id="w-1", session_id="a", generation=gen, ts=2.0),
        r.SessionOpened(session_id="b", ts=2.5),
        r.Claimed(worker_id="w-1", session_id="b", generation=r.Generation(worker_id="w-1", epoch=1), ts=3.0),
        r.SessionClosed(session_id="b", ts=4.0),
        r.WorkerDown(worker_id="w-1", ts=10.0, reason="heartbeat timeout"),
        r.Heartbeat(worker_id="w-1", ts=12.0, sessions=1, executing=1, capacity=4)])
    w = cluster_summary(view)["workers"]["w-1"]
    assert w["down"] is False and w["sessions"] == 1


def test_replay_folds_the_same_order_however_the_fetches_came():
    """Two runs of `replay control --offset 1` on one log disagreed (an outside run): the idle
    of a session opened before the offset came before or after its owner's claim, whichever
    topic's fetch came first, and the session read `unseen` or `suspended`. The partitions are
    merged by their Kafka timestamps, each kept in its own order."""
    import itertools

    from infra.replay import cluster_summary, cluster_view, in_time_order
    from schemas import records as r
    from streams.kafka import Delivered

    gen = r.Generation(worker_id="w-0", epoch=1)
    claimed = Delivered(r.Claimed(worker_id="w-0", session_id="s", generation=gen, ts=2.0), "worker-events", 0, 7,
                        b"w-0", timestamp_ms=2000)
    idle = Delivered(r.SessionIdle(session_id="s", ts=3.0), "session-events", 3, 1, b"s", timestamp_ms=3000)
    other = Delivered(r.SessionOpened(session_id="t", ts=1.0), "session-events", 3, 2, b"t", timestamp_ms=2500)
    states = set()
    for fetched in itertools.permutations([claimed, idle, other]):
        ordered = in_time_order(fetched)
        assert [d.offset for d in ordered if d.partition == 3] == [1, 2]  # a partition keeps its order
        states.add(cluster_summary(cluster_view([d.record for d in ordered]))["sessions"]["s"]["state"])
    assert states == {"suspended"}


def test_a_story_tells_the_letters_keyed_otherwise_and_its_owners_death():
    """An operator missed two things in a session's story: its inputs refused for coming keyed
    by another id (the key is not the session's, the record inside is), and its owner
    declared dead before the next claim."""
    from infra.replay import session_story
    from schemas.codec import encode
    from schemas.records import Claimed, DeadLetter, InputPushed, SessionOpened, WorkerDown
    from streams.generations import Generation

    wrong_key = DeadLetter(source_topic="session-inputs", partition=0, offset=3, reason="refused: key b'x'",
                           consumer="dispatch", ts=2.0, raw=encode(InputPushed(session_id="s1", seq=1, kind="prompt",
                                                                                payload="p", ts=1.0)), key=b"x")
    someone_else = DeadLetter(source_topic="session-inputs", partition=0, offset=4, reason="refused: key b's2'",
                              consumer="dispatch", ts=2.1, raw=encode(InputPushed(session_id="s2", seq=1, kind="prompt",
                                                                                   payload="p", ts=1.0)), key=b"s2")
    garbage = DeadLetter(source_topic="session-inputs", partition=0, offset=5, reason="schema", consumer="dispatch",
                         ts=2.2, raw=b"\xc1not msgpack", key=None)
    records = [SessionOpened(session_id="s1", ts=0.5), Claimed(worker_id="w1", session_id="s1",
                                                               generation=Generation("w1", 1), ts=0.7),
               wrong_key, someone_else, garbage, WorkerDown(worker_id="w1", ts=3.0, reason="missed heartbeats"),
               WorkerDown(worker_id="w9", ts=3.1, reason="not an owner")]
    story = session_story(records, "s1", 0.5)
    assert story == ["+0.0 - session.opened", "+0.2 w1#1 worker.claimed", "+1.5 DeadLetter refused: key b'x'",
                     "+2.5 w1 worker.down missed heartbeats", "no chunk"]


@pytest.mark.integration
def test_replay_from_an_offset_past_every_partitions_end_says_so(kafka_bootstrap, redis_url, namespace):
    """It printed `0 records at or after offset 999999999; sessions by state: none`, exit 0,
    as an empty cluster reads (an outside run)."""
    from tests.infra.test_config_errors import _one_line, _run
    from schemas.records import SessionOpened
    from streams.kafka import RecordProducer
    from streams.topics import ensure_topics

    settings = Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(kafka_bootstrap, redis_url)

    async def one() -> None:
        await ensure_topics(settings)
        async with RecordProducer(settings) as producer:
            await producer.send(SessionOpened(session_id="s-1", ts=1.0), wait=True)

    asyncio.run(one())
    env = {"CHUNKSERVE_KAFKA_BOOTSTRAP": kafka_bootstrap, "CHUNKSERVE_REDIS_URL": redis_url,
           "CHUNKSERVE_TOPIC_PREFIX": f"{namespace}.", "CHUNKSERVE_NAMESPACE": namespace}
    rc, out = _run(["replay", "control", "--offset", "999999999"], env)
    assert rc == 2 and "--offset: 999999999 is past the end of every partition of" in _one_line(out), out
    assert "(the longest holds 1 records)" in out
    rc, out = _run(["replay", "control", "--offset", "0"], env)
    assert rc == 0 and "1 records" in out, out
