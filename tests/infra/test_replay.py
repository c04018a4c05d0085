"""Recovery by replay: processors killed mid-run; the state rebuilt from the topics is whole."""

from __future__ import annotations

import asyncio

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
