"""The rate rule of ``session-inputs``, part of the topic's contract: a function of the log
alone, so that whoever reads the log decides the same (dispatch when it routes, a recovery's
replay and a close's sweep when they read a session's inputs back).

Time is cut into windows of ``burst / rate`` seconds of the records' Kafka timestamps
(:func:`rate_window`); the first ``burst`` inputs of a session in a window pass, the rest are
refused. Counted, in log order: the session's inputs that pass the other bounds
(:func:`rate_counted`: payload size, key; a seq below 1 is no record at all), whether the rate refused them or not;
a seq repeated within the window is counted once and gets its first copy's verdict.
A token bucket on the reader's clock let a replay apply an input dispatch had refused for the
rate, and a restarted dispatch decide otherwise than before."""

from __future__ import annotations

import math

from .records import InputPushed
from .topics import misfiled

__all__ = ["MAX_SESSIONS", "rate_window", "rate_counted", "RateCount", "bound"]

MAX_SESSIONS = 100_000  # past this many, the counts (and refusals) of the sessions seen longest ago are forgotten


def rate_counted(rec: InputPushed, key: bytes | None, max_bytes: int) -> bool:
    """Whether the rate rule counts this input: within the other bounds dispatch checks first."""
    return misfiled(rec, key) is None and len(rec.payload.encode()) <= max_bytes


def rate_window(timestamp_s: float, rate: float, burst: float) -> int:
    """The rate window a record with this Kafka timestamp falls in (``burst / rate`` s long)."""
    return math.floor(timestamp_s * rate / burst)


class RateCount:
    """Per session, the inputs counted in its latest window; :meth:`passes` counts one more.

    A repeated seq in the window (a producer's retry, an at-least-once redelivery) is not
    counted again and gets the first copy's verdict: a duplicate of an input that passed is
    not refused (its owner applies the seq once), nor one of an input refused let through."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.limit = rate, math.floor(burst)
        # sid -> (window, inputs counted in it, the verdict of each seq seen in it)
        self._counts: dict[str, tuple[int, int, dict[int, bool]]] = {}

    def window(self, timestamp_s: float) -> int:
        return rate_window(timestamp_s, self.rate, self.limit)

    def start_s(self, window: int) -> float:
        """When ``window`` begins (a Kafka timestamp, in seconds)."""
        return window * self.limit / self.rate

    def known(self, sid: str, window: int) -> bool:
        """Whether this count has seen the session in ``window`` already."""
        got = self._counts.get(sid)
        return got is not None and got[0] == window

    def seed(self, sid: str, window: int, earlier: list[int]) -> None:
        """Start the session's ``window`` with the seqs of its inputs read back from the log
        (in log order), as if they had been counted here."""
        self._counts[sid] = (window, 0, {})
        for seq in earlier:
            self._count(sid, window, seq)
        bound(self._counts)

    def passes(self, sid: str, timestamp_s: float, seq: int) -> bool:
        """Count input ``seq`` of ``sid`` at this timestamp; whether it is within the window's burst."""
        ok = self._count(sid, self.window(timestamp_s), seq)
        bound(self._counts)
        return ok

    def _count(self, sid: str, w: int, seq: int) -> bool:
        at, n, seen = self._counts.get(sid, (w, 0, {}))
        if at != w:  # a new window (or a record stamped earlier than the latest: it starts again)
            n, seen = 0, {}
        if seq in seen:
            ok = seen[seq]
        else:
            n += 1
            ok = n <= self.limit
            if len(seen) < 4 * self.limit + 64:  # bounded: past it, a repeat counts again
                seen[seq] = ok
        self._counts.pop(sid, None)  # put last: the bound forgets the sessions counted longest ago
        self._counts[sid] = (w, n, seen)
        return ok


def bound(per_session: dict[str, object]) -> None:
    """Forget the tenth of the sessions seen longest ago once there are more than
    ``MAX_SESSIONS`` (each is put last when it is seen: a busy session is never the one
    forgotten, whose count then started again mid-window, as a review found)."""
    if len(per_session) > MAX_SESSIONS:
        for old in list(per_session)[:MAX_SESSIONS // 10]:
            del per_session[old]
