"""Workers chunkserve did not start: counted in the pool, never drained by a decision,
never sent ``Shutdown``; scale-outs are answered only by the workers a provisioner started."""

from __future__ import annotations

from processors import decisions as d
from processors.agents.control import ControlShell
from processors.agents.control_config import ControlConfig
from processors.agents.control_records import command_records
from processors.autoscaler import AutoscalerConfig, resize, shutdowns
from processors.cluster import BOOTING_PREFIX, ClusterView, apply_all, to_snapshot
from processors.snapshot import Gpu, GpuState, Session, Snapshot
from schemas import records as r
from tests.processors.strategies import PAPER

CFG = AutoscalerConfig(gpu_type="h20", min_gpus=1, max_gpus=64, dwell_s=10.0)


def _provisioned(wid: str, ts: float = 0.0) -> r.WorkerProvisioned:
    return r.WorkerProvisioned(worker_id=wid, ts=ts, provisioner="provisioner-default")


def test_a_worker_no_provisioner_announced_is_external_in_the_snapshot():
    view = apply_all(ClusterView(), [
        _provisioned("default-0"),
        r.WorkerUp(worker_id="default-0", ts=1, capacity=4),
        r.WorkerUp(worker_id="by-hand", ts=1, capacity=4),
        _provisioned("late-announce", ts=2),  # announced after its WorkerUp: the fold commutes
    ])
    view = apply_all(view, [r.WorkerUp(worker_id="late-announce", ts=1, capacity=4)])
    gpus = {g.id: g.external for g in to_snapshot(view, 2.0).gpus}
    assert gpus == {"default-0": False, "by-hand": True, "late-announce": False}


def test_scale_in_never_drains_an_external_worker_but_counts_its_slots():
    gpus = (Gpu("a-hand", "h20", external=True), Gpu("g1", "h20"), Gpu("g2", "h20"))
    snap = Snapshot(100.0, gpus, ())
    drains = resize(snap, PAPER, 0.0, CFG, grow=False)
    assert Drain_ids(drains) == ["g1", "g2"]  # the least loaded by id would have been a-hand
    # it is capacity all the same: a demand it covers asks for no new GPU
    k = PAPER["h20"].capacity
    only_hand = Snapshot(100.0, gpus[:1], tuple(Session(f"s{i}", gpu_id="a-hand") for i in range(k - 1)))
    assert resize(only_hand, PAPER, k, CFG, grow=True) == ()
    assert resize(only_hand, PAPER, k + 1, CFG, grow=True) == (d.Boot(1, "h20"),)


def Drain_ids(cmds: tuple[d.Command, ...]) -> list[str]:
    assert all(isinstance(c, d.Vacate) for c in cmds)
    return [c.gpu_id for c in cmds]  # type: ignore[union-attr]


def test_an_external_worker_drained_by_an_operator_is_never_shut_down():
    snap = Snapshot(100.0, (Gpu("by-hand", "h20", GpuState.DRAINING, external=True),
                            Gpu("g1", "h20", GpuState.DRAINING)), ())
    assert shutdowns(snap) == (d.Retire("g1"),)
    # and whatever a policy asks, the shell sends none to a worker no provisioner announced
    view = apply_all(ClusterView(), [r.WorkerUp(worker_id="by-hand", ts=1, capacity=4),
                                     r.Drain(pool="default", worker_id="by-hand", ts=2)])
    assert command_records([d.Retire("by-hand")], view, 50.0) == ()
    assert command_records([d.Vacate("by-hand")], view, 50.0) != ()  # draining it is allowed


def test_a_hand_started_worker_does_not_answer_a_scale_out():
    view = apply_all(ClusterView(), [
        r.ScaleOut(pool="default", count=1, ts=10.0, gpu_type="cpu", decision_id="x"),
        r.WorkerUp(worker_id="by-hand", ts=11.0, capacity=4),
    ])
    booting = [g.id for g in to_snapshot(view, 12.0).gpus if g.id.startswith(BOOTING_PREFIX)]
    assert booting == [BOOTING_PREFIX + "default:0"]
    view = apply_all(view, [_provisioned("default-0", 10.5),
                            r.WorkerUp(worker_id="default-0", ts=13.0, capacity=4)])
    assert not [g for g in to_snapshot(view, 14.0).gpus if g.id.startswith(BOOTING_PREFIX)]


def test_control_shell_scales_in_around_a_hand_started_worker_and_sends_nothing_forever():
    """Ten idle minutes of rounds with a hand-started worker beside three provisioned ones:
    the spare provisioned ones are drained and shut down (once each: the provisioner stops
    them), the hand-started one never gets a scaling command."""
    shell = ControlShell(ControlConfig(dwell_s=1.0, boot_s=2.0, burst_memory_s=0.0, min_gpus=1))
    shell.fold(r.WorkerUp(worker_id="a-hand", ts=0.0, capacity=8))  # sorts first: least loaded, by id
    for i in range(3):
        shell.fold(_provisioned(f"default-{i}"))
        shell.fold(r.WorkerUp(worker_id=f"default-{i}", ts=0.0, capacity=8))
    sent: list[r.Record] = []
    for step in range(120):
        now = 5.0 * (step + 1)
        for w in shell.view.workers.values():
            if w.alive:
                shell.fold(r.Heartbeat(worker_id=w.id, ts=now - 0.5, sessions=0, executing=0, capacity=8))
        for rec in shell.decide(now):
            if isinstance(rec, (r.ScaleOut, r.Drain, r.Shutdown)):
                sent.append(rec)
            if isinstance(rec, r.Shutdown):  # the provisioner stops it
                shell.fold(r.WorkerDown(worker_id=rec.worker_id, ts=now + 1, reason="shutdown by provisioner"))
    assert not [x for x in sent if getattr(x, "worker_id", "") == "a-hand"]
    shut = [x.worker_id for x in sent if isinstance(x, r.Shutdown)]
    assert sorted(shut) == ["default-0", "default-1", "default-2"]  # each once; a-hand is the one kept
    assert not [x for x in sent if isinstance(x, r.ScaleOut)]  # the hand-started worker is capacity


def test_an_announcement_outlives_the_epochs_before_its_worker_comes_up():
    """The provisioner announces a worker seconds before its model is loaded; the rounds
    between (each pruning the view) must not forget it."""
    shell = ControlShell(ControlConfig(min_gpus=1))  # (a floor of two would boot a second)
    shell.fold(_provisioned("default-0", ts=100.0))
    for now in (101.0, 102.0, 103.0):
        shell.decide(now)
    shell.fold(r.WorkerUp(worker_id="default-0", ts=104.0, capacity=8))
    (gpu,) = to_snapshot(shell.view, 104.5).gpus
    assert gpu.id == "default-0" and not gpu.external


def test_a_worker_of_a_gpu_type_the_profile_lacks_is_named_and_left_out(caplog):
    shell = ControlShell(ControlConfig(profile="paper", gpu_type="h20"))
    shell.fold(r.WorkerUp(worker_id="odd", ts=1, capacity=4, gpu_type="nope"))
    shell.fold(r.WorkerUp(worker_id="ok", ts=1, capacity=4, gpu_type="h20"))
    named = [m for m in caplog.messages if "GPU type" in m]
    assert len(named) == 1 and "odd" in named[0] and "'nope'" in named[0] and "h20" in named[0]
    snap = to_snapshot(shell.view, 2.0, gpu_types=set(shell.model))
    assert [g.id for g in snap.gpus] == ["ok"]
