"""Shared hypothesis strategies and a tiny command applier for the decision-core tests."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from processors.decisions import Command, Vacate, Migrate, Place, Restore, Boot, Retire
from processors.latency import GpuProfile, LatencyModel, load_profiles
from processors.lifecycle import SessionState
from processors.snapshot import Gpu, GpuState, Session, Snapshot

PAPER = load_profiles("paper")
SMALL = LatencyModel(
    {
        "a": GpuProfile("a", 4, 1.0, ((1, 0.4), (2, 0.55), (4, 1.0))),
        "b": GpuProfile("b", 6, 2.5, ((1, 0.3), (3, 0.6), (6, 1.0))),
    },
    "small",
)


@st.composite
def snapshots(draw, model: LatencyModel = PAPER, max_gpus: int = 12, draining: bool = False, booting: bool = False) -> Snapshot:
    """A random pool (mixed types, maybe draining/booting GPUs) with sessions that fit it."""
    types = sorted(model)
    m = draw(st.integers(1, max_gpus))
    states = [GpuState.READY]
    if draining:
        states.append(GpuState.DRAINING)
    if booting:
        states.append(GpuState.BOOTING)
    gpus = []
    for i in range(m):
        state = draw(st.sampled_from(states)) if i else GpuState.READY
        gpus.append(Gpu(f"g{i:03d}", draw(st.sampled_from(types)), state))
    sessions = []
    for g in gpus:
        if g.state is GpuState.BOOTING:
            continue
        for _ in range(draw(st.integers(0, model[g.type].capacity))):
            sessions.append(Session(f"s{len(sessions)}", draw(st.integers(0, 4 << 30)), gpu_id=g.id))
    for _ in range(draw(st.integers(0, 6))):
        life = draw(st.sampled_from([SessionState.EXECUTION, SessionState.EXECUTION, SessionState.SUSPENDED]))
        sessions.append(Session(f"s{len(sessions)}", draw(st.integers(0, 4 << 30)), life, restore=draw(st.booleans())))
    order = draw(st.permutations(range(len(sessions)))) if len(sessions) < 40 else range(len(sessions))
    return Snapshot(draw(st.floats(0, 1e6)), tuple(gpus), tuple(sessions[i] for i in order))


def apply(snapshot: Snapshot, commands: tuple[Command, ...], model: LatencyModel = PAPER) -> Snapshot:
    """The snapshot once every command has completed (migrations done, GPUs booted)."""
    sessions = {s.id: s for s in snapshot.sessions}
    gpus = {g.id: g for g in snapshot.gpus}
    for c in commands:
        if isinstance(c, (Place, Restore)):
            assert sessions[c.session_id].gpu_id is None or sessions[c.session_id].gpu_id not in gpus
            sessions[c.session_id] = replace(sessions[c.session_id], gpu_id=c.gpu_id, restore=False)
        elif isinstance(c, Migrate):
            assert sessions[c.session_id].gpu_id == c.src
            sessions[c.session_id] = replace(sessions[c.session_id], gpu_id=c.dst)
        elif isinstance(c, Vacate):
            gpus[c.gpu_id] = replace(gpus[c.gpu_id], state=GpuState.DRAINING)
        elif isinstance(c, Retire):
            assert all(s.gpu_id != c.gpu_id for s in sessions.values())
            del gpus[c.gpu_id]
        elif isinstance(c, Boot):
            for k in range(c.count):
                gid = f"new{len(gpus):04d}"
                gpus[gid] = Gpu(gid, c.gpu_type, GpuState.BOOTING)
    return Snapshot(snapshot.now, tuple(gpus.values()), tuple(sessions.values()))
