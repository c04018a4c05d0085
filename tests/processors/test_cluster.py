"""The cluster view: a pure fold that replays to the same view under reordering and duplicates."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from processors.cluster import (BOOTING_PREFIX, ClusterView, apply, apply_all, current_generation,
                                dead_workers, prune, to_snapshot)
from processors.lifecycle import SessionState
from processors.snapshot import GpuState
from schemas import records as r

G = r.Generation
WORKERS = ("w0", "w1", "w2")


@st.composite
def logs(draw):
    """Per-partition streams of a plausible run: session events per session, worker events
    per worker (claims and releases follow one generation chain per session), and the
    scaling commands. Each stream is in its own order; streams are independent."""
    streams: dict[str, list[r.Record]] = {f"worker:{w}": [] for w in WORKERS}
    streams["scaling"] = []
    for w in WORKERS:
        streams[f"worker:{w}"].append(r.WorkerUp(worker_id=w, ts=draw(st.floats(0, 5)), capacity=4,
                                                 pool="p", gpu_type="cpu"))
    for i in range(draw(st.integers(0, 5))):
        sid = f"s{i}"
        t = draw(st.floats(1, 10))
        evs: list[r.Record] = [r.SessionOpened(session_id=sid, ts=t, state_bytes=100 * (i + 1))]
        for kind in draw(st.lists(st.sampled_from(["idle", "active"]), max_size=4)):
            t += draw(st.sampled_from([0.0, 0.5, 2.0]))
            cls = r.SessionIdle if kind == "idle" else r.SessionActive
            evs.append(cls(session_id=sid, ts=t))
        if draw(st.booleans()):
            evs.append(r.SessionClosed(session_id=sid, ts=t + 1))
        streams[f"session:{sid}"] = evs
        chain = draw(st.lists(st.sampled_from(WORKERS), min_size=0, max_size=3))
        ct = 5.0
        for epoch, w in enumerate(chain, 1):
            gen = G(w, epoch)
            streams[f"worker:{w}"].append(r.Claimed(worker_id=w, session_id=sid, generation=gen, ts=ct))
            ct += 1
            if epoch < len(chain):
                succ = G(chain[epoch], epoch + 1)
                streams[f"worker:{w}"].append(r.Released(worker_id=w, session_id=sid, generation=gen, ts=ct,
                                                         reason="migrated", successor=succ))
            elif draw(st.booleans()):
                streams[f"worker:{w}"].append(r.Released(worker_id=w, session_id=sid, generation=gen,
                                                         ts=ct, reason="suspended"))
    for w in WORKERS:
        for k in range(draw(st.integers(0, 3))):
            streams[f"worker:{w}"].append(r.Heartbeat(worker_id=w, ts=20.0 + k, sessions=k, executing=k,
                                                      capacity=4, chunk_latency_s=0.01 * k))
        if draw(st.booleans()):
            streams[f"worker:{w}"].append(r.WorkerDown(worker_id=w, ts=30.0, reason="shutdown"))
    if draw(st.booleans()):
        streams["scaling"].append(r.ScaleOut(pool="p", count=2, ts=8.0, decision_id="d1"))
    if draw(st.booleans()):
        streams["scaling"].append(r.Drain(pool="p", worker_id="w1", ts=9.0, decision_id="d2"))
        if draw(st.booleans()):
            streams["scaling"].append(r.Reinstate(pool="p", worker_id="w1", ts=11.0, decision_id="d3"))
    return {k: v for k, v in streams.items() if v}


@st.composite
def deliveries(draw, streams):
    """An at-least-once delivery: streams interleaved in any way, each keeping its order, and
    each maybe redelivering a suffix (a consumer that restarted from an older offset) or
    single records twice in a row."""
    queues = {}
    for name, recs in streams.items():
        seq = list(recs)
        if draw(st.booleans()):  # read up to ``upto``, restart from ``back`` <= ``upto``
            upto = draw(st.integers(0, len(seq)))
            back = draw(st.integers(0, upto))
            seq = seq[:upto] + seq[back:]
        doubled = []
        for rec in seq:
            doubled.append(rec)
            if draw(st.integers(0, 5)) == 0:
                doubled.append(rec)
        queues[name] = doubled
    out = []
    while queues:
        name = draw(st.sampled_from(sorted(queues)))
        out.append(queues[name].pop(0))
        if not queues[name]:
            del queues[name]
    return out


def canonical(streams):
    return apply_all(ClusterView(), [rec for name in sorted(streams) for rec in streams[name]])


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_replay_rebuilds_the_same_view_under_reordering_and_duplicates(data):
    streams = data.draw(logs())
    expected = canonical(streams)
    got = apply_all(ClusterView(), data.draw(deliveries(streams)))
    assert got == expected
    assert to_snapshot(got, 25.0) == to_snapshot(expected, 25.0)


@settings(max_examples=100, deadline=None)
@given(logs())
def test_every_record_folded_twice_in_a_row_changes_nothing(streams):
    view = ClusterView()
    for rec in [rec for name in sorted(streams) for rec in streams[name]]:
        view = apply(view, rec)
        assert apply(view, rec) == view


def test_lifecycle_and_ownership_make_the_snapshot():
    view = apply_all(ClusterView(), [
        r.WorkerUp(worker_id="w0", ts=1, capacity=4, pool="p"),
        r.WorkerUp(worker_id="w1", ts=1, capacity=4, pool="p"),
        r.SessionOpened(session_id="a", ts=2, state_bytes=1000),
        r.SessionOpened(session_id="b", ts=2),
        r.SessionOpened(session_id="c", ts=2),
        r.Claimed(worker_id="w0", session_id="a", generation=G("w0", 1), ts=3),
        r.Claimed(worker_id="w0", session_id="b", generation=G("w0", 1), ts=3),
        r.Released(worker_id="w0", session_id="b", generation=G("w0", 1), ts=4, reason="migrated",
                   successor=G("w1", 2)),
        r.SessionIdle(session_id="c", ts=5),
        r.SessionClosed(session_id="a", ts=6),
        r.SessionOpened(session_id="a", ts=2),  # a stale redelivery: closed stays closed
    ])
    snap = to_snapshot(view, 10.0)
    assert [(g.id, g.state) for g in snap.gpus] == [("w0", GpuState.READY), ("w1", GpuState.READY)]
    by_id = {s.id: s for s in snap.sessions}
    assert set(by_id) == {"b", "c"}  # a is terminated
    assert by_id["b"].gpu_id == "w1" and by_id["b"].lifecycle is SessionState.EXECUTION
    assert by_id["c"].gpu_id is None and by_id["c"].lifecycle is SessionState.SUSPENDED
    assert current_generation(view, "b") == G("w1", 2)
    assert current_generation(view, "a") == G("w0", 1)  # closed but not yet released
    assert view.sessions["a"].state_bytes == 1000


def test_a_sessions_age_runs_from_its_last_change_not_from_a_duplicate_event():
    """``Session.since`` is when its lifecycle state last changed, as the simulator keeps it:
    an idle said again (a producer's retry) left a session looking freshly idle to a policy."""
    view = apply_all(ClusterView(), [
        r.SessionOpened(session_id="c", ts=2),
        r.SessionIdle(session_id="c", ts=5),
        r.SessionIdle(session_id="c", ts=50),
    ])
    (s,) = to_snapshot(view, 60.0).sessions
    assert s.lifecycle is SessionState.SUSPENDED and s.since == 5


def test_suspension_frees_the_gpu_and_a_late_claim_does_not_bring_it_back():
    view = apply_all(ClusterView(), [
        r.WorkerUp(worker_id="w0", ts=1, capacity=4),
        r.Released(worker_id="w0", session_id="a", generation=G("w0", 1), ts=4, reason="suspended"),
        r.Claimed(worker_id="w0", session_id="a", generation=G("w0", 1), ts=3),
        r.SessionOpened(session_id="a", ts=2),
    ])
    assert current_generation(view, "a") is None
    (s,) = to_snapshot(view, 5).sessions
    assert s.gpu_id is None and s.restore


def test_workers_drain_die_and_come_back():
    view = apply_all(ClusterView(), [
        r.WorkerUp(worker_id="w0", ts=1, capacity=4),
        r.WorkerUp(worker_id="w1", ts=1, capacity=4),
        r.Heartbeat(worker_id="w0", ts=9, sessions=1, executing=1, capacity=4, chunk_latency_s=0.2),
        r.Drain(pool="default", worker_id="w1", ts=2),
    ])
    assert view.workers["w0"].chunk_latency_s == 0.2
    assert view.workers["w1"].state is GpuState.DRAINING
    assert dead_workers(view, 12.0, 5.0) == ("w1",)  # w1 last heard at 1
    assert [g.id for g in to_snapshot(view, 12.0, heartbeat_timeout_s=5.0).gpus] == ["w0"]
    view = apply(view, r.WorkerDown(worker_id="w1", ts=12, reason="missed heartbeats"))
    assert dead_workers(view, 12.0, 5.0) == () and not view.workers["w1"].alive
    view = apply(view, r.WorkerUp(worker_id="w1", ts=20, capacity=8))  # restarted: ready again
    assert view.workers["w1"].alive and view.workers["w1"].state is GpuState.READY
    assert view.workers["w1"].capacity == 8


def test_a_reinstate_calls_off_the_drain_before_it_and_a_later_drain_wins_again():
    up = [r.WorkerUp(worker_id="w1", ts=1, capacity=4), r.Drain(pool="default", worker_id="w1", ts=2)]
    back = apply_all(ClusterView(), up + [r.Reinstate(pool="default", worker_id="w1", ts=3)])
    assert back.workers["w1"].state is GpuState.READY and back.last_scale_ts == 3
    # delivered in any order, or twice, the fold is the same: each is a max of its times
    assert apply_all(ClusterView(), [up[1], r.Reinstate(pool="default", worker_id="w1", ts=3), up[0], up[1]]) == back
    stale = apply_all(ClusterView(), up + [r.Reinstate(pool="default", worker_id="w1", ts=1.5)])
    assert stale.workers["w1"].state is GpuState.DRAINING  # one from before the drain calls nothing off
    again = apply(back, r.Drain(pool="default", worker_id="w1", ts=4))
    assert again.workers["w1"].state is GpuState.DRAINING
    assert [g.state for g in to_snapshot(back, 3.0).gpus] == [GpuState.READY]


def test_scale_outs_stand_as_booting_gpus_until_their_workers_come_up():
    view = apply_all(ClusterView(), [
        r.WorkerUp(worker_id="p-0", ts=1, capacity=4, pool="p"),
        r.ScaleOut(pool="p", count=2, ts=10, decision_id="d1"),
        r.ScaleOut(pool="p", count=2, ts=10, decision_id="d1"),  # duplicate
    ])
    booting = [g for g in to_snapshot(view, 11).gpus if g.state is GpuState.BOOTING]
    assert [g.id.startswith(BOOTING_PREFIX) for g in booting] == [True, True]
    view = apply_all(view, [r.WorkerProvisioned(worker_id="p-1", ts=10.5, provisioner="provisioner-p", pool="p"),
                            r.WorkerUp(worker_id="p-1", ts=15, capacity=4, pool="p")])
    assert sum(g.state is GpuState.BOOTING for g in to_snapshot(view, 16).gpus) == 1
    assert sum(g.state is GpuState.BOOTING for g in to_snapshot(view, 200).gpus) == 0  # boot timed out
    assert view.last_scale_ts == 10


def test_a_pending_handoff_shows_the_session_on_its_target_until_it_times_out():
    view = apply_all(ClusterView(), [
        r.WorkerUp(worker_id="w0", ts=1, capacity=4),
        r.WorkerUp(worker_id="w1", ts=1, capacity=4),
        r.SessionOpened(session_id="a", ts=1),
        r.Claimed(worker_id="w0", session_id="a", generation=G("w0", 1), ts=2),
        r.Handoff(worker_id="w0", session_id="a", generation=G("w0", 1), target_worker="w1", ts=3),
    ])
    assert to_snapshot(view, 4, handoff_timeout_s=10).sessions[0].gpu_id == "w1"
    assert to_snapshot(view, 20, handoff_timeout_s=10).sessions[0].gpu_id == "w0"


def test_prune_forgets_closed_sessions_and_down_workers():
    view = apply_all(ClusterView(), [
        r.WorkerUp(worker_id="w0", ts=1, capacity=4),
        r.WorkerDown(worker_id="w0", ts=2),
        r.SessionOpened(session_id="a", ts=1),
        r.SessionClosed(session_id="a", ts=2),
        r.SessionOpened(session_id="b", ts=1),
    ])
    cut = prune(view, 10)
    assert set(cut.sessions) == {"b"} and cut.workers == {}
    assert prune(view, 1) == view
    assert math.isinf(ClusterView().last_scale_ts)


def test_session_events_fold_in_the_logs_order_and_pass_over_what_dispatch_refuses():
    """An outside producer whose clock was skewed sent a close stamped before its open:
    dispatch closed the session, the view dropped the close as a stale redelivery and kept it
    executing for good. An idle of an id nobody opened, which dispatch refuses, made a
    suspended session here, and a close of one made the id closed for good."""
    view = apply_all(ClusterView(), [
        r.SessionOpened(session_id="skew", ts=100.0),
        r.SessionClosed(session_id="skew", ts=2.0),
        r.SessionOpened(session_id="back", ts=200.0),
        r.SessionIdle(session_id="back", ts=1.0),
        r.SessionIdle(session_id="nobody", ts=5.0),
        r.SessionClosed(session_id="later", ts=5.0),
        r.SessionOpened(session_id="later", ts=6.0),
    ])
    assert view.sessions["skew"].lifecycle is SessionState.TERMINATED
    assert view.sessions["back"].lifecycle is SessionState.SUSPENDED
    assert view.sessions["back"].last_event == 200.0  # its time does not go back
    assert "nobody" not in view.sessions
    assert view.sessions["later"].lifecycle is SessionState.EXECUTION
    from processors.agents.metrics import SessionTally

    tally = SessionTally()
    for rec in (r.SessionIdle(session_id="nobody", ts=5.0), r.SessionClosed(session_id="later", ts=5.0),
                r.SessionOpened(session_id="later", ts=6.0), r.SessionOpened(session_id="x", ts=7.0),
                r.SessionIdle(session_id="x", ts=8.0)):
        tally.fold(rec)
    assert tally.counts() == {"active": 1, "idle": 1}  # "later" executing, "x" idle; "nobody" not counted
