"""Recovery of sessions whose owner was lost: what to do next with one queued session.

A worker declared dead (or restarted without its sessions) leaves a recovery owed for each
session it held: the store records the epoch that must be superseded (``stranded_epoch``) and
queues the session (``streams.generations``: ``strand``). Any dispatch replica sweeps the
queue, earliest first, and carries out :func:`next_step` for each entry until the session
has a new owner that claimed it, or is closed. Pure: the session as stored and whether its
owner is down come in, one step goes out.
"""

from __future__ import annotations

from enum import Enum

from streams.generations import SessionView, StoreState

__all__ = ["Step", "next_step", "CLAIM_GRACE_S"]

# a recovered session's new owner has this long to claim it before its Assign is sent again
CLAIM_GRACE_S = 10.0


class Step(str, Enum):
    """One recovery step for a queued session."""

    DROP = "drop"  # nothing owed any more: leave the queue
    CLOSE = "close"  # its user closed it: release it for good, refuse its unapplied inputs
    RECOVER = "recover"  # commit a new generation on a live worker (waits, in order, for a slot)
    RESEND = "resend"  # committed, not claimed within the grace: send the Assign again


def next_step(session: "SessionView | None", owner_down: bool) -> Step:
    """What a due queue entry needs. A close always wins (and a session closed while a
    recovery was under way has its unapplied inputs refused); a session moved on and claimed
    by a live owner is done; an offloaded one is resumed by its user's next event, not here."""
    if session is None:
        return Step.DROP
    if session.close_requested or session.state == StoreState.CLOSED:
        return Step.CLOSE
    if session.state != StoreState.ACTIVE or session.stranded_epoch is None:
        return Step.DROP
    if owner_down or session.generation.epoch == session.stranded_epoch:
        return Step.RECOVER
    return Step.DROP if session.claimed else Step.RESEND
