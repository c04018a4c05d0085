import json
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processors.autoscaler import AutoscalerConfig, AutoscalerState, autoscale
from processors.decisions import Vacate, Boot, Reinstate, Retire
from processors.snapshot import Gpu, GpuState, Session, Snapshot
from processors.turboserve import TurboServe, TurboServeState
from processors.volatility import DEFAULT_VOLATILITY_TABLE, PAPER_VOLATILITY_TABLE, VolatilityTable, load_volatility_table
from schemas.errors import ConfigError
from tests.processors.strategies import PAPER, apply, snapshots

CFG = AutoscalerConfig(gpu_type="h20", min_gpus=1, max_gpus=64, dwell_s=10.0)


def _pool(loads, now=100.0, gpu_type="h20"):
    gpus = tuple(Gpu(f"g{i:02d}", gpu_type) for i in range(len(loads)))
    sessions = tuple(Session(f"g{i}s{k}", gpu_id=g.id) for i, (g, n) in enumerate(zip(gpus, loads)) for k in range(n))
    return Snapshot(now, gpus, sessions)


def test_scale_out_to_the_formula_then_dwell():
    snap = _pool([16, 15, 14, 15])  # A = 60, K = 16
    u, d = DEFAULT_VOLATILITY_TABLE.lookup(1)
    cmds, state = autoscale(snap, 1, PAPER, CFG)
    assert cmds == (Boot(math.ceil(60 / (u * 16)) - 4, "h20"),)
    assert state.last_action_at == 100.0
    assert autoscale(_pool([16, 15, 14, 15], now=105.0), 1, PAPER, CFG, state=state)[0] == ()
    assert autoscale(_pool([16, 15, 14, 15], now=111.0), 1, PAPER, CFG, state=state)[0] != ()


def test_a_growth_waits_the_dwell_or_a_boot_time_whichever_is_shorter():
    cfg = replace(CFG, dwell_s=30.0, boot_s=10.0)
    cmds, state = autoscale(_pool([16, 15, 14, 15]), 1, PAPER, cfg)
    assert cmds and state.last_action_at == 100.0
    assert autoscale(_pool([16, 15, 14, 15], now=109.0), 1, PAPER, cfg, state=state)[0] == ()
    assert autoscale(_pool([16, 15, 14, 15], now=111.0), 1, PAPER, cfg, state=state)[0] != ()  # a boot time on
    low = replace(cfg, scale_in_delay_s=0.0, settle_s=0.0)  # (no hold of the last peak)
    assert autoscale(_pool([2, 1, 0, 3], now=111.0), 1, PAPER, low, state=state)[0] == ()  # a shrink waits the dwell
    assert autoscale(_pool([2, 1, 0, 3], now=131.0), 1, PAPER, low, state=state)[0] != ()


def test_hysteresis_band_and_volatility():
    u, d = PAPER_VOLATILITY_TABLE.lookup(1)
    inside = _pool([round(16 * u)] * 4)
    assert autoscale(inside, 1, PAPER, CFG, PAPER_VOLATILITY_TABLE)[0] == ()
    cmds, _ = autoscale(inside, 10, PAPER, CFG, PAPER_VOLATILITY_TABLE)  # bursty: u* 0.25, so the same load needs more GPUs
    assert cmds and isinstance(cmds[0], Boot)


def test_scale_in_drains_least_loaded_and_waits_for_boots():
    snap = _pool([2, 1, 0, 3])
    cmds, low = autoscale(snap, 1, PAPER, CFG)  # below the band: scale in only after one boot time
    assert cmds == () and low.low_since == 100.0
    later = _pool([2, 1, 0, 3], now=100.0 + CFG.boot_s)
    cmds, _ = autoscale(later, 1, PAPER, CFG, state=low)
    assert cmds == (Vacate("g02"), Vacate("g01"), Vacate("g00"))
    assert autoscale(snap, 1, PAPER, AutoscalerConfig(gpu_type="h20", min_gpus=1, scale_in_delay_s=0.0))[0] == cmds
    booting = Snapshot(later.now, later.gpus + (Gpu("new", "h20", GpuState.BOOTING),), later.sessions)
    assert autoscale(booting, 1, PAPER, CFG, state=low)[0] == ()


def test_a_wait_whose_peak_drains_nothing_starts_again_once_the_load_would():
    """The pool went below the band at 30 sessions (50 slots at u* 0.6: all four GPUs) and the
    load then fell to 4: the wait's peak drains nothing, so a new wait starts at 4 and, a
    scale-in delay on, drains three GPUs (the old peak held all four for good). A pool at
    its floor keeps its wait. (Without the hold of the last ``settle_s`` seconds' peak, which
    keeps the four GPUs until the 30 sessions are that old.)"""
    cfg = replace(CFG, settle_s=0.0)
    cmds, low = autoscale(_pool([8, 7, 8, 7]), 1, PAPER, cfg)
    assert cmds == () and (low.low_since, low.low_peak) == (100.0, 30)
    cmds, low = autoscale(_pool([1, 1, 1, 1], now=100.0 + CFG.boot_s), 1, PAPER, cfg, state=low)
    assert cmds == () and (low.low_since, low.low_peak) == (100.0 + CFG.boot_s, 4)
    cmds, _ = autoscale(_pool([1, 1, 1, 1], now=100.0 + 2 * CFG.boot_s), 1, PAPER, cfg, state=low)
    assert len(cmds) == 3 and all(isinstance(c, Vacate) for c in cmds)
    assert autoscale(_pool([1, 1, 1, 1], now=100.0 + 2 * CFG.boot_s), 1, PAPER, CFG, state=low)[0] == ()  # held
    floor = replace(CFG, min_gpus=4)
    _, held = autoscale(_pool([8, 7, 8, 7]), 1, PAPER, floor)
    _, held2 = autoscale(_pool([1, 1, 1, 1], now=100.0 + CFG.boot_s), 1, PAPER, floor, state=held)
    assert (held2.low_since, held2.low_peak) == (100.0, 30)


def test_a_full_gpu_on_an_idle_pool_does_not_hold_off_scale_in():
    """Sessions that never idle filled three GPUs during a burst (u_max 1.0) and the other
    twelve hold a few each: more GPUs cannot cool the full ones (their sessions stay), so the
    pool, below the band as a whole, shrinks once the scale-in delay has passed (it held
    fifteen GPUs for 210 sessions before). A GPU hot but not full is left to the band."""
    u, d = DEFAULT_VOLATILITY_TABLE.lookup(1)
    loads = [16, 16, 16] + [2] * 12  # A = 72 of 240 slots
    cmds, low = autoscale(_pool(loads), 1, PAPER, CFG)
    assert cmds == () and low.low_since == 100.0
    cmds, _ = autoscale(_pool(loads, now=100.0 + CFG.boot_s), 1, PAPER, CFG, state=low)
    keep = math.ceil(72 / (u * 16))
    assert cmds and all(isinstance(c, Vacate) for c in cmds) and len(loads) - len(cmds) == keep
    assert not {c.gpu_id for c in cmds} & {"g00", "g01", "g02"}  # the least-loaded go
    hot = [math.ceil(16 * (u + d)) + 1] * 3 + [2] * 12  # past the band, not full: unchanged
    cmds, state = autoscale(_pool(hot), 1, PAPER, CFG)
    assert cmds == () and state.low_since is None


@settings(max_examples=80, deadline=None)
@given(snapshots(max_gpus=10, draining=True, booting=True), st.integers(1, 10), st.booleans())
def test_scale_in_never_shuts_a_gpu_holding_a_session(snap, level, migrate):
    policy = TurboServe(model=PAPER, autoscaler=AutoscalerConfig(min_gpus=0, dwell_s=0.0), migrate=migrate)
    decision = policy.decide(snap, None, TurboServeState(AutoscalerState(), level))
    held = {s.gpu_id for s in snap.sessions if s.gpu_id is not None}
    for c in decision.commands:
        if isinstance(c, Retire):
            assert c.gpu_id not in held
    apply(snap, decision.commands)  # asserts the same on the post-decision view
    assert decision == policy.decide(snap, None, TurboServeState(AutoscalerState(), level))


def test_table_file_round_trip(tmp_path):
    path = tmp_path / "table.json"
    path.write_text(json.dumps(DEFAULT_VOLATILITY_TABLE.to_json()))
    assert load_volatility_table(path) == DEFAULT_VOLATILITY_TABLE == load_volatility_table()
    assert PAPER_VOLATILITY_TABLE.lookup(1)[0] == 0.80 and PAPER_VOLATILITY_TABLE.lookup(10)[0] == 0.25
    doc = DEFAULT_VOLATILITY_TABLE.to_json()
    doc["levels"]["3"]["u_target"] = 1.5
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError):
        load_volatility_table(path)
    for other in ("[]", "null", "3"):  # a document that is not an object: named, not a traceback
        path.write_text(other)
        with pytest.raises(ConfigError, match="must be a JSON object"):
            load_volatility_table(path)


def test_offline_oracle_keeps_a_gpu_it_needs_again_within_a_boot_time():
    from processors.oracles import OracleAutoscale

    # peak executing per 30 s window: busy, quiet for two minutes, busy again
    future = (80, 0, 0, 0, 80, 80)
    snap = Snapshot(30.0, (Gpu("g0", "b300", GpuState.READY), Gpu("g1", "b300", GpuState.READY)), ())
    one = AutoscalerConfig(min_gpus=1)  # (the default floor of two would keep both)
    kept = OracleAutoscale(future=future, model=PAPER, autoscaler=one).decide(snap, None, None)
    assert not any(isinstance(c, Vacate) for c in kept.commands)  # needed at 120 s < 30 + 60 + 60
    short = OracleAutoscale(future=future, model=PAPER, autoscaler=one, hold_s=0.0).decide(snap, None, None)
    assert [c.gpu_id for c in short.commands if isinstance(c, Vacate)] == ["g0"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 40), st.integers(0, 300)), min_size=1, max_size=60), st.sampled_from([0.0, 30.0, 120.0]),
       st.sampled_from([0.0, 30.0, 120.0]))
def test_burst_reserve_is_the_largest_rise_within_a_boot_time(samples, memory, settle):
    """Each bucket's rise: its most less the fewest of the boot time up to it, and no more
    than its most less the level held before that boot time (the highest fewest of the
    ``settle_s`` seconds before it; with none seen then, the fewest of the boot time's first
    bucket before this one)."""
    from processors.autoscaler import burst_reserve, record_active

    cfg = AutoscalerConfig(boot_s=20.0, burst_memory_s=memory, burst_bucket_s=5.0, settle_s=settle)
    recent, t, seen = (), 0.0, []
    for dt, active in samples:
        t += dt
        recent = record_active(recent, t, active, cfg)
        seen.append((math.floor(t / 5.0), active))
    buckets = sorted({b for b, _ in seen})
    lo = {b: min(a for c, a in seen if c == b) for b in buckets}
    hi = {b: max(a for c, a in seen if c == b) for b in buckets}
    last = buckets[-1]
    kept = [b for b in buckets if b >= last - math.ceil((memory + 20.0 + settle) / 5.0)]

    def rise(b):
        full = hi[b] - min(lo[c] for c in buckets if b - 4 <= c <= b)
        before = [lo[c] for c in buckets if b - settle / 5.0 <= c < b - 4]
        first = [c for c in buckets if b - 4 <= c < b]  # none before: the boot time's first reading
        before = before or ([lo[first[0]]] if settle > 0 and first else [])
        return max(0, min(full, hi[b] - max(before))) if before else full

    assert burst_reserve(recent) == max(rise(b) for b in kept)
    assert [r[0] for r in recent] == kept


def _readings(cfg, levels):
    """``recent`` after one reading per 5 s bucket: ``levels`` as (until, executing) steps."""
    from processors.autoscaler import record_active

    recent, t = (), 0.0
    for until, active in levels:
        while t <= until:
            recent = record_active(recent, t, active, cfg)
            t += 5.0
    return recent


def test_a_return_to_the_level_held_before_is_no_burst_and_a_scale_in_keeps_that_level():
    """300 executing, a dip to 150 for 45 s, back to 300: the return is no burst (the
    sessions come back to a level the pool held within ``settle_s``), counted in full with
    ``settle_s`` 0. A rise past that level counts above it. A scale-in keeps the last
    ``settle_s`` seconds' peak instead, until it is that old."""
    from processors.autoscaler import burst_reserve

    cfg = AutoscalerConfig(gpu_type="b300", boot_s=60.0, burst_bucket_s=5.0)
    full = replace(cfg, settle_s=0.0)
    dip = ((150.0, 300), (195.0, 150), (200.0, 300))
    assert burst_reserve(_readings(cfg, dip), cfg) == 0
    assert burst_reserve(_readings(full, dip), full) == 150
    past = dip + ((255.0, 300), (260.0, 400))
    assert burst_reserve(_readings(cfg, past), cfg) == 100
    assert burst_reserve(_readings(full, past), full) == 150  # the return, still within a boot time at 255 s
    flat = VolatilityTable(((0.5, 0.05),) * 10)
    fell = ((60.0, 300), (125.0, 150))  # the load fell at 65 s; low since then

    def kept(config, now):
        state = AutoscalerState(recent=_readings(config, fell), low_since=65.0, low_peak=150)
        cmds, _ = autoscale(_pool([10] * 15, now=now, gpu_type="b300"), 1, PAPER, replace(config, dwell_s=0.0), flat, state)
        return 15 - sum(isinstance(c, Vacate) for c in cmds)

    assert kept(cfg, 130.0) == 15  # 300 executing within the last 120 s: 600 slots
    assert kept(full, 130.0) == 8  # the peak since the fall: 150 / 0.5 = 300 slots
    assert kept(cfg, 190.0) == 8  # the 300 is older than settle_s


def test_a_fall_within_a_bucket_counts_as_a_coming_return():
    """Half the executing sessions going idle within one bucket is held as a rise of the
    same size: they can come back together within a boot time. A fall spread over buckets
    is not. (Read with every rise in full, as the SLO mode reads them: settled, a return to
    the 300 held before is no burst.)"""
    from processors.autoscaler import burst_reserve, record_active

    cfg = AutoscalerConfig(boot_s=60.0, burst_bucket_s=5.0, settle_s=0.0)
    recent = ()
    for t, active in ((0.0, 300), (10.0, 300), (21.0, 300), (21.5, 150), (24.0, 150)):
        recent = record_active(recent, t, active, cfg)
    assert burst_reserve(recent, cfg) == 150  # (weighted down as it ages, as any rise)
    slow = ()
    for t, active in ((0.0, 300), (5.0, 250), (10.0, 200), (15.0, 150), (20.0, 150)):
        slow = record_active(slow, t, active, cfg)
    assert burst_reserve(slow, cfg) == 0


def test_burst_reserve_raises_the_demand_the_pool_is_sized_for():
    cfg = AutoscalerConfig(gpu_type="h20", min_gpus=1, max_gpus=64, dwell_s=0.0, burst_memory_s=300.0, burst_utilization=None)
    quiet = _pool([4, 4, 4, 4], now=100.0)  # A = 16 on 64 slots: no scale-out without a reserve
    _, state = autoscale(quiet, 1, PAPER, cfg)
    burst = _pool([12, 12, 12, 12], now=130.0)  # +32 within one boot time
    cmds, state = autoscale(burst, 1, PAPER, cfg, state=state)
    u, _ = DEFAULT_VOLATILITY_TABLE.lookup(1)
    assert cmds == (Boot(math.ceil((48 / u + 32) / 16) - 4, "h20"),)  # the reserve at full capacity
    assert state.recent[-1][3] == 32


def test_a_rise_the_pool_absorbs_below_the_burst_utilization_needs_no_reserve():
    cfg = AutoscalerConfig(gpu_type="b300", min_gpus=1, max_gpus=64, dwell_s=0.0, burst_memory_s=300.0)
    u, _ = DEFAULT_VOLATILITY_TABLE.lookup(1)
    _, state = autoscale(_pool([60] * 4, now=100.0, gpu_type="b300"), 1, PAPER, cfg)
    for rise, reserve in ((40, 0), (120, 120 - math.floor((0.75 - u) / u * 360))):  # A = 280 / 360 after it
        after = _pool([(240 + rise) // 4] * 4, now=130.0, gpu_type="b300")
        cmds, _ = autoscale(after, 1, PAPER, cfg, state=state)
        assert cmds == (Boot(math.ceil(((240 + rise) / u + reserve) / 40 - 1e-9) - 4, "b300"),)


def _measured(now, count, missed, worst=0.5, gpus=4, active=80):
    from processors.snapshot import ChunkStats

    snap = _pool([active // gpus] * gpus, now=now, gpu_type="b300")
    return Snapshot(snap.now, snap.gpus, snap.sessions, chunks=ChunkStats(count, missed, worst))


def test_slo_feedback_buys_headroom_on_misses_and_spends_it_when_under_budget():
    from processors.autoscaler import Slo, slo_feedback

    cfg = AutoscalerConfig(slo=Slo(0.001, 3.0), slo_step_s=60.0, headroom_start=0.6)
    state = slo_feedback(AutoscalerState(), _measured(10.0, 10_000, 50), cfg)  # 0.5% missed in step 0
    assert state.headroom == 0.6
    state = slo_feedback(state, _measured(61.0, 0, 0), cfg)  # step 0 closes over budget: less u*
    assert state.headroom == pytest.approx(0.6 * cfg.headroom_down)
    calm = AutoscalerState()
    for k in range(5):
        calm = slo_feedback(calm, _measured(60.0 * k + 1, 10_000, 0), cfg)
    assert calm.headroom == pytest.approx(0.6 * cfg.headroom_up ** 4)  # four closed steps without misses
    over = slo_feedback(slo_feedback(AutoscalerState(), _measured(1.0, 10_000, 0, worst=4.0), cfg), _measured(61.0, 0, 0), cfg)
    assert over.headroom == pytest.approx(0.6 * cfg.headroom_down)  # a chunk over the worst bound counts too
    assert AutoscalerState(headroom=0.5) == replace(calm, headroom=0.5, measured=None)  # plain data


def test_slo_mode_grows_when_short_and_shrinks_after_the_delay():
    from processors.autoscaler import Slo

    cfg = AutoscalerConfig(slo=Slo(), headroom_start=1.0, burst_memory_s=0.0, dwell_s=0.0, boot_s=60.0)
    table = PAPER_VOLATILITY_TABLE  # level 1: u* 0.80
    cmds, state = autoscale(_measured(0.0, 0, 0, gpus=2, active=80), 1, PAPER, cfg, table)
    assert cmds == (Boot(1, "b300"),)  # 80 / 0.8 = 100 slots > 2 x 40
    cmds, low = autoscale(_measured(100.0, 0, 0, gpus=4, active=40), 1, PAPER, cfg, table, state)
    assert cmds == () and low.low_since == 100.0  # 50 slots needed, 160 held: waits a scale-in delay
    cmds, _ = autoscale(_measured(160.0, 0, 0, gpus=4, active=40), 1, PAPER, cfg, table, low)
    assert len(cmds) == 2 and all(isinstance(c, Vacate) for c in cmds)  # down to the 50 slots it needed


def test_a_controller_that_starts_on_a_running_load_takes_its_first_reading_as_the_level_held():
    """With nothing seen before a rise's boot time (a controller's first minute on a running
    load: a trace cut mid-stream, a state lost), the boot time's first reading stands for the level
    held: noise on a running load is no burst, a launch from nothing counts in full, and a
    crowd past the first level counts above it."""
    from processors.autoscaler import burst_reserve

    cfg = AutoscalerConfig(gpu_type="b300", boot_s=60.0, burst_bucket_s=5.0)  # settle_s 120
    calm = ((4.0, 188), (9.0, 173), (14.0, 191))  # a running load's noise in its first 15 s
    assert burst_reserve(_readings(cfg, calm), cfg) == 191 - 188
    assert burst_reserve(_readings(replace(cfg, settle_s=0.0), calm), cfg) == 191 - 173  # every rise in full
    assert burst_reserve(_readings(cfg, ((4.0, 0), (14.0, 100))), cfg) == 100  # a launch
    assert burst_reserve(_readings(cfg, ((4.0, 188), (14.0, 300))), cfg) == 300 - 188  # a crowd


def test_burst_reserve_decays_with_age_and_is_held_at_full_capacity():
    from processors.autoscaler import burst_reserve, record_active

    cfg = AutoscalerConfig(gpu_type="b300", boot_s=60.0, burst_memory_s=300.0, burst_bucket_s=5.0)
    recent = record_active((), 0.0, 10, cfg)
    recent = record_active(recent, 30.0, 70, cfg)  # a rise of 60 within a boot time
    assert burst_reserve(recent, cfg) == 60
    later = record_active(recent, 180.0, 70, cfg)  # 150 s later: half the memory gone
    assert burst_reserve(later, cfg) == 30
    assert burst_reserve(later, replace(cfg, burst_decay=False)) == 60
    snap = _pool([20, 20], now=180.0, gpu_type="b300")  # A = 40 on 2 x 40 slots
    flat = VolatilityTable(((0.5, 0.05),) * 10)
    cmds, _ = autoscale(snap, 1, PAPER, replace(cfg, dwell_s=0.0), flat, AutoscalerState(recent=later[:-1]))
    assert cmds == (Boot(1, "b300"),)  # 40 / 0.5 + 30 = 110 slots: three GPUs, not (40 + 30) / 0.5 = 140


def test_a_pool_below_its_floor_boots_the_rest_with_or_without_sessions():
    """``min_gpus`` is a floor the pool is brought up to, not only one a scale-in stops at:
    an idle fleet with none (a fresh ``up``, or its workers lost) boots up to it at once."""
    floor = replace(CFG, min_gpus=2)
    assert autoscale(Snapshot(100.0, (), ()), 1, PAPER, floor)[0] == (Boot(2, "h20"),)
    booting = Snapshot(100.0, (Gpu("g00", "h20", GpuState.BOOTING),), ())
    assert autoscale(booting, 1, PAPER, floor)[0] == (Boot(1, "h20"),)  # a booting GPU counts
    assert autoscale(_pool([0, 0]), 1, PAPER, floor)[0] == ()  # at the floor: nothing
    cmds, _ = autoscale(_pool([16]), 1, PAPER, floor)  # a scale-out past the floor: no extra Boot
    assert len(cmds) == 1 and isinstance(cmds[0], Boot) and cmds[0].count >= 1
    assert autoscale(Snapshot(100.0, (), ()), 1, PAPER, replace(CFG, min_gpus=0))[0] == ()


def test_a_growth_takes_back_draining_gpus_that_hold_sessions_before_it_boots():
    """Draining GPUs are up and billed: a growth reinstates those still holding a session
    (the fullest first) before it boots any; an empty one (its Shutdown may be on its way) and
    an external one (an operator drained it) are left draining."""
    gpus = (Gpu("g00", "h20"), Gpu("g01", "h20", GpuState.DRAINING), Gpu("g02", "h20", GpuState.DRAINING),
            Gpu("g03", "h20", GpuState.DRAINING), Gpu("g04", "h20", GpuState.DRAINING, external=True))
    held = {"g00": 16, "g01": 1, "g02": 3, "g04": 2}
    sessions = tuple(Session(f"{g}s{k}", gpu_id=g) for g, n in held.items() for k in range(n))
    snap = Snapshot(100.0, gpus, sessions)  # A = 22 on 16 slots: 37 slots at u* 0.6
    u, _ = DEFAULT_VOLATILITY_TABLE.lookup(1)
    cmds, _ = autoscale(snap, 1, PAPER, CFG)
    boots = math.ceil(22 / (u * 16)) - 3
    assert cmds == (Reinstate("g02"), Reinstate("g01")) + ((Boot(boots, "h20"),) if boots > 0 else ())
    fewer = tuple(x for x in sessions if x.gpu_id != "g00") + tuple(Session(f"n{k}", gpu_id="g00") for k in range(12))
    small = Snapshot(100.0, gpus, fewer)
    cmds, _ = autoscale(small, 1, PAPER, CFG)  # A = 18: 30 slots, one reinstated GPU enough
    assert cmds == (Reinstate("g02"),)
    assert autoscale(snap, 1, PAPER, replace(CFG, max_gpus=2))[0] == (Reinstate("g02"),)  # the pool's ceiling holds


def test_the_default_floor_is_two_gpus():
    """N + 1 by default: a pool of one gets a second GPU, and a scale-in stops at two."""
    default = AutoscalerConfig(gpu_type="h20", scale_in_delay_s=0.0, dwell_s=0.0)
    assert default.min_gpus == 2
    assert autoscale(_pool([1]), 1, PAPER, default)[0] == (Boot(1, "h20"),)
    cmds, _ = autoscale(_pool([0, 0, 0, 1]), 1, PAPER, default)
    assert cmds == (Vacate("g00"), Vacate("g01"))


def test_without_an_slo_u_star_follows_the_worst_chunk_measured_over_the_burst_memory():
    from processors.snapshot import ChunkStats

    flat = VolatilityTable(((0.6, 0.05),) * 10)
    cfg = AutoscalerConfig(min_gpus=1, max_gpus=64, dwell_s=0.0, burst_memory_s=900.0)

    def hot(now, worst):  # 2 b300 GPUs at 27 of 40: u_max 0.675, past the band's top 0.65
        snap = _pool([27, 27], now=now, gpu_type="b300")
        return replace(snap, chunks=ChunkStats(100, 0, worst))

    grow, _ = autoscale(hot(100.0, 0.0), 1, PAPER, cfg, flat)
    assert grow and isinstance(grow[0], Boot)
    # a 1.7 s chunk was measured: l(30) + l(31) = 1.675 s <= 1.7 < l(31) + l(32), so u* rises to 31 / 40 less delta
    cmds, state = autoscale(hot(100.0, 1.7), 1, PAPER, cfg, flat)
    assert cmds == () and state.worst_seen == ((1, 1.7),)
    assert autoscale(hot(700.0, 0.5), 1, PAPER, cfg, flat, state)[0] == ()  # still remembered
    later = autoscale(hot(1100.0, 0.5), 1, PAPER, cfg, flat, autoscale(hot(700.0, 0.5), 1, PAPER, cfg, flat, state)[1])[0]
    assert later and isinstance(later[0], Boot)  # forgotten after the burst memory
    assert autoscale(hot(100.0, 1.7), 1, PAPER, replace(cfg, follow_worst=None), flat)[0] == grow  # off
    assert autoscale(hot(100.0, 1.7), 1, PAPER, replace(cfg, follow_worst=0.62), flat)[0] == grow  # capped under the load
    # a worst chunk faster than the table's load allows never lowers u*
    assert autoscale(hot(100.0, 0.4), 1, PAPER, cfg, flat)[0] == grow
    for bad in (0.0, 1.5):
        with pytest.raises(ConfigError, match="follow_worst"):
            AutoscalerConfig(follow_worst=bad)


def test_with_an_slo_a_rise_past_the_load_whose_first_chunk_misses_counts_in_the_reserve():
    """Under the paper profile a first chunk on a GPU of 12 (l(11) + l(12) > 1 s) may miss a
    1 s deadline: with an SLO, a rise the pool would absorb up to 0.75 K (no reserve without
    one) counts in full once the chunk deadline is known, and it stays known between chunks."""
    from processors.autoscaler import Slo
    from processors.lifecycle import SessionState
    from processors.snapshot import ChunkStats

    cfg = AutoscalerConfig(gpu_type="b300", slo=Slo(), headroom_start=0.6, dwell_s=0.0, burst_memory_s=300.0)
    u = DEFAULT_VOLATILITY_TABLE.lookup(1)[0] * 0.6

    def at(now: float, per_gpu: int, deadline: float) -> Snapshot:
        snap = _pool([per_gpu] * 4, now=now, gpu_type="b300")
        idle = tuple(Session(f"i{k}", lifecycle=SessionState.SUSPENDED) for k in range(40))  # as many may rise again
        return replace(snap, sessions=snap.sessions + idle, chunks=ChunkStats(0, 0, 0.0, deadline))

    assert math.floor(PAPER["b300"].first_chunk_load(1.0, 80)) == 11
    for deadline, reserve in ((0.0, 0), (1.0, 40)):  # +40 executing within a boot time
        _, state = autoscale(at(100.0, 20, deadline), 1, PAPER, cfg)
        cmds, state = autoscale(at(130.0, 30, 0.0), 1, PAPER, cfg, state=state)
        assert state.deadline_s == deadline
        assert cmds == (Boot(math.ceil((120 / u + reserve) / 40 - 1e-9) - 4, "b300"),)


def test_a_first_chunk_misses_as_it_waits_out_the_running_chunk_then_runs_its_own():
    """Under the paper profile (l(n) from 0.3 s to 1.0 s at 40) a first chunk meets a 1 s
    deadline up to 11 sessions on its GPU; past them it misses with the share of the running
    chunk's remainder, uniform in [0, l(n - 1)], that takes it past the deadline."""
    from processors.slo_mode import first_chunk_misses

    p = PAPER["b300"]
    assert [first_chunk_misses(p, n, 1.0) for n in (1, 5, 11)] == [0.0, 0.0, 0.0]
    for n in (12, 20, 40):
        assert first_chunk_misses(p, n, 1.0) == pytest.approx((p.latency(n - 1) + p.latency(n) - 1.0) / p.latency(n - 1))
    assert first_chunk_misses(p, 1, 0.2) == 1.0  # alone on its GPU, a chunk longer than the deadline always misses
    chances = [first_chunk_misses(p, n, 1.0) for n in range(1, 41)]
    assert chances == sorted(chances) and chances[-1] == pytest.approx(1.0)


def test_the_floor_is_the_most_sessions_per_gpu_whose_first_chunks_stay_within_the_allowed_misses():
    from processors.slo_mode import first_chunk_misses, floor_load

    p = PAPER["b300"]
    for rate, allowed in ((5.0, 2.4), (0.5, 2.4), (50.0, 2.4), (5.0, 0.0)):
        n = floor_load(p, rate, allowed, 1.0)
        fits = [k for k in range(1, 41) if rate * first_chunk_misses(p, k, 1.0) * p.latency(k) <= allowed]
        assert n == max(fits, default=1)
    assert floor_load(p, 0.0, 0.0, 1.0) == 40  # nothing starts: a full GPU misses nothing
    assert floor_load(p, 0.0, 0.0, 0.7) == max(k for k in range(1, 41) if p.latency(k) <= 0.7)  # every chunk would miss past it
    # 3,000 executing, 5 starts a second, 0.8 of a 0.1% SLO: the floor is where a GPU more would pass it
    n = floor_load(p, 5.0, 0.8 * 0.001 * 3000, 1.0)
    misses = [5.0 * first_chunk_misses(p, k, 1.0) * p.latency(k) / 3000 for k in (n, n + 1)]
    assert 12 < n < 40 and misses[0] <= 0.0008 < misses[1]


def test_with_an_slo_u_star_is_floored_where_sessions_seldom_start_executing():
    """The floor counts the sessions that start executing per step, not the first decision's
    (the state the run starts from: a trace cut mid-stream opens every session at once),
    waits ``slo_floor_after_s``, reads the mean of the closed steps (or, as configured, the
    busiest), and lets go once the run is past its budget."""
    from processors.autoscaler import Slo, band
    from processors.lifecycle import EventKind, SessionEvent
    from processors.slo_mode import floor_load, slo_feedback, slo_floor
    from processors.snapshot import ChunkStats

    cfg = AutoscalerConfig(gpu_type="b300", slo=Slo(), slo_step_s=60.0, slo_floor_after_s=120.0)
    p = PAPER["b300"]

    def at(now: float, starts: int, count: int = 10_000, missed: int = 0) -> Snapshot:
        snap = _pool([30] * 100, now=now, gpu_type="b300")  # 3,000 executing
        events = tuple(SessionEvent(now, f"n{now}-{k}", EventKind.OPEN if k % 2 else EventKind.ACTIVE) for k in range(starts))
        return replace(snap, events=events, chunks=ChunkStats(count, missed, 0.9, 1.0))

    def step(state: AutoscalerState, snap: Snapshot) -> AutoscalerState:
        return slo_floor(slo_feedback(state, snap, cfg), snap, PAPER, cfg, 3000)

    state = step(AutoscalerState(), at(0.0, 3000))  # the opening instant: state, not starts
    assert state.starts == ((0, 0),) and state.floor_u is None
    for t, n in ((30.0, 150), (70.0, 300), (100.0, 60)):  # 150 in step 0, 360 in step 1
        state = step(state, at(t, n))
        assert state.floor_u is None  # under 120 s watched
    state = step(state, at(130.0, 10))
    assert state.starts == ((0, 150), (1, 360), (2, 10))
    assert state.floor_u == floor_load(p, (150 + 360) / 2 / 60.0, 0.8 * 0.001 * 3000, 1.0) / 40
    busiest = slo_floor(slo_feedback(state, at(135.0, 0), cfg), at(135.0, 0), PAPER, replace(cfg, slo_floor_busiest=True), 3000)
    assert busiest.floor_u == floor_load(p, 360 / 60.0, 0.8 * 0.001 * 3000, 1.0) / 40 < state.floor_u  # the burst's minute alone
    table_u = DEFAULT_VOLATILITY_TABLE.lookup(1)[0]
    assert band(1, PAPER, cfg, DEFAULT_VOLATILITY_TABLE, state)[0] == pytest.approx(max(state.floor_u, table_u * 0.6))
    assert state.floor_u > table_u * 0.6  # few starts: more sessions per GPU than the feedback's start allows
    spent = step(state, at(140.0, 0, count=0, missed=100_000))  # the run is past its error budget
    assert spent.floor_u is None
    assert slo_floor(state, at(140.0, 0), PAPER, replace(cfg, slo_floor_share=None), 3000) == state  # off


def test_with_an_slo_the_burst_reserve_holds_no_more_than_what_may_start_within_a_boot_time():
    """The reserve remembers a rise for its memory; with an SLO it is capped by the sessions
    that may start executing within a boot time: the idle ones and the most opens of a step
    (a boot time's worth). Once a round's returns are all back and none is idle, it no longer
    holds GPUs for them; a break that idles them raises the cap again. The first decision's
    opens are the state the run starts from."""
    from processors.autoscaler import Slo
    from processors.lifecycle import EventKind, SessionEvent, SessionState
    from processors.slo_mode import reserve_cap
    from processors.snapshot import ChunkStats

    cfg = AutoscalerConfig(gpu_type="b300", slo=Slo(), slo_floor_share=None, boot_s=60.0, slo_step_s=60.0)

    def at(now: float, executing: int, idle: int, opens: int = 0) -> Snapshot:
        gpus = tuple(Gpu(f"g{i:02d}", "b300") for i in range(20))
        run = tuple(Session(f"e{k}", gpu_id=gpus[k % 20].id) for k in range(executing))
        rest = tuple(Session(f"i{k}", lifecycle=SessionState.SUSPENDED) for k in range(idle))
        events = tuple(SessionEvent(now, f"e{k}", EventKind.OPEN) for k in range(opens))
        return Snapshot(now, gpus, run + rest, events, ChunkStats(1000, 0, 0.9, 1.0))  # a 1 s chunk deadline

    cap, state = reserve_cap(AutoscalerState(), at(0.0, 300, 0, opens=300), cfg, 300)  # the opening instant
    assert cap == 0 and state.opens == ((0, 0),)
    cap, state = reserve_cap(state, at(30.0, 300, 50, opens=12), cfg, 300)
    assert cap == 50 + 12 and state.opens == ((0, 12),)
    cap, state = reserve_cap(state, at(70.0, 340, 0, opens=4), cfg, 340)  # every idle one back
    assert cap == 12 and state.opens == ((0, 12), (1, 4))
    assert reserve_cap(state, at(75.0, 340, 0), replace(cfg, boot_s=180.0), 340)[0] == 36  # three steps a boot time

    # in a decision: a remembered return of 250 sessions is held only while sessions are idle to make it
    rise = AutoscalerState(recent=((0, 90, 90, 0), (12, 90, 340, 250)), opens=((1, 4),))
    held = autoscale(at(70.0, 340, 0), 1, PAPER, replace(cfg, slo_reserve_cap=False), state=rise)[0]
    capped = autoscale(at(70.0, 340, 0), 1, PAPER, cfg, state=rise)[0]
    boots = [sum(c.count for c in cmds if isinstance(c, Boot)) for cmds in (held, capped)]
    assert boots[0] > boots[1] > 0, boots  # GPUs for the load, not for a return with nobody idle to make it
