"""Plug-in policies for the simulator tests, loaded by ``module:Name`` path."""

from __future__ import annotations

import time
from dataclasses import dataclass

from processors.decisions import Admit, Decision, Migrate, Offload, Place, Boot, Reinstate, Restore, Retire, Vacate
from processors.lifecycle import SessionState
from processors.snapshot import GpuState


@dataclass(frozen=True)
class PackThenMigrate:
    """Places every session on the first GPU, then moves ``session`` to the second at ``at``."""

    session: str = "b"
    at: float = 5.0
    name: str = "pack-then-migrate"

    def initial_state(self) -> bool:
        return False

    def decide(self, snapshot, signal, moved):
        gpus = sorted(g.id for g in snapshot.gpus)
        cmds = [Place(s.id, gpus[0]) for s in snapshot.sessions if s.gpu_id is None and s.lifecycle is SessionState.EXECUTION]
        if not moved and snapshot.now >= self.at:
            s = next(x for x in snapshot.sessions if x.id == self.session)
            cmds.append(Migrate(s.id, s.gpu_id, gpus[1], 0.0, 0.0))
            moved = True
        return Decision(tuple(cmds), moved)


@dataclass(frozen=True)
class BootOne:
    """Boots one GPU at the first epoch and places waiting sessions on ready GPUs."""

    name: str = "boot-one"

    def initial_state(self) -> bool:
        return False

    def decide(self, snapshot, signal, booted):
        cmds = [] if booted else [Boot(1, "b300")]
        ready = [g.id for g in snapshot.gpus if g.state is GpuState.READY]
        if ready:
            cmds += [Place(s.id, ready[0]) for s in snapshot.sessions if s.gpu_id is None]
        return Decision(tuple(cmds), True)


@dataclass(frozen=True)
class BootAt:
    """Boots one GPU at the first epoch at or after ``at`` and places waiting sessions."""

    at: float = 10.0
    name: str = "boot-at"

    def initial_state(self) -> bool:
        return False

    def decide(self, snapshot, signal, booted):
        cmds = []
        if not booted and snapshot.now >= self.at:
            cmds, booted = [Boot(1, "b300")], True
        ready = [g.id for g in snapshot.gpus if g.state is GpuState.READY]
        if ready:
            cmds += [Place(s.id, ready[0]) for s in snapshot.sessions if s.gpu_id is None]
        return Decision(tuple(cmds), booted)


@dataclass(frozen=True)
class PlaceAlways:
    """Puts every waiting session on the first ready GPU with ``Place``, resumed ones too."""

    name: str = "place-always"

    def initial_state(self) -> None:
        return None

    def decide(self, snapshot, signal, state):
        ready = sorted(g.id for g in snapshot.gpus if g.state is GpuState.READY)
        waiting = [s for s in snapshot.sessions if s.gpu_id is None and s.lifecycle is SessionState.EXECUTION]
        return Decision(tuple(Place(s.id, ready[0]) for s in waiting) if ready else (), None)


@dataclass(frozen=True)
class Optioned:
    """Takes the options every policy is offered; boots one GPU of ``gpu_type`` and packs onto it."""

    model: object = None
    gpu_type: str = "b300"
    boot_s: float = 0.0
    table: object = None
    slo: object = None
    name: str = "optioned"

    def initial_state(self) -> bool:
        return False

    def decide(self, snapshot, signal, booted):
        cmds = [] if booted or snapshot.gpus else [Boot(1, self.gpu_type)]
        ready = sorted(g.id for g in snapshot.gpus if g.state is GpuState.READY)
        if ready:
            cmds += [Place(s.id, ready[0]) for s in snapshot.sessions if s.gpu_id is None and s.lifecycle is SessionState.EXECUTION]
        return Decision(tuple(cmds), True)


BUILT: list = []  # the SLO each SloRecorded was built with, in order


@dataclass(frozen=True)
class SloRecorded(Optioned):
    """Optioned under its own name, noting each construction's ``slo`` in :data:`BUILT`."""

    name: str = "slo-recorded"

    def __post_init__(self) -> None:
        BUILT.append(self.slo)


@dataclass(frozen=True)
class Raises:
    """Raises inside ``decide`` (a plug-in's bug): the simulator names it in one line."""

    name: str = "raises"

    def initial_state(self) -> None:
        return None

    def decide(self, snapshot, signal, state):
        raise ValueError("a bug in the plug-in")


@dataclass(frozen=True)
class ListNotDecision:
    name: str = "list-not-decision"

    def initial_state(self) -> None:
        return None

    def decide(self, snapshot, signal, state):
        return []


@dataclass(frozen=True)
class NamedRr(BootOne):
    """A plug-in named as a built-in: refused, it would replace rr's row."""

    name: str = "rr"


@dataclass(frozen=True)
class NamedOracleSpaced(BootOne):
    """A plug-in named as a built-in with a space after it: its row read as the oracle's."""

    name: str = "oracle "


@dataclass(frozen=True)
class NamedTwoLines(BootOne):
    """A plug-in whose name holds a newline: refused, its row would print as two."""

    name: str = "two\nlines"


@dataclass(frozen=True)
class NamedAll(BootOne):
    """A plug-in named as the word for every policy: refused."""

    name: str = "all"


@dataclass(frozen=True)
class NamedCased(BootOne):
    """A plug-in named as a built-in but for its case: refused (two rows that read alike)."""

    name: str = "TurboServe"


@dataclass(frozen=True)
class BadBoots:
    """Boots the simulator cannot carry out (a billion GPUs, a fraction of one, a type the
    profile lacks), then one it can: each bad one counts as an invalid command."""

    name: str = "bad-boots"

    def initial_state(self) -> int:
        return 0

    def decide(self, snapshot, signal, state):
        bad = (Boot(10**9, "b300"), Boot(2.5, "b300"), Boot(1, "a100"))  # type: ignore[arg-type]
        return Decision(bad + (Boot(1, "b300"),) if state == 0 else (), state + 1)


@dataclass(frozen=True)
class OnlyBadBoots(BadBoots):
    """BadBoots without the Boot it can carry out and without a Place: every session waits, on
    the opening pool at most."""

    name: str = "only-bad-boots"

    def decide(self, snapshot, signal, state):
        d = super().decide(snapshot, signal, state)
        return Decision(d.commands[:-1], d.state)


@dataclass(frozen=True)
class Sleepy(BootOne):
    """BootOne whose first decision takes 0.5 s of host time (a policy too slow to run live)."""

    name: str = "sleepy"

    def decide(self, snapshot, signal, booted):
        if not booted:
            time.sleep(0.5)
        return super().decide(snapshot, signal, booted)


@dataclass(frozen=True)
class BadAdmit:
    """One admission order with an entry for a GPU the pool does not have and one for no
    session, beside a good one: each bad entry counts as an invalid command."""

    name: str = "bad-admit"

    def initial_state(self) -> int:
        return 0

    def decide(self, snapshot, signal, state):
        g = snapshot.gpus[0].id
        order = ((g, 3), ("nosuch", 5), (g, 0)) if state == 0 else ((g, 3),)
        return Decision((Admit(order, fallback=False),), state + 1)


@dataclass(frozen=True)
class RetireBusy:
    """Places every session on the first GPU, then at ``at`` retires that GPU (holding them,
    never drained) and places them on the second; ``empty``: retires the second instead."""

    at: float = 5.0
    empty: bool = False
    name: str = "retire-busy"

    def initial_state(self) -> bool:
        return False

    def decide(self, snapshot, signal, done):
        gpus = sorted(g.id for g in snapshot.gpus)
        if not done and snapshot.now >= self.at:
            if self.empty:
                return Decision((Retire(gpus[1]),), True)
            return Decision((Retire(gpus[0]), *(Place(s.id, gpus[1]) for s in snapshot.sessions)), True)
        cmds = [Place(s.id, gpus[0]) for s in snapshot.sessions if s.gpu_id is None and s.lifecycle is SessionState.EXECUTION]
        return Decision(tuple(cmds), done)


@dataclass(frozen=True)
class Malformed:
    """Places waiting sessions, beside commands whose fields hold the wrong types (each an
    invalid command, never a crash)."""

    name: str = "malformed"

    def initial_state(self) -> None:
        return None

    def decide(self, snapshot, signal, state):
        g = sorted(x.id for x in snapshot.gpus)[0]
        bad = (Place(5, None), Vacate([g]), Retire({}), Admit(None), Admit(((1, 2, 3),)), Boot(1, ["b300"]),
               Offload(["a"], None), Migrate("a", g, None, 0.0, 0.0), object(),  # type: ignore[arg-type]
               Admit(((g, float("inf")),)))  # admits without bound: refused as live
        return Decision(bad + tuple(Place(s.id, g) for s in snapshot.sessions if s.gpu_id is None
                                    and s.lifecycle is SessionState.EXECUTION), state)


@dataclass(frozen=True)
class OffloadElsewhere:
    """Keeps idle sessions resident, then offloads each naming a GPU it is not on."""

    name: str = "offload-elsewhere"
    keep_idle_resident: bool = True

    def initial_state(self) -> None:
        return None

    def decide(self, snapshot, signal, state):
        g = sorted(x.id for x in snapshot.gpus)[0]
        cmds = [Place(s.id, g) for s in snapshot.sessions if s.gpu_id is None and s.lifecycle is SessionState.EXECUTION]
        cmds += [Offload(s.id, "no-such-gpu") for s in snapshot.sessions if s.lifecycle is SessionState.SUSPENDED and s.gpu_id]
        return Decision(tuple(cmds), state)


@dataclass(frozen=True)
class NotATuple:
    name: str = "not-a-tuple"

    def initial_state(self) -> None:
        return None

    def decide(self, snapshot, signal, state):
        return Decision("Place", state)  # type: ignore[arg-type]


@dataclass(frozen=True)
class OffloadThenRest:
    """Keeps idle sessions resident; offloads each idle one, then rests it on a GPU again with
    ``Place`` (a free restore, before the simulator took it only from a session never placed)."""

    name: str = "offload-then-rest"
    keep_idle_resident: bool = True

    def initial_state(self) -> None:
        return None

    def decide(self, snapshot, signal, state):
        g = sorted(x.id for x in snapshot.gpus)[0]
        cmds = [Place(s.id, g) for s in snapshot.sessions if s.gpu_id is None]
        cmds += [Offload(s.id, s.gpu_id) for s in snapshot.sessions if s.lifecycle is SessionState.SUSPENDED and s.gpu_id]
        return Decision(tuple(cmds), state)


@dataclass(frozen=True)
class WholeBoots:
    """Boots whole counts of other numeric types (3.0, numpy's int64), places on the first
    GPU, and offloads every idle session itself (the simulator has already: nothing to do)."""

    name: str = "whole-boots"

    def initial_state(self) -> int:
        return 0

    def decide(self, snapshot, signal, state):
        import numpy as np

        g = sorted(x.id for x in snapshot.gpus if x.state is GpuState.READY)
        cmds: list = [Boot(1.0, "b300"), Boot(np.int64(1), "b300")] if state == 0 else []  # type: ignore[arg-type]
        cmds += [Offload(s.id, s.gpu_id) for s in snapshot.sessions if s.lifecycle is SessionState.SUSPENDED]
        if g:
            cmds += [Place(s.id, g[0]) if not s.restore else Restore(s.id, g[0]) for s in snapshot.sessions
                     if s.gpu_id is None and s.lifecycle is SessionState.EXECUTION]
        return Decision(tuple(cmds), state + 1)


@dataclass(frozen=True)
class OffloadThenSee:
    """Keeps idle sessions resident, offloads each at once, and rests on a GPU only the idle
    sessions the snapshot says have no state to restore (those that opened idle)."""

    name: str = "offload-then-see"
    keep_idle_resident: bool = True

    def initial_state(self) -> None:
        return None

    def decide(self, snapshot, signal, state):
        g = sorted(x.id for x in snapshot.gpus)[0]
        cmds = [Restore(s.id, g) if s.restore else Place(s.id, g) for s in snapshot.sessions
                if s.gpu_id is None and (s.lifecycle is SessionState.EXECUTION or not s.restore)]
        cmds += [Offload(s.id, s.gpu_id) for s in snapshot.sessions if s.lifecycle is SessionState.SUSPENDED and s.gpu_id]
        return Decision(tuple(cmds), state)


@dataclass(frozen=True)
class RestoreThenMove:
    """Places sessions on the first GPU; a session coming back is restored there and, in the
    same decision, moved to the second GPU (its state is not on the first yet)."""

    name: str = "restore-then-move"

    def initial_state(self) -> None:
        return None

    def decide(self, snapshot, signal, state):
        gpus = sorted(g.id for g in snapshot.gpus)
        cmds = []
        for s in snapshot.sessions:
            if s.gpu_id is None and s.lifecycle is SessionState.EXECUTION:
                if s.restore:
                    cmds += [Restore(s.id, gpus[0]), Migrate(s.id, gpus[0], gpus[1], 0.0, 0.0)]
                else:
                    cmds.append(Place(s.id, gpus[0]))
        return Decision(tuple(cmds), state)


@dataclass(frozen=True)
class AdmitDraining:
    """Drains the second GPU, then admits every session there: each such entry admits nobody."""

    name: str = "admit-draining"

    def initial_state(self) -> None:
        return None

    def decide(self, snapshot, signal, state):
        gpus = sorted(g.id for g in snapshot.gpus)
        return Decision((Vacate(gpus[1]), Admit(((gpus[1], 5),), fallback=False)), state)


@dataclass(frozen=True)
class DrainThenReinstate:
    """Places every waiting session on the second GPU; drains it at the first decision and
    takes it back at the first at or after ``at``, asking the first GPU (never drained) back too."""

    at: float = 5.0
    name: str = "drain-then-reinstate"

    def initial_state(self) -> int:
        return 0

    def decide(self, snapshot, signal, step):
        gpus = sorted(g.id for g in snapshot.gpus)
        cmds = [Place(s.id, gpus[1]) for s in snapshot.sessions if s.gpu_id is None and s.lifecycle is SessionState.EXECUTION]
        if step == 0:
            cmds.append(Vacate(gpus[1]))
            step = 1
        elif step == 1 and snapshot.now >= self.at:
            cmds += [Reinstate(gpus[1]), Reinstate(gpus[0])]
            step = 2
        return Decision(tuple(cmds), step)
