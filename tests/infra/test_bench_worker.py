"""`chunkserve bench worker` produces a complete, loadable result (correctness, not speed)."""

from __future__ import annotations

import pytest

from infra.bench.worker import run, write_profile
from processors.latency import load_profiles

pytestmark = pytest.mark.integration


def test_bench_worker_result_is_complete_and_loads_as_a_profile(redis_url, tmp_path):
    result = run(redis_url, sessions=3, migrations=4, repeats=1)
    assert sorted(result["chunk_latency_s"], key=int) == [str(b) for b in range(1, 17)]
    assert all(v > 0 for v in result["chunk_latency_s"].values())
    assert result["state_bytes"] > 1000          # the compact state: context latents and more
    assert result["offload_mb_s"] > 0 and result["restore_mb_s"] > 0
    assert 0 < result["migration_ms"]["median"] <= result["migration_ms"]["p99"]
    path = tmp_path / "measured.json"
    write_profile(result, path)
    profile = load_profiles(path)["cpu"]
    assert profile.capacity == 16


def test_bench_worker_measures_a_model_of_your_own_into_a_profile_the_scheduler_loads(redis_url, tmp_path):
    """`bench worker --model` measures the model a fleet serves, so the scheduler's latency
    profile can be that model's: offload, restore and migration go through its own state."""
    result = run(redis_url, sessions=2, migrations=3, repeats=1, model="examples.models.walk:LatentWalk")
    assert result["model"] == "examples.models.walk:LatentWalk"
    assert result["state_bytes"] < 1000 < run(redis_url, sessions=1, migrations=1, repeats=1)["state_bytes"]
    path = tmp_path / "walk.json"
    write_profile(result, path)
    latency = load_profiles(path)["cpu"]
    assert "examples.models.walk:LatentWalk" in path.read_text() and latency.capacity == 16
