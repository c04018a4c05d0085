"""The control-plane benchmark end to end on the real broker, Redis, dispatch and workers.

Checks completeness only (every session claimed, every input accepted); no timing asserts.
"""

from __future__ import annotations

import pytest

from infra.bench.control_plane import percentiles, run
from streams.config import Settings

pytestmark = pytest.mark.integration


def test_percentiles_nearest_rank():
    assert percentiles([]) == {"p50": 0.0, "p99": 0.0}
    assert percentiles([float(i) for i in range(1, 101)]) == {"p50": 50.0, "p99": 99.0}


def test_control_plane_bench_claims_every_session_and_accepts_every_input(
        kafka_bootstrap, redis_url, namespace, tmp_path):
    settings = Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(
        kafka_bootstrap, redis_url)
    result = run(settings, sessions=30, workers=2, inputs_per_session=2, log_dir=tmp_path / "logs",
                 rate=200.0, timeout_s=60.0, warmup_s=0.5)
    assert result["complete"], result
    warm = result["warmup"]  # opened and fed before measuring, reported on their own
    assert warm["sessions"] == 100 and warm["create_live_ms"]["p50"] > 0 and warm["push_text_ms"]["p50"] > 0
    assert result["sessions"] == 30 and result["claimed"] == 30
    assert result["inputs_pushed"] == 60 and result["inputs_accepted"] == 60
    for key in ("create_live_ms", "push_text_ms"):
        assert set(result[key]) == {"p50", "p99"} and result[key]["p99"] >= result[key]["p50"] > 0
    assert result["events_per_s"] > 0 and result["max_consumer_lag"] >= 0
    assert {"bench", "dispatch", "workers"} <= set(result["cpu_pct"])  # the processes it started
    assert all(v >= 0 for v in result["cpu_pct"].values())
    for path in ("create_live", "push_text"):
        assert set(result["breakdown_ms"][path]) == {"to_dispatch", "to_owner"}
