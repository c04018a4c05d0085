"""Commands the decision core returns; a thin shell carries them out.

Every command is a frozen, slotted record with a ``kind`` tag. Decisions never act: they
return these records plus the policy's new state (:class:`Decision`).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import isfinite
from numbers import Integral, Real
from operator import itemgetter
from typing import Any, ClassVar, Union

__all__ = [
    "Place",
    "Restore",
    "Migrate",
    "Offload",
    "Discard",
    "Boot",
    "Vacate",
    "Reinstate",
    "Retire",
    "Admit",
    "Command",
    "Decision",
    "well_formed",
]


@dataclass(frozen=True, slots=True)
class Place:
    """Start a new session on ``gpu_id``."""

    kind: ClassVar[str] = "place"
    session_id: str
    gpu_id: str


@dataclass(frozen=True, slots=True)
class Restore:
    """Restore a suspended (or orphaned) session's state onto ``gpu_id``."""

    kind: ClassVar[str] = "restore"
    session_id: str
    gpu_id: str


@dataclass(frozen=True, slots=True)
class Migrate:
    """Move a session at a chunk boundary.

    ``gamma`` is the net gain of the rebalance step the move belongs to (a step moves one
    session off each bottleneck GPU); ``cost_s`` is the alpha-beta transfer estimate kappa.
    ``reason`` is ``"rebalance"`` or ``"drain"`` (forced evacuation of a draining GPU).
    """

    kind: ClassVar[str] = "migrate"
    session_id: str
    src: str
    dst: str
    gamma: float
    cost_s: float
    reason: str = "rebalance"


@dataclass(frozen=True, slots=True)
class Offload:
    """Offload an idle session's state off ``gpu_id`` (GPU -> host -> snapshot)."""

    kind: ClassVar[str] = "offload"
    session_id: str
    gpu_id: str | None


@dataclass(frozen=True, slots=True)
class Discard:
    """End a session and free its state; ``gpu_id`` is where it ran, if anywhere."""

    kind: ClassVar[str] = "discard"
    session_id: str
    gpu_id: str | None


@dataclass(frozen=True, slots=True)
class Boot:
    """Boot ``count`` GPUs of ``gpu_type``; they are unusable until booted."""

    kind: ClassVar[str] = "boot"
    count: int
    gpu_type: str


@dataclass(frozen=True, slots=True)
class Vacate:
    """Stop placing on ``gpu_id``; its sessions are migrated off before shutdown."""

    kind: ClassVar[str] = "vacate"
    gpu_id: str


@dataclass(frozen=True, slots=True)
class Reinstate:
    """Take draining ``gpu_id`` back into the pool: sessions are placed there again."""

    kind: ClassVar[str] = "reinstate"
    gpu_id: str


@dataclass(frozen=True, slots=True)
class Retire:
    """Release ``gpu_id``; only ever issued for a draining GPU that holds no session."""

    kind: ClassVar[str] = "retire"
    gpu_id: str


@dataclass(frozen=True, slots=True)
class Admit:
    """Where the sessions that arrive or resume before the next round go: ``order`` is
    (gpu_id, count) entries; each goes to the first entry whose GPU holds fewer than
    ``count`` sessions (:func:`processors.admission.candidate`), past the order to the
    least-loaded GPU when ``fallback``. Without it (and for a policy that issues no Admit)
    a session waits for the policy's own Place or Restore at the next round."""

    kind: ClassVar[str] = "admit"
    order: tuple[tuple[str, int], ...]
    fallback: bool = True


Command = Union[Place, Restore, Migrate, Offload, Discard, Boot, Vacate, Reinstate, Retire, Admit]


@dataclass(frozen=True, slots=True)
class Decision:
    """What one decision round returns: commands in execution order, and the new state."""

    commands: tuple[Command, ...]
    state: Any = None


def _name(x: object) -> bool:
    return isinstance(x, str)


def _name_or_none(x: object) -> bool:
    return x is None or isinstance(x, str)


def _number(x: object) -> bool:
    return isinstance(x, Real) and not isinstance(x, bool)  # numpy's scalars too (a plug-in's arithmetic)


_PAIRS, _NUMBERS, _NAMES = frozenset((tuple, list)), frozenset((int, float)), frozenset((str,))
_FIRST, _SECOND = itemgetter(0), itemgetter(1)


def _order(order: object) -> bool:
    """Pairs of a GPU id and a finite count (an infinite one, or NaN, would admit without
    bound in the simulator and cannot be carried live)."""
    if not isinstance(order, (tuple, list)):
        return False
    # the common shape (pairs of plain str and int or float) checked a column at a time in C,
    # as every round's admission order is; anything else (subclasses included) entry by entry
    if (_PAIRS.issuperset(map(type, order)) and set(map(len, order)) <= {2} and _NAMES.issuperset(map(type, map(_FIRST, order)))
            and _NUMBERS.issuperset(map(type, map(_SECOND, order)))):
        return all(map(isfinite, [n for _, n in order if type(n) is float]))
    return all(isinstance(e, (tuple, list)) and len(e) == 2 and isinstance(e[0], str) and _number(e[1])
               and (isinstance(e[1], Integral) or isfinite(e[1])) for e in order)


_FIELDS: dict[type, tuple[tuple[str, Any], ...]] = {
    Place: (("session_id", _name), ("gpu_id", _name)),
    Restore: (("session_id", _name), ("gpu_id", _name)),
    Migrate: (("session_id", _name), ("src", _name), ("dst", _name), ("gamma", _number), ("cost_s", _number), ("reason", _name)),
    Offload: (("session_id", _name), ("gpu_id", _name_or_none)),
    Discard: (("session_id", _name), ("gpu_id", _name_or_none)),
    Boot: (("count", _number), ("gpu_type", _name)),  # a fraction or a huge count: the shell's to refuse
    Vacate: (("gpu_id", _name),),
    Reinstate: (("gpu_id", _name),),
    Retire: (("gpu_id", _name),),
    Admit: (("order", _order), ("fallback", lambda x: isinstance(x, bool))),
}


def well_formed(cmd: object) -> bool:
    """Whether ``cmd`` is a command whose fields hold what they are declared to (the
    dataclasses do not check: a plug-in's ``Place(5, None)`` builds). A shell counts one
    that is not as an invalid command instead of carrying it out."""
    fields = _FIELDS.get(type(cmd))
    return fields is not None and all(ok(getattr(cmd, f)) for f, ok in fields)
