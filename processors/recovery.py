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

from streams.store_records import SessionView, StoreState

__all__ = ["Step", "RECOVERIES", "next_step", "waits", "outlived", "CLAIM_GRACE_S"]

# a recovered session's new owner has this long to claim it before its Assign is sent again
CLAIM_GRACE_S = 10.0


class Step(str, Enum):
    """One recovery step for a queued session: everything the shell does with it."""

    DROP = "drop"  # nothing owed any more: leave the queue
    CLOSE = "close"  # its user closed it: release it for good, then refuse its unapplied inputs
    REFUSE = "refuse"  # closed already (mid-recovery): refuse its unapplied inputs
    RECOVER = "recover"  # commit a new generation on a live worker (waits, in order, for a slot)
    TAKE_BACK = "take_back"  # its owner is up again (restarted): its own slot first, else as RECOVER
    RESEND = "resend"  # committed, not claimed within the grace: send the Assign again


def next_step(session: "SessionView | None", owner_down: bool) -> Step:
    """What a due queue entry needs. A close always wins (and a session closed while a
    recovery was under way has its unapplied inputs refused); a session moved on and claimed
    by a live owner is done; an offloaded one is resumed by its user's next event, not here."""
    if session is None:
        return Step.DROP
    if session.state == StoreState.CLOSED:
        return Step.REFUSE
    if session.close_requested:
        return Step.CLOSE
    if session.state != StoreState.ACTIVE or session.stranded_epoch is None:
        return Step.DROP
    if owner_down:
        return Step.RECOVER
    if session.generation.epoch == session.stranded_epoch:
        return Step.TAKE_BACK
    return Step.DROP if session.claimed else Step.RESEND


# the steps that take a slot
RECOVERIES = frozenset({Step.RECOVER, Step.TAKE_BACK})


def waits(step: Step, waiting: bool) -> bool:
    """Whether a due entry waits this sweep: once one recovery found no free slot
    (``waiting``), every later one waits with it (the queue is served in order, earliest first)."""
    return waiting and step in RECOVERIES


def outlived(down_ts: float, alive_ts: float | None) -> bool:
    """Whether a worker's death declared at ``down_ts`` is stale: a sign of life after it
    (``alive_ts``, its latest heartbeat or start) came before it in the log. A death declared
    by the worker itself or for missed heartbeats is later than every sign of life before it;
    one that is not is a copy of an earlier declaration written again, or one the worker
    outlived. Control's view reads it so too (alive while last seen > down; at the same
    instant, down)."""
    return alive_ts is not None and down_ts < alive_ts
