"""The protocol study: generations never release stale or twice; the baselines do."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from infra.ownership_check import PROTOCOLS, _rng, make_schedule, run, simulate
from infra.ownership_replica import PlacementScripts, ReplicatedScripts
from schemas.errors import InfraError
from streams.generations import SyncGenerationStore


@pytest.mark.integration
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


@pytest.mark.integration
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


def test_replica_model_loses_what_was_not_acknowledged() -> None:
    late = {"writes": [(2, False)], "deaths": [(3, False, False)], "rejoin": [1]}
    for ack, kept in ((False, None), (True, "w1")):
        repl = ReplicatedScripts(PlacementScripts(), late, ack)
        repl.tick(0)
        repl.tick(1)
        repl.call("commit", [], ["s", "w1"])  # reaches the replica at tick 3: too late unless waited for
        repl.tick(2)
        repl.tick(3)
        assert repl.failovers == 1 and repl.call("session", [], [])[0] == kept
    for reached, kept in ((True, "w1"), (False, None)):  # the master dies inside the write
        repl = ReplicatedScripts(PlacementScripts(), {"writes": [(0, False)], "deaths": [(1, True, reached)],
                                                      "rejoin": [1]}, True)
        repl.tick(0)
        repl.tick(1)
        with pytest.raises(InfraError):
            repl.call("commit", [], ["s", "w1"])
        assert repl.call("session", [], [])[0] == kept and repl.unacked == 1


def test_replica_study_needs_the_acknowledgement() -> None:
    without = run(2000, ["worker-id", "generation"], seed=5, store="replica", replica_ack=False, processes=1)
    acked = run(2000, ["worker-id", "generation"], seed=5, store="replica", replica_ack=True, processes=1)
    assert without["store"] == {"model": "replica", "replica_ack": False}
    gen = without["protocols"]["generation"]
    assert gen["dual_owner_runs"] > 0 and gen["stale_release_runs"] > 0 and "MASTER DIES" in gen["example"]
    assert gen["failovers"] >= gen["runs"] and gen["lost_writes"] > 0 and gen["unacknowledged_writes"] == 0
    gen = acked["protocols"]["generation"]
    assert gen["dual_owner_runs"] == gen["stale_release_runs"] == 0 and gen["example"] is None
    assert gen["failovers"] >= gen["runs"] and gen["lost_writes"] > 0 and gen["unacknowledged_writes"] > 0
    worker_id = acked["protocols"]["worker-id"]
    assert worker_id["dual_owner_runs"] + worker_id["stale_release_runs"] > 0
