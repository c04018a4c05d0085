"""The chaos run, short: pause, crash, dead dispatcher, duplicated and delayed commands."""

from __future__ import annotations

import asyncio

import pytest

from infra.chaos import AUDIT_KEYS, ChaosConfig, audit_chunks, audit_inputs, run_chaos
from schemas.records import ChunkDone, Generation, InputAccepted
from streams.config import Settings

pytestmark = pytest.mark.integration


def _chunk(sid: str, epoch: int, index: int) -> ChunkDone:
    return ChunkDone(worker_id=f"w{epoch}", session_id=sid, generation=Generation(f"w{epoch}", epoch),
                     chunk_index=index, ts=float(index))


def test_the_audit_finds_what_it_claims_to_find():
    clean = [_chunk("a", 1, 0), _chunk("a", 1, 1), _chunk("a", 2, 2)]
    assert audit_chunks(clean) == {"dual_owner": 0, "stale_releases": 0}
    dual = clean + [_chunk("a", 2, 1)]
    assert audit_chunks(dual)["dual_owner"] == 1
    stale = clean + [_chunk("a", 1, 3)]  # epoch 1 released past epoch 2's first chunk
    assert audit_chunks(stale)["stale_releases"] == 1
    acks = [InputAccepted(worker_id="w", session_id="a", generation=Generation("w", 1), seq=s, ts=0)
            for s in (1, 3, 3, 2)]
    assert audit_inputs({"a": 4}, acks) == {"inputs_lost": 1, "inputs_duplicated": 1,
                                             "inputs_out_of_order": 1}


def test_chaos_run_audits_clean(kafka_bootstrap, redis_url, namespace, tmp_path):
    settings = Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(
        kafka_bootstrap, redis_url)
    cfg = ChaosConfig(sessions=6, duration_s=20.0, workers=3, capacity=6)
    result = asyncio.run(run_chaos(settings, cfg, tmp_path / "logs"))
    assert set(result["faults"]) >= {"paused_worker", "killed_worker", "killed_dispatch"}
    assert result["chunks"] > 100
    assert result["recovered_sessions"] >= 1   # the paused and the killed workers' sessions moved
    assert result["fenced_releases"] >= 1      # the resumed stale runtime learned it lost them
    for key in AUDIT_KEYS:
        assert result[key] == 0, (key, result)
    assert set(result["broker"]) == {"kind", "version", "brokers"}
    assert result["broker_faults"] == {"leader_kills": 0, "full_restarts": 0}
