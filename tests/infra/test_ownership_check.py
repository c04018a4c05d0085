"""The protocol study: generations never release stale or twice; the baselines do."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from infra.ownership_check import PROTOCOLS, _rng, make_schedule, run, simulate
from streams.generations import SyncGenerationStore

pytestmark = pytest.mark.integration


def test_study_separates_the_protocols(redis_url: str) -> None:
    out = run(2000, seed=7, redis_url=redis_url, redis_sample=40, processes=1)
    assert set(out["protocols"]) == set(PROTOCOLS) and out["wall_s"] > 0
    gen = out["protocols"]["generation"]
    assert gen["runs"] == 500 + 40
    assert gen["dual_owner_runs"] == gen["stale_release_runs"] == 0 and gen["example"] is None
    for name in ("assignment", "claim-only", "worker-id"):
        p = out["protocols"][name]
        assert p["runs"] == 500
        assert p["dual_owner_runs"] + p["stale_release_runs"] > 0, name
        assert "STALE" in p["example"] or "DUAL OWNER" in p["example"]


def test_redis_and_memory_stores_run_identically(redis_client: Any, redis_url: str) -> None:
    ns = f"oc{uuid.uuid4().hex[:8]}"
    try:
        for i in range(15):
            sched = make_schedule(_rng(3, i))
            store = SyncGenerationStore(redis_client, f"{ns}-{i}")
            on_redis = simulate("generation", sched, store, trace=True).trace
            assert on_redis == simulate("generation", sched, trace=True).trace
    finally:
        keys = list(redis_client.scan_iter(match=f"{{{ns}-*"))
        if keys:
            redis_client.delete(*keys)
