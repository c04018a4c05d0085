"""The bounds an input passes before dispatch routes it: seq from 1, payload size, and a
token bucket per session. Pure but for the buckets the gate keeps."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Bucket", "take", "InputGate"]


@dataclass(frozen=True, slots=True)
class Bucket:
    """A token bucket: ``tokens`` left at time ``at``."""

    tokens: float
    at: float


def take(bucket: Bucket | None, now: float, rate: float, burst: float) -> tuple[Bucket, bool]:
    """Take one token (one input) if the session's bucket has one; refill at ``rate`` per second
    up to ``burst``."""
    if bucket is None:
        bucket = Bucket(burst, now)
    tokens = min(burst, bucket.tokens + max(0.0, now - bucket.at) * rate)
    if tokens >= 1.0:
        return Bucket(tokens - 1.0, now), True
    return Bucket(tokens, now), False


MAX_SESSIONS = 100_000  # past this many, the oldest sessions' buckets and refusals are forgotten
MAX_REFUSED = 64  # refused seqs kept per session until its next routed input names them


class InputGate:
    """The bounds an input passes before it is routed: seq from 1, payload size, and a token
    bucket per session; and the seqs it refused since the session's last routed input, which
    that input names so its owner does not wait for them (:meth:`refused_before`)."""

    def __init__(self, max_bytes: int, rate: float, burst: float) -> None:
        self.max_bytes, self.rate, self.burst = max_bytes, rate, burst
        self._buckets: dict[str, Bucket] = {}
        self._refused: dict[str, list[int]] = {}

    def refuse(self, sid: str, seq: int, size: int, now: float) -> str | None:
        """None if the input may be routed; else why not (and the seq is kept as refused)."""
        if seq < 1:
            return f"seq {seq}: a session's inputs are numbered from 1, one by one"
        why = None
        if size > self.max_bytes:
            why = f"input payload is {size} bytes, over the {self.max_bytes}-byte limit"
        else:
            bucket, ok = take(self._buckets.get(sid), now, self.rate, self.burst)
            self._buckets[sid] = bucket
            _bound(self._buckets)
            if not ok:
                why = f"input rate over {self.rate:g}/s (burst {self.burst:g}) for this session"
        if why is not None:
            self.note_refused(sid, seq)
        return why

    def note_refused(self, sid: str, seq: int) -> None:
        """Keep ``seq`` as refused elsewhere (a misfiled key) too."""
        if seq >= 1:
            seqs = self._refused.setdefault(sid, [])
            seqs[:] = seqs[-(MAX_REFUSED - 1):] + [seq]
            _bound(self._refused)

    def refused_before(self, sid: str) -> tuple[int, ...]:
        """The session's refused seqs since the last call (its next routed input names them)."""
        return tuple(self._refused.pop(sid, ()))


def _bound(per_session: dict[str, object]) -> None:
    if len(per_session) > MAX_SESSIONS:
        for old in list(per_session)[:MAX_SESSIONS // 10]:
            del per_session[old]
