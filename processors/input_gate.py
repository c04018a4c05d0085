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


class InputGate:
    """The bounds an input passes before it is routed: seq from 1, payload size, and a token
    bucket per session (the oldest sessions' buckets are forgotten past 100,000)."""

    def __init__(self, max_bytes: int, rate: float, burst: float) -> None:
        self.max_bytes, self.rate, self.burst = max_bytes, rate, burst
        self._buckets: dict[str, Bucket] = {}

    def refuse(self, sid: str, seq: int, size: int, now: float) -> str | None:
        """None if the input may be routed; else why not."""
        if seq < 1:
            return f"seq {seq}: a session's inputs are numbered from 1, one by one"
        if size > self.max_bytes:
            return f"input payload is {size} bytes, over the {self.max_bytes}-byte limit"
        bucket, ok = take(self._buckets.get(sid), now, self.rate, self.burst)
        self._buckets[sid] = bucket
        if len(self._buckets) > 100_000:
            for old in list(self._buckets)[:10_000]:
                del self._buckets[old]
        if not ok:
            return f"input rate over {self.rate:g}/s (burst {self.burst:g}) for this session"
        return None
