"""Hostile input, short: decoders raise SchemaError only; a consumer loop dead-letters every
bad record and processes every good one; trace files fail with their line, never a traceback."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra.bench.fuzz import fuzz_consumer, fuzz_decoders
from infra.sim.trace import parse_trace
from schemas.errors import TraceError
from streams.config import Settings


def test_decoders_never_crash_or_hang():
    result = fuzz_decoders(60_000, seed=3)
    assert result["crashes"] == 0, result["crash_examples"]
    assert result["hangs"] == 0
    assert result["rejected"] + result["accepted"] == 60_000 and result["rejected"] > 50_000


@pytest.mark.integration
def test_consumer_loop_dead_letters_every_bad_record(kafka_bootstrap, redis_url, namespace):
    cfg = Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(
        kafka_bootstrap, redis_url)
    out = asyncio.run(fuzz_consumer(cfg, 300, seed=5))
    assert out["consumer_dead_lettered"] == out["consumer_expected_dead"] > 0
    assert out["consumer_processed"] + out["consumer_dead_lettered"] == 300


GOOD = "t_s,session_id,event,state_mb\n0,a,open,10\n1,a,idle\n2,a,active\n3,a,close\n"


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=200), st.randoms(use_true_random=False).map(
    lambda r: "".join(c if r.random() > 0.1 else r.choice(",\n-x9.") for c in GOOD))))
def test_trace_files_fail_with_a_line_never_a_traceback(text):
    rows = [line.split(",") for line in text.split("\n") if line]
    try:
        parse_trace(rows, "fuzz.csv")
    except TraceError as exc:
        assert exc.path == "fuzz.csv" and exc.line >= 1


@pytest.mark.integration
def test_processors_dead_letter_every_bad_record_and_keep_running(kafka_bootstrap, redis_url, namespace,
                                                                  tmp_path):
    from infra.bench.fuzz import fuzz_processors

    cfg = Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(
        kafka_bootstrap, redis_url)
    out = asyncio.run(fuzz_processors(cfg, 240, tmp_path, seed=11))
    assert out["processor_expected_dead"]["dispatch"] > 100
    assert out["processor_dead_lettered"] == out["processor_expected_dead"]
    assert all(out["processors_alive"].values()), out
    assert not any(out["processor_tracebacks"].values()), out
