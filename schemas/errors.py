"""The one root of chunkserve's errors, named by whose fault each one is.

    ChunkserveError
    ├── SchemaError              the sender's fault: bytes or fields that break a wire contract
    ├── PolicyError              the policy's fault: a plug-in's code raised, or answered with
    │                            something that is not a decision (named with the policy)
    ├── ConfigError              the operator's fault: a bad setting, named with its key and source
    │   └── LeaseHeldError           another live process holds what this one must hold alone
    │                                (a worker id given to two workers), named with the holder
    ├── AccessDeniedError        the operator's fault: the broker's (or Redis') ACLs or credentials
    │                            refuse this principal (user) an operation (named with it, the
    │                            operation and the topic or key)
    ├── TraceError               the trace author's fault: a bad trace file, named with its line
    ├── OwnershipError           a fenced actor acted without authority
    │   ├── StaleGenerationError     its epoch is older than the current one
    │   ├── NotOwnerError            the current generation belongs to another worker
    │   ├── NoCapacityError          the target worker has no free slot
    │   └── UnknownSessionError      the store has no generation for the session
    ├── LimitError               something is over its configured bound (named with the setting)
    ├── SnapshotCorruptError     the world broke a stored snapshot (checksum or parts mismatch)
    └── InfraError               the world broke a dependency (broker or Redis not reachable)
"""

from __future__ import annotations

__all__ = [
    "ChunkserveError",
    "SchemaError",
    "PolicyError",
    "ConfigError",
    "LeaseHeldError",
    "AccessDeniedError",
    "TraceError",
    "OwnershipError",
    "StaleGenerationError",
    "NotOwnerError",
    "NoCapacityError",
    "UnknownSessionError",
    "LimitError",
    "SnapshotCorruptError",
    "InfraError",
]


class ChunkserveError(Exception):
    """Root of every error chunkserve raises on purpose."""

    reason_code = "error"  # the short reason a refusal reports (CommandRejected.reason)


class PolicyError(ChunkserveError):
    """A scheduling policy (a plug-in's code) raised, or answered with something that is not
    a decision: the message names the policy, where, and the error."""


class SchemaError(ChunkserveError):
    """A record broke its wire contract; ``field`` names where, the message says why."""

    def __init__(self, reason: str, field: str | None = None) -> None:
        self.reason = reason
        self.field = field
        super().__init__(f"{field}: {reason}" if field else reason)


class ConfigError(ChunkserveError):
    """A configuration value is missing or invalid; names the key and where it came from."""

    def __init__(self, key: str, reason: str, source: str = "config") -> None:
        self.key, self.reason, self.source = key, reason, source
        super().__init__(f"{source}: {key}: {reason}")


class LeaseHeldError(ConfigError):
    """Another live process (``holder``, as ``host:pid``) holds the lease on ``key`` (e.g.
    ``worker:<id>``); the message says what to change. A restart cannot mend it."""

    def __init__(self, key: str, holder: str, message: str) -> None:
        self.key, self.reason, self.source, self.holder = key, message, "lease", holder
        ChunkserveError.__init__(self, message)


class AccessDeniedError(ChunkserveError):
    """The broker (or Redis: ``server``, ``kind``) refused ``principal`` ``operation`` on
    ``resource`` (its ACLs or credentials, not a bug)."""

    reason_code = "access_denied"

    def __init__(self, principal: str, operation: str, resource: str, detail: str = "", *,
                 server: str = "the broker", kind: str = "principal") -> None:
        self.principal, self.operation, self.resource = principal, operation, resource
        super().__init__(f"{server} refused {kind} {principal!r} {operation} on {resource}"
                         + (f" ({detail})" if detail else ""))


class TraceError(ChunkserveError):
    """A trace file is malformed; names the file and the 1-based line (0: the whole file,
    not named)."""

    def __init__(self, path: str, line: int, reason: str) -> None:
        self.path = path
        self.line = line
        self.reason = reason
        super().__init__(f"{path}:{line}: {reason}" if line > 0 else f"{path}: {reason}")


class OwnershipError(ChunkserveError):
    """An actor tried to act for a session without holding its current generation."""

    reason_code = "ownership"


class StaleGenerationError(OwnershipError):
    """The actor's epoch is older than the session's current epoch."""

    reason_code = "stale_epoch"

    def __init__(self, session_id: str, epoch: int, current: int) -> None:
        self.session_id = session_id
        self.epoch = epoch
        self.current = current
        super().__init__(f"session {session_id}: epoch {epoch} is stale (current {current})")


class NotOwnerError(OwnershipError):
    """The current generation of the session belongs to another worker."""

    reason_code = "not_owner"

    def __init__(self, session_id: str, worker_id: str, owner: str) -> None:
        self.session_id = session_id
        self.worker_id = worker_id
        self.owner = owner
        super().__init__(f"session {session_id}: {worker_id} is not the owner ({owner} is)")


class NoCapacityError(OwnershipError):
    """The chosen worker has no free slot (or is not registered / draining)."""

    reason_code = "no_capacity"

    def __init__(self, worker_id: str, detail: str = "no free slot") -> None:
        self.worker_id = worker_id
        super().__init__(f"worker {worker_id}: {detail}")


class UnknownSessionError(OwnershipError):
    """The store holds no generation for the session."""

    reason_code = "unknown_session"

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(f"session {session_id}: unknown")


class LimitError(ChunkserveError):
    """Something is larger than its configured bound; names the bound and the setting."""

    reason_code = "over_limit"

    def __init__(self, what: str, size: int, limit: int, setting: str) -> None:
        self.what, self.size, self.limit, self.setting = what, size, limit, setting
        super().__init__(f"{what} is {size} bytes, over the {limit}-byte limit ({setting})")


class SnapshotCorruptError(ChunkserveError):
    """A stored snapshot failed its checksum or is missing parts."""

    reason_code = "snapshot_corrupt"


class InfraError(ChunkserveError):
    """A dependency (broker, Redis, a child process) is not reachable or failed to start."""
