"""Billing folded from worker events (the metrics processor's CostTick)."""

from __future__ import annotations

import pytest

from processors.agents.metrics import cost_tick, fold_cost
from processors.latency import load_profiles
from schemas import records as r


def test_a_worker_heard_from_after_its_worker_down_is_billed_again():
    """A worker declared dead that comes back (or whose id another process used and gave up
    with a WorkerDown) heartbeats on: billed again from its first heartbeat after the down,
    as its slots count again; a heartbeat stamped before the down (in flight) reopens nothing.
    It stayed unbilled, and out of the fleet's GPU count, until it restarted."""
    model = load_profiles("reference-cpu")
    spans: dict = {}
    beat = lambda ts: r.Heartbeat(worker_id="a", ts=ts, sessions=1, executing=1, capacity=4)  # noqa: E731
    for rec in [r.WorkerUp(worker_id="a", ts=0, capacity=4), beat(50), r.WorkerDown(worker_id="a", ts=100),
                beat(99)]:
        spans = fold_cost(spans, rec)
    assert spans["a"].up_since is None and cost_tick(spans, 200.0, model).gpu_seconds == pytest.approx(100)
    for rec in [beat(130), beat(160)]:
        spans = fold_cost(spans, rec)
    tick = cost_tick(spans, 170.0, model, stale_s=30)
    assert tick.gpus == 1 and tick.gpu_seconds == pytest.approx(100 + 40)
