"""The Kubernetes HPA peer's rule (pure): its desired size, the tolerance, growth capped per
sync, shrinking held by the stabilization window, and a sync every 15 s."""

from __future__ import annotations

import math
from dataclasses import replace

from infra.sim.peers import HpaState, KubernetesHPA, RayServe, RayServeAuto, RayServeState, _look_back, _time_mean
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


RAY = RayServe(model=MODEL)


def test_ray_serve_sizes_for_the_look_back_periods_time_mean():
    assert RAY.sized(10 * K * 0.6) == 10 and RAY.sized(10 * K * 0.6 + 1) == 11
    assert RAY.sized(0) == 1  # the floor
    assert RayServeAuto(model=MODEL).sized(10 * K * 0.4) == 10  # Ray's own auto target
    # 10 sessions for 10 s, then 20 for 20 s: a time mean of 50/3, not the readings' 15
    assert math.isclose(_time_mean(((0.0, 10), (10.0, 20), (30.0, 99)), 0.0), 50 / 3)
    assert math.isclose(_time_mean(((0.0, 10), (10.0, 20), (30.0, 99)), 20.0), 20.0)  # only what the window holds
    assert _time_mean(((5.0, 7),), 0.0) == 7.0  # one reading spans no time
    assert _look_back(((0.0, 1), (10.0, 2), (20.0, 3)), 15.0) == ((10.0, 2), (20.0, 3))  # the one 15 s falls in stays
    assert _look_back(((0.0, 1), (10.0, 2)), -5.0) == ((0.0, 1), (10.0, 2))  # a window before every reading


def _ray_scaling(decision) -> list:
    return [c for c in decision.commands if isinstance(c, (Boot, Vacate))]


def test_ray_serve_grows_after_30_s_above_and_shrinks_after_600_s_below():
    state, busy = RAY.initial_state(), 4 * K  # every slot of 4 GPUs busy: 4 K / 0.6 K wants 7
    for t in (0.0, 10.0, 20.0):  # above for less than the upscale delay: no boot
        d = RAY.decide(_snap(t, 4, busy), None, state)
        assert not _ray_scaling(d) and d.state.direction == 1 and d.state.since == 0.0
        state = d.state
    d = RAY.decide(_snap(30.0, 4, busy), None, state)
    assert _ray_scaling(d) == [Boot(3, "b300")] and d.state.since is None
    # the counter starts again when the desired size meets the pool's
    met = RAY.decide(_snap(15.0, 4, round(4 * K * 0.6)), None, RayServeState((), 1, 0.0))
    assert not _ray_scaling(met) and met.state.direction == 0 and met.state.since is None
    # below: nothing for 600 s, then straight to the desired size
    state = RayServeState()
    for t in (0.0, 300.0, 599.0):
        d = RAY.decide(_snap(t, 7, K), None, replace(state, seen=()))
        assert not _ray_scaling(d) and d.state.direction == -1
        state = d.state
    d = RAY.decide(_snap(600.0, 7, K), None, replace(state, seen=()))
    assert len([c for c in _ray_scaling(d) if isinstance(c, Vacate)]) == 5  # K sessions want 2 GPUs


def test_ray_serve_opens_an_empty_pool_at_once():
    d = RAY.decide(_snap(0.0, 0, 3 * K), None, RAY.initial_state())
    assert _ray_scaling(d) == [Boot(5, "b300")]  # 3 K / 0.6 K, no delay
