"""Commands the decision core returns; a thin shell carries them out.

Every command is a frozen, slotted record with a ``kind`` tag. Decisions never act: they
return these records plus the policy's new state (:class:`Decision`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Union

__all__ = [
    "Place",
    "Restore",
    "Migrate",
    "Offload",
    "Discard",
    "Boot",
    "Vacate",
    "Retire",
    "Admit",
    "Command",
    "Decision",
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


Command = Union[Place, Restore, Migrate, Offload, Discard, Boot, Vacate, Retire, Admit]


@dataclass(frozen=True, slots=True)
class Decision:
    """What one decision round returns: commands in execution order, and the new state."""

    commands: tuple[Command, ...]
    state: Any = None
