"""The simulator and the live control plane, fed the same session events, take the same
decisions: the same sessions land on the same GPUs, the same admission plans and the same
moves come out. The live side is the control processor's shell (``ControlShell``) and the
dispatch core (``processors.dispatch.decide``), pure, with the store's commit played by a
dict; the simulator runs the same policy spec on the same latency profile."""

from __future__ import annotations

from dataclasses import replace

from processors import decisions as d
from processors.agents.control import ControlShell
from processors.agents.control_config import ControlConfig, make_policy
from processors.admission import AdmitPlan, WorkerLoad
from processors.dispatch import Commit, Committed, DispatchView, Facts, Retry, RetryLater, Seen, decide
from processors.latency import load_profiles
from processors.lifecycle import EventKind, SessionEvent, SessionState
from infra.sim.simulator import SimConfig, simulate
from schemas import records as r

import pytest

from processors.decisions import Decision

PROFILE, GPU_TYPE, GPUS = "reference-cpu", "cpu", 3


class Packing:
    """A plug-in that packs: its order fills the first GPU, then the next; a session it must
    place itself goes to the last GPU. Where its two rules differ, only the one that runs
    shows."""

    name = "packing"

    def initial_state(self):
        return None

    def decide(self, snapshot, signal, state):
        loads, cap = snapshot.loads(), load_profiles(PROFILE)[GPU_TYPE].capacity
        ids = sorted(g.id for g in snapshot.gpus)
        waiting = [s for s in snapshot.sessions if s.lifecycle is SessionState.EXECUTION and s.gpu_id is None]
        place = tuple(d.Place(s.id, ids[-1]) for s in waiting)
        loads[ids[-1]] += len(waiting)
        order = tuple((g, n) for g in ids for n in range(loads[g] + 1, cap + 1))
        return Decision(place + (d.Admit(order, fallback=False),), None)


class Recorder:
    """The policy, recording what each decision saw placed and what it said."""

    def __init__(self, inner):
        self.inner, self.name, self.log = inner, inner.name, []

    def initial_state(self):
        return self.inner.initial_state()

    def decide(self, snapshot, signal, state):
        decision = self.inner.decide(snapshot, signal, state)
        placed = {s.id: s.gpu_id for s in snapshot.sessions if s.lifecycle is SessionState.EXECUTION}
        self.log.append((snapshot.now, placed, decision.commands))
        return decision


def _events() -> list[SessionEvent]:
    """Arrivals in waves on the 0.5 s grid (several per instant), some closes between them."""
    out, n = [], 0
    for k, wave in enumerate((4, 1, 3, 0, 5, 2, 0, 3)):
        t = 0.5 * (k + 1)
        for _ in range(wave):
            out.append(SessionEvent(t, f"s{n:02d}", EventKind.OPEN, 1 << 20))
            n += 1
        if k in (3, 6):
            for sid in (f"s{k - 2:02d}", f"s{k + 1:02d}"):
                out.append(SessionEvent(t, sid, EventKind.CLOSE))
    return out


@pytest.mark.parametrize("policy", ["turboserve-no-autoscale", "least-loaded-offload", f"{__name__}:Packing"])
def test_simulator_and_control_plane_decide_alike(policy: str):
    model = load_profiles(PROFILE)
    events = _events()
    recorder = Recorder(make_policy(policy, model, GPU_TYPE))
    simulate(recorder, events, model, SimConfig(gpu_type=GPU_TYPE, initial_gpus=GPUS, tick_s=100.0))
    assert len(recorder.log) >= 6
    gpus = [f"g{i:05d}" for i in range(GPUS)]  # the simulator's names for its GPUs
    cap = model[GPU_TYPE].capacity

    control = ControlShell(ControlConfig(policy=policy, profile=PROFILE, gpu_type=GPU_TYPE), clock=lambda: 0.0)
    for g in gpus:
        control.fold(r.WorkerUp(worker_id=g, ts=0.0, capacity=cap, gpu_type=GPU_TYPE, pool="default"))
    where: dict[str, str] = {}
    epochs: dict[str, int] = {}
    dispatch = DispatchView({}, admission_retries=0)
    plan = None
    # the trace starts with the controller's first round: until its plan, sessions wait for it
    dispatch = DispatchView({}, plan=AdmitPlan(fallback=False), admission_retries=5)
    waiting: list = []

    def admit(cmds: list, now: float) -> None:
        nonlocal dispatch
        for c in cmds:
            if isinstance(c, RetryLater):
                waiting.append(c.admission)
            elif isinstance(c, Commit):
                sid = c.admission.session_id
                gen = r.Generation(c.worker, 1)
                dispatch, _ = decide(dispatch, Committed(c.admission, gen), now)
                where[sid], epochs[sid] = c.worker, 1
                control.fold(r.Claimed(worker_id=c.worker, session_id=sid, generation=gen, ts=now))

    def loads() -> dict:
        return {g: WorkerLoad(sum(1 for w in where.values() if w == g), cap) for g in gpus}

    for now, sim_placed, sim_commands in recorder.log:
        for g in gpus:
            control.fold(r.Heartbeat(worker_id=g, ts=now, sessions=0, executing=0, capacity=cap))
        for ev in (e for e in events if e.t == now):
            if ev.kind is EventKind.OPEN:
                rec = r.SessionOpened(session_id=ev.session_id, ts=now, state_bytes=ev.state_bytes)
                control.fold(rec)
                dispatch = replace(dispatch, workers=loads())
                dispatch, cmds = decide(dispatch, Seen(rec, Facts(None)), now)
                admit(cmds, now)
            else:
                control.fold(r.SessionClosed(session_id=ev.session_id, ts=now))
                where.pop(ev.session_id, None)
        out = control.decide(now)
        for rec in out:
            if isinstance(rec, r.AdmissionPlan):
                plan = rec
                dispatch, _ = decide(dispatch, Seen(rec, Facts(None)), now)
                for adm in waiting[:]:  # the plan pins the sessions that waited for it
                    waiting.remove(adm)
                    dispatch = replace(dispatch, workers=loads())
                    dispatch, cmds = decide(dispatch, Retry(adm, Facts(None)), now)
                    admit(cmds, now)
            elif isinstance(rec, r.Handoff):  # the move commits: the target claims the next epoch
                epochs[rec.session_id] += 1
                gen = r.Generation(rec.target_worker, epochs[rec.session_id])
                where[rec.session_id] = rec.target_worker
                control.fold(r.Claimed(worker_id=rec.target_worker, session_id=rec.session_id, generation=gen, ts=now))
        sim_moves = sorted((c.session_id, c.src, c.dst) for c in sim_commands if isinstance(c, d.Migrate))
        live_moves = sorted((x.session_id, x.worker_id, x.target_worker) for x in out if isinstance(x, r.Handoff))
        assert live_moves == sim_moves, f"moves differ at {now}"
        after = {k: v for k, v in sim_placed.items() if v is not None}
        after.update({c.session_id: c.gpu_id for c in sim_commands if isinstance(c, (d.Place, d.Restore))})
        after.update({c.session_id: c.dst for c in sim_commands if isinstance(c, d.Migrate)})
        assert where == after, f"placements differ at {now}"
        (sim_admit,) = [c for c in sim_commands if isinstance(c, d.Admit)]
        assert plan is not None and tuple((x.worker_id, x.count) for x in plan.order) == sim_admit.order[:len(plan.order)]
