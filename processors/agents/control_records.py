"""The records a control round sends (pure): a policy's commands as ``Handoff``,
``ScaleOut``, ``Drain``, ``Reinstate`` and ``Shutdown`` records, and the admission plan dispatch admits
sessions by (``Admit``, ``Place``, ``Restore``)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Iterable

from processors import decisions as d
from processors.cluster import BOOTING_PREFIX, ClusterView, current_generation
from processors.placement import ADMIT_LIMIT
from schemas import records as r

__all__ = ["carried", "command_records", "admission_plan", "ADMIT_ORDER_MAX", "ADMIT_PINS_MAX", "ADMIT_PINS_BYTES", "ADMIT_COUNT_MAX"]

# an admission plan carries at most this many order entries and pinned sessions (the
# sessions of one round; past them a session waits for the next plan, or goes least-loaded)
ADMIT_ORDER_MAX = ADMIT_LIMIT
ADMIT_PINS_MAX = 256
ADMIT_PINS_BYTES = 32 * 1024
# an entry's count past this admits the same sessions (no GPU type holds more: K <= 4,096),
# and the record's 64-bit field would refuse a policy's 1e30
ADMIT_COUNT_MAX = 1 << 20


def carried(commands: Iterable[object]) -> tuple[tuple[d.Command, ...], int]:
    """(the commands a round can carry out, how many it cannot) (pure). A plug-in's
    arithmetic may hand numpy's scalars or 3.0 for a count: counts become Python ints (an
    admission entry's count rounded up, which admits the same sessions, and held to
    ADMIT_COUNT_MAX; one under 1 admits none and is left out), a Boot of no whole count from 1 and a command whose fields hold
    the wrong types (:func:`processors.decisions.well_formed`) are not carried out: the
    wire records would refuse them, and the round with them."""
    given = tuple(commands)
    out: list[d.Command] = []
    for cmd in given:
        if not d.well_formed(cmd):
            continue
        if isinstance(cmd, d.Boot):
            n = cmd.count
            if not (math.isfinite(n) and n == int(n) and n >= 1):
                continue
            cmd = d.Boot(int(n), cmd.gpu_type)
        elif isinstance(cmd, d.Admit):  # well formed: finite counts
            cmd = d.Admit(tuple((g, min(math.ceil(n), ADMIT_COUNT_MAX)) for g, n in cmd.order if n > 0), cmd.fallback)
        out.append(cmd)
    return tuple(out), len(given) - len(out)


def command_records(commands: Iterable[d.Command], view: ClusterView, now: float, *,
                    pool: str = "default", decision_id: str = "",
                    shutdown_resend_s: float = 10.0) -> tuple[r.Record, ...]:
    """The records that carry out a policy's commands (pure).

    ``Migrate`` -> ``Handoff`` stamped with the view's current generation of the session
    (dropped when the view has none on the source, or the target is a booting placeholder);
    ``Boot`` -> a ``ScaleOut`` of ``pool`` (one per GPU type, the Boots' counts summed);
    ``Vacate`` / ``Reinstate`` / ``Retire`` -> ``Drain`` / ``Reinstate`` / ``Shutdown`` for the
    worker's pool (no ``Reinstate`` for a worker sent a ``Shutdown`` since its drain; a
    ``Shutdown`` sent less than ``shutdown_resend_s`` ago is not
    repeated, and none goes to a worker no provisioner announced: it was started outside
    chunkserve). ``Admit``, ``Place`` and ``Restore`` go to dispatch as one plan
    (:func:`admission_plan`); Offload and Discard follow the user's events, which dispatch
    carries out: dropped.
    """
    out: list[r.Record] = []
    pools = {w.id: w.pool for w in view.workers.values()}
    boots: dict[str, int] = {}  # GPU type -> where its ScaleOut sits in ``out``
    for cmd in commands:
        match cmd:
            case d.Migrate(session_id=sid, src=src, dst=dst) if not dst.startswith(BOOTING_PREFIX):
                gen = current_generation(view, sid)
                if gen is not None and gen.worker_id == src:
                    out.append(r.Handoff(worker_id=src, session_id=sid, generation=gen, target_worker=dst,
                                         ts=now, reason=cmd.reason))
            case d.Boot(count=count, gpu_type=gpu_type) if gpu_type in boots:
                # one ScaleOut per decision and GPU type (a provisioner carries out a decision
                # id once: the floor's Boot beside the autoscaler's was refused as a replay)
                at = boots[gpu_type]  # the sum at most what a provisioner takes (past it, it took none)
                out[at] = replace(out[at], count=min(out[at].count + count, r.SCALE_OUT_MAX))  # type: ignore[union-attr]
            case d.Boot(count=count, gpu_type=gpu_type):
                boots[gpu_type] = len(out)
                out.append(r.ScaleOut(pool=pool, count=min(count, r.SCALE_OUT_MAX), ts=now, gpu_type=gpu_type,
                                      decision_id=decision_id))
            case d.Vacate(gpu_id=gid) if not gid.startswith(BOOTING_PREFIX):
                out.append(r.Drain(pool=pools.get(gid, pool), worker_id=gid, ts=now, decision_id=decision_id))
            case d.Reinstate(gpu_id=gid) if not gid.startswith(BOOTING_PREFIX):
                w = view.workers.get(gid)
                if w is None or w.shutdown_ts < w.drain_ts:  # a worker asked to stop stays stopping
                    out.append(r.Reinstate(pool=pools.get(gid, pool), worker_id=gid, ts=now, decision_id=decision_id))
            case d.Retire(gpu_id=gid) if not gid.startswith(BOOTING_PREFIX):
                w = view.workers.get(gid)
                if w is not None and w.provisioned and now - w.shutdown_ts >= shutdown_resend_s:
                    out.append(r.Shutdown(pool=pools.get(gid, pool), worker_id=gid, ts=now, decision_id=decision_id))
                # else: unknown or started outside chunkserve: no provisioner here can stop it
    return tuple(out)


def admission_plan(commands: Iterable[d.Command], now: float, *, pool: str = "default",
                   policy: str = "", decision_id: str = "") -> r.AdmissionPlan:
    """The plan dispatch admits sessions by until the next round (pure): the policy's
    ``Admit`` order, and the sessions it placed itself (``Place``, ``Restore``) pinned to their
    GPU. A policy that issues no Admit gets a plan without fallback: its sessions wait for
    its pins, as in the simulator. Booting placeholders are left out (no worker to commit on)."""
    order: tuple[tuple[str, int], ...] = ()
    fallback = False
    pinned: dict[str, str] = {}
    for cmd in commands:
        match cmd:
            case d.Admit():
                order, fallback = cmd.order, cmd.fallback
            case d.Place(session_id=sid, gpu_id=gid) | d.Restore(session_id=sid, gpu_id=gid) if (
                    not gid.startswith(BOOTING_PREFIX)):
                pinned[sid] = gid
    slots = tuple(r.AdmitSlot(worker_id=g, count=n) for g, n in order
                  if not g.startswith(BOOTING_PREFIX))[:ADMIT_ORDER_MAX]
    return r.AdmissionPlan(pool=pool, ts=now, policy=policy, order=slots, fallback=fallback,
                           pinned=_bounded(pinned), decision_id=decision_id)


def _bounded(pinned: dict[str, str]) -> dict[str, str]:
    """The first pins, at most ADMIT_PINS_MAX and about ADMIT_PINS_BYTES of ids (the topic's
    record limit is 64 KiB); the rest wait for the next plan."""
    out: dict[str, str] = {}
    size = 0
    for sid, gpu in pinned.items():
        size += len(sid) + len(gpu) + 4
        if len(out) >= ADMIT_PINS_MAX or size > ADMIT_PINS_BYTES:
            break
        out[sid] = gpu
    return out
