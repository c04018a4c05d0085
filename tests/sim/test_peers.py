"""The Kubernetes HPA peer's rule (pure): its desired size, the tolerance, growth capped per
sync, shrinking held by the stabilization window, and a sync every 15 s."""

from __future__ import annotations

import math
from dataclasses import replace

from infra.sim.peers import HpaState, KubernetesHPA
from processors.decisions import Boot, Vacate
from processors.latency import load_profiles
from processors.lifecycle import Session, SessionState
from processors.snapshot import Gpu, GpuState, Snapshot

MODEL = load_profiles("paper")
HPA = KubernetesHPA(model=MODEL)
K = MODEL["b300"].capacity


def _snap(now: float, gpus: int, active: int) -> Snapshot:
    ids = [f"g{i}" for i in range(gpus)]
    sessions = tuple(Session(f"s{i}", 1, SessionState.EXECUTION, ids[i % gpus] if gpus else None)
                     for i in range(active))
    return Snapshot(now, tuple(Gpu(g, "b300", GpuState.READY) for g in ids), sessions)


def test_desired_is_the_executing_share_over_the_target_within_a_tolerance():
    assert HPA.desired(10, round(10 * K * 0.6)) == 10
    assert HPA.desired(10, round(10 * K * 0.65)) == 10  # within 0.1 of the target: left alone
    busy = round(10 * K * 0.9)
    assert HPA.desired(10, busy) == math.ceil(busy / (K * 0.6) - 1e-9) > 10
    assert HPA.desired(10, 0) == 1  # the floor
    assert HPA.desired(0, 3 * K) == 5  # 3 K sessions at 0.6 of K each


def test_growth_is_capped_and_shrinking_waits_for_the_window():
    assert HPA.size(2, ((0.0, 20),)) == 6  # max(4, current) a sync
    assert HPA.size(10, ((0.0, 40),)) == 20  # 100% a sync
    assert HPA.size(0, ((0.0, 40),)) == 40  # an empty pool opens at its size
    assert HPA.size(10, ((0.0, 12), (100.0, 8), (200.0, 6))) == 10  # the window's largest, no more than now
    assert HPA.size(10, ((100.0, 8), (200.0, 6))) == 8


def test_decide_scales_every_sync_and_shrinks_after_300_s_of_smaller_recommendations():
    state = HPA.initial_state()
    d = HPA.decide(_snap(0.0, 4, 4 * K), None, state)  # every slot busy: grow to 4 K / 0.6 K
    assert [c for c in d.commands if isinstance(c, Boot)] == [Boot(3, "b300")]
    again = HPA.decide(_snap(5.0, 4, 4 * K), None, d.state)  # within the sync period: no scaling
    assert not [c for c in again.commands if isinstance(c, (Boot, Vacate))] and again.state == d.state
    window = HpaState(285.0, ((0.0, 7),) + tuple((float(t), 2) for t in range(15, 300, 15)))
    held = HPA.decide(_snap(290.0, 7, K), None, replace(window, synced_at=275.0))  # 7 still in the window
    assert not [c for c in held.commands if isinstance(c, Vacate)]
    d = HPA.decide(_snap(300.0, 7, K), None, window)  # the 7 recommended at 0 left it at 300 s
    assert len([c for c in d.commands if isinstance(c, Vacate)]) == 5 and d.state.synced_at == 300.0
