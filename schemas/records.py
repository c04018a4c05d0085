"""Every record on a chunkserve topic: frozen, slotted, typed, tagged and versioned.

Schemas only grow: a new field gets a default and the version stays decodable; an
incompatible change is a new type tag. ``ts`` is the producer's wall time in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from ._fields import ID_MAX_LEN, Count, Fraction, Id, Level, Seconds, Seq, validate_instance

__all__ = [
    "Record", "Generation", "record_types", "ReleaseReason", "RejectReason", "ID_MAX_LEN",
    # session-events
    "SessionOpened", "SessionActive", "SessionIdle", "SessionClosed",
    # session-inputs
    "InputPushed",
    # worker-commands
    "Assign", "Revoke", "Suspend", "Resume", "Terminate", "Handoff", "RoutedInput",
    # worker-events
    "WorkerUp", "Heartbeat", "WorkerDown", "WorkerProvisioned", "Claimed", "Frozen", "Released", "ChunkDone",
    "InputAccepted", "CommandRejected",
    # scaling-commands
    "ScaleOut", "SCALE_OUT_MAX", "Drain", "Reinstate", "Shutdown", "PolicyState", "AdmissionPlan", "AdmitSlot",
    # metrics
    "WorkloadSignal", "PlacementReport", "ScalingDecision", "CostTick",
    # dead-letters
    "DeadLetter",
    # each topic's records as one type
    "SessionEventRecord", "InputRecord", "WorkerCommand", "WorkerEvent", "ScalingCommand", "MetricRecord",
]

InputKind = Literal["text", "prompt", "control"]

#: why a worker stopped executing a session (``Released.reason``; prose in ``detail``)
ReleaseReason = Literal["closed", "suspended", "migrated", "revoked", "fenced"]
#: why a command or routed input was refused (``CommandRejected.reason``; prose in ``detail``):
#: ownership (``stale_epoch``, ``not_owner``, ``unknown_session``, ``ownership``), capacity
#: (``no_capacity``), inputs (``late``, ``too_many_pending``, ``closed``), bounds
#: (``over_limit``, ``snapshot_corrupt``), command signing (``unsigned``, ``unknown_key``,
#: ``forged``), the provisioner (``replayed``, ``not-provisioned``), the store's ACL
#: (``access_denied``), other failures (``error``)
RejectReason = Literal["stale_epoch", "not_owner", "unknown_session", "ownership", "no_capacity", "late",
                       "too_many_pending", "closed", "over_limit", "snapshot_corrupt", "unsigned",
                       "unknown_key", "forged", "replayed", "not-provisioned", "stopping", "access_denied", "error"]

_REGISTRY: dict[str, type["Record"]] = {}


class Record:
    """Base of every wire record: ``TAG`` names the type, ``VERSION`` its schema version."""

    __slots__ = ()
    TAG: ClassVar[str]
    VERSION: ClassVar[int] = 1

    def __post_init__(self) -> None:
        validate_instance(self)


def record(tag: str, version: int = 1) -> Any:
    """Make ``cls`` a frozen, slotted, keyword-only dataclass registered under ``tag``."""

    def wrap(cls: type) -> type:
        if tag in _REGISTRY:
            raise TypeError(f"duplicate record tag {tag!r}")
        made = dataclass(frozen=True, slots=True, kw_only=True)(cls)
        made.TAG = tag
        made.VERSION = version
        _REGISTRY[tag] = made
        return made

    return wrap


def record_types() -> dict[str, type[Record]]:
    """All registered record classes by tag."""
    return dict(_REGISTRY)


@dataclass(frozen=True, slots=True)
class Generation:
    """A session's execution authority: ``(worker_id, epoch)``; epochs start at 1."""

    worker_id: Id
    epoch: Count

    def __post_init__(self) -> None:
        validate_instance(self)

    def __str__(self) -> str:
        return f"{self.worker_id}@{self.epoch}"


# --- session-events (key: session_id) -------------------------------------------------

@record("session.opened")
class SessionOpened(Record):
    """A user opened a live session (CreateLive); it starts active."""

    session_id: Id
    ts: Seconds
    prompt: str = ""
    state_bytes: Count = 0


@record("session.active")
class SessionActive(Record):
    """The user came back: the session needs a GPU again. For a session no open was seen
    for (the open lost, or behind it in the log), it opens the session, with no prompt."""

    session_id: Id
    ts: Seconds


@record("session.idle")
class SessionIdle(Record):
    """The user went quiet: the session may leave the GPU. One of a session already closed
    changes nothing and is passed over (no dead letter), as a close sent again is."""

    session_id: Id
    ts: Seconds


@record("session.closed")
class SessionClosed(Record):
    """The session ended; its generation is released for good. A close wins: an input of the
    session that dispatch reads after the close waits for it and reaches the owner after the
    Terminate, which refuses it (`session closed before input N was applied`; past the 16
    records that may wait behind a session, `the close of S is under way, ...`), however long
    the session waited for room before it; so is one its owner has not applied when the close
    lands. `session-events` and `session-inputs` have no
    order between them: dispatch, keeping up with both, reads an input written once the close
    is acknowledged after it; one written within moments of the close, or while dispatch lags
    on `session-events`, may be read before it, and is then routed ahead of it."""

    session_id: Id
    ts: Seconds
    reason: str = "user"


# --- session-inputs (key: session_id) ------------------------------------------------

@record("input.pushed")
class InputPushed(Record):
    """A user input (PushText, a new prompt, a control) with its per-session sequence number."""

    session_id: Id
    seq: Seq
    kind: InputKind
    payload: str
    ts: Seconds


# --- worker-commands (key: worker_id); every command is stamped with a generation ------

@record("cmd.assign")
class Assign(Record):
    """Run the session under ``generation``; ``restore`` means start from its last snapshot;
    ``recover`` (a recovery, or a migration's target) also replays the inputs after the
    snapshot from ``session-inputs``."""

    worker_id: Id
    session_id: Id
    generation: Generation
    ts: Seconds
    prompt: str = ""
    restore: bool = False
    recover: bool = False


@record("cmd.revoke")
class Revoke(Record):
    """``generation`` is no longer current: stop and release the session (``successor`` set:
    it moved there, after a handoff)."""

    worker_id: Id
    session_id: Id
    generation: Generation
    ts: Seconds
    reason: str = ""
    successor: Generation | None = None


@record("cmd.suspend")
class Suspend(Record):
    """Offload the session (idle): state to host memory and a fenced snapshot."""

    worker_id: Id
    session_id: Id
    generation: Generation
    ts: Seconds


@record("cmd.resume")
class Resume(Record):
    """Bring a suspended session back onto the device and continue."""

    worker_id: Id
    session_id: Id
    generation: Generation
    ts: Seconds


@record("cmd.terminate")
class Terminate(Record):
    """The session closed: stop and release it for good."""

    worker_id: Id
    session_id: Id
    generation: Generation
    ts: Seconds


@record("cmd.handoff")
class Handoff(Record):
    """Migrate at the next chunk boundary: the source freezes the session, snapshots it
    (fenced) and reports ``Frozen``; dispatch commits the move with a source guard on
    ``generation``, then assigns the target and revokes the source (or resumes the source
    when the target cannot take it)."""

    worker_id: Id
    session_id: Id
    generation: Generation
    target_worker: Id
    ts: Seconds
    reason: str = "rebalance"


@record("cmd.input")
class RoutedInput(Record):
    """A user input forwarded to the owner of ``generation``; ``source_partition`` and
    ``source_offset`` locate the original ``InputPushed`` (-1: unknown); ``refused_before``
    names earlier inputs of the session that dispatch refused, so the owner does not wait for
    them."""

    worker_id: Id
    session_id: Id
    generation: Generation
    seq: Count
    kind: InputKind
    payload: str
    ts: Seconds
    source_partition: int = -1
    source_offset: int = -1
    refused_before: tuple[Count, ...] = ()


# --- worker-events (key: worker_id) --------------------------------------------------

@record("worker.up")
class WorkerUp(Record):
    """A worker finished loading its model and accepts sessions."""

    worker_id: Id
    ts: Seconds
    capacity: Count
    device: str = "cpu"
    gpu_type: str = "cpu"
    pool: str = "default"
    pid: Count = 0
    chunk_interval_s: Seconds = 0.0
    input_rate_per_s: float = 0.0
    input_burst: float = 0.0


@record("worker.heartbeat")
class Heartbeat(Record):
    """Periodic load and device telemetry of one worker."""

    worker_id: Id
    ts: Seconds
    sessions: Count
    executing: Count
    capacity: Count
    chunk_latency_s: Seconds = 0.0
    device_mem_bytes: Count = 0
    device_util: Fraction = 0.0
    power_w: Seconds = 0.0
    cpu_percent: Seconds = 0.0
    rss_bytes: Count = 0


@record("worker.down")
class WorkerDown(Record):
    """A worker stopped (clean shutdown) or was declared dead (missed heartbeats). Acted on
    only when ``ts`` is no earlier than every heartbeat and start of the worker before it in
    the log: one that is (a copy written again) is outlived."""

    worker_id: Id
    ts: Seconds
    reason: str = ""


@record("worker.provisioned")
class WorkerProvisioned(Record):
    """``worker_id`` was started by ``provisioner``, which also stops it on ``Shutdown``.

    A worker no provisioner announced (started by hand, by Kubernetes...) is counted in its
    pool and may be drained, but chunkserve never sends it ``Shutdown``.
    """

    worker_id: Id
    ts: Seconds
    provisioner: str
    pool: str = "default"


@record("worker.claimed")
class Claimed(Record):
    """The worker claimed ``generation``: it now executes the session."""

    worker_id: Id
    session_id: Id
    generation: Generation
    ts: Seconds


@record("worker.frozen")
class Frozen(Record):
    """For a handoff to ``target_worker``: the session is frozen at a chunk boundary and its
    fenced snapshot taken; the source runs no chunk and applies no input of it until dispatch
    revokes it (moved) or resumes it (kept)."""

    worker_id: Id
    session_id: Id
    generation: Generation
    target_worker: Id
    ts: Seconds
    chunk_index: int = -1


@record("worker.released")
class Released(Record):
    """The worker stopped executing the session under ``generation``.

    ``reason`` is ``closed``, ``suspended`` (offloaded, slot freed), ``migrated`` (then
    ``successor`` is the target's new generation), ``revoked`` or ``fenced`` (the store
    refused its write: the generation had passed); ``detail`` says more in prose.
    """

    worker_id: Id
    session_id: Id
    generation: Generation
    ts: Seconds
    reason: ReleaseReason
    successor: Generation | None = None
    chunk_index: int = -1
    detail: str = ""


@record("worker.chunk")
class ChunkDone(Record):
    """One chunk released to the user, under a revalidated generation. The frames do not
    travel on Kafka: a media path (WebRTC, a CDN) carries them, and chunkserve ships none,
    so the worker drops them after this record; `checksum` identifies them."""

    worker_id: Id
    session_id: Id
    generation: Generation
    chunk_index: Count
    ts: Seconds
    latency_s: Seconds = 0.0
    batch_size: Count = 1
    input_seq: Count = 0
    checksum: str = ""


@record("worker.input")
class InputAccepted(Record):
    """The owner applied input ``seq`` (once per generation, in order). After a recovery the
    new owner replays the inputs after its snapshot and reports them again under its own
    generation: count applied inputs by session and seq."""

    worker_id: Id
    session_id: Id
    generation: Generation
    seq: Count
    ts: Seconds


@record("worker.rejected")
class CommandRejected(Record):
    """A command or routed input was refused; ``reason`` is a code, ``detail`` prose.

    A refused input carries its ``kind`` and ``payload`` so the router can re-route it to
    the session's current owner, and its ``source_partition`` / ``source_offset`` (from the
    ``RoutedInput``) so a dead letter names the very record refused.
    """

    worker_id: Id
    session_id: str
    command: str
    reason: RejectReason
    ts: Seconds
    generation: Generation | None = None
    seq: int = -1
    detail: str = ""
    kind: str = ""
    payload: str = ""
    source_partition: int = -1
    source_offset: int = -1


# --- scaling-commands (key: pool) ------------------------------------------------------

SCALE_OUT_MAX = 32  # workers one ScaleOut may ask for: a provisioner refuses more (its ``max_start``)


@record("scale.out")
class ScaleOut(Record):
    """Boot ``count`` more workers of ``gpu_type`` in ``pool``."""

    pool: Id
    count: Count
    ts: Seconds
    gpu_type: str = "cpu"
    decision_id: str = ""


@record("scale.drain")
class Drain(Record):
    """Stop admitting sessions on ``worker_id``; its sessions migrate away."""

    pool: Id
    worker_id: Id
    ts: Seconds
    decision_id: str = ""


@record("scale.reinstate")
class Reinstate(Record):
    """Admit sessions on draining ``worker_id`` again: its drain is called off (the pool must
    grow, and a worker already up serves at once where a boot would take its boot time)."""

    pool: Id
    worker_id: Id
    ts: Seconds
    decision_id: str = ""


@record("scale.shutdown")
class Shutdown(Record):
    """Stop ``worker_id`` once it holds no session."""

    pool: Id
    worker_id: Id
    ts: Seconds
    decision_id: str = ""


@record("scale.policy_state")
class PolicyState(Record):
    """The control leader's policy state after a decision round (the autoscaler's last action,
    low-load timer, burst history, SLO feedback), so the next leader goes on from it."""

    pool: Id
    ts: Seconds
    policy: str
    state: bytes = b""
    decision_id: str = ""


@dataclass(frozen=True, slots=True)
class AdmitSlot:
    """One entry of an admission plan: a session admitted to ``worker_id`` brings it to ``count``."""

    worker_id: Id
    count: Count

    def __post_init__(self) -> None:
        validate_instance(self)


@record("scale.admission_plan")
class AdmissionPlan(Record):
    """The control leader's placement of the sessions to come, until its next epoch: dispatch
    admits each arrival or resume on the first ``order`` entry whose worker runs fewer than
    its ``count`` sessions, a session the policy placed itself on its ``pinned`` worker, and
    past the order on the least-loaded worker when ``fallback`` (else it waits for the next
    plan)."""

    pool: Id
    ts: Seconds
    policy: str
    order: tuple[AdmitSlot, ...] = ()
    pinned: dict[str, str] | None = None
    fallback: bool = True
    decision_id: str = ""


# --- metrics (key: the record's tag) -------------------------------------------------

@record("metric.workload")
class WorkloadSignal(Record):
    """The workload detector's view of the sliding window."""

    ts: Seconds
    window_s: Seconds
    active: Count
    arrivals: Count
    departures: Count
    to_idle: Count
    to_active: Count
    volatility: Seconds
    level: Level


@record("metric.placement")
class PlacementReport(Record):
    """The placement after a decision round."""

    ts: Seconds
    workers: Count
    sessions: Count
    worst_latency_s: Seconds = 0.0
    migrations: Count = 0
    source: str = ""
    loads: dict[str, int] | None = None


@record("metric.scaling")
class ScalingDecision(Record):
    """An autoscaler decision and the figures behind it: ``u_target`` and ``delta`` are the
    band the policy held the pool to (with an SLO, the table's moved by its feedback; 0 for a
    plug-in policy, which states none)."""

    ts: Seconds
    current: Count
    target: Count
    u_max: Seconds
    u_target: Fraction
    delta: Fraction
    level: Level
    reason: str = ""


@record("metric.cost")
class CostTick(Record):
    """Cost accrued so far by the pool (``pool`` empty: all pools together)."""

    ts: Seconds
    gpus: Count
    gpu_seconds: Seconds
    cost: Seconds
    pool: str = ""


# --- dead-letters (key: source topic) ------------------------------------------------

@record("dead.letter")
class DeadLetter(Record):
    """A record some consumer could not take, with where it came from and why."""

    source_topic: Id
    partition: Count
    offset: Count
    reason: str
    consumer: str
    ts: Seconds
    raw: bytes = b""
    raw_size: Count = 0
    key: bytes | None = None


# --- what each topic carries, as one type (``match`` on it) --------------------------

SessionEventRecord = SessionOpened | SessionActive | SessionIdle | SessionClosed
InputRecord = InputPushed
WorkerCommand = Assign | Revoke | Suspend | Resume | Terminate | Handoff | RoutedInput
WorkerEvent = (WorkerUp | Heartbeat | WorkerDown | WorkerProvisioned | Claimed | Frozen | Released | ChunkDone
               | InputAccepted | CommandRejected)
ScalingCommand = ScaleOut | Drain | Reinstate | Shutdown | PolicyState | AdmissionPlan
MetricRecord = WorkloadSignal | PlacementReport | ScalingDecision | CostTick
