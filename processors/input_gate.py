"""The bounds an input passes before dispatch routes it: seq from 1, payload size, and the
per-session rate rule of ``schemas.input_rate``. Pure but for the counts the gate keeps."""

from __future__ import annotations

from schemas.input_rate import RateCount, bound

__all__ = ["InputGate"]

MAX_REFUSED = 64  # refused seqs kept per session until its next routed input names them


class InputGate:
    """The bounds an input passes before it is routed: seq from 1, payload size, and the rate
    rule per session (:class:`RateCount`); and the seqs it refused since the session's last
    routed input, which that input names so its owner does not wait for them
    (:meth:`refused_before`)."""

    def __init__(self, max_bytes: int, rate: float, burst: float) -> None:
        self.max_bytes, self.rate, self.burst = max_bytes, rate, burst
        self.counts = RateCount(rate, burst)
        self._refused: dict[str, list[int]] = {}
        self._recent: dict[str, list[int]] = {}  # the last MAX_REFUSED refused, kept after they are named

    def refuse(self, sid: str, seq: int, size: int, timestamp_s: float) -> str | None:
        """None if the input (with this Kafka timestamp) may be routed; else why not (and the
        seq is kept as refused)."""
        why = None
        if size > self.max_bytes:
            why = f"input payload is {size} bytes, over the {self.max_bytes}-byte limit"
        elif not self.counts.passes(sid, timestamp_s, seq):
            why = (f"input rate over {self.rate:g}/s for this session (more than {self.counts.limit} "
                   f"inputs in a window of {self.counts.limit / self.rate:g} s)")
        if why is not None:
            self.note_refused(sid, seq)
        return why

    def other_rule(self, rate: float, burst: float) -> str | None:
        """Why a worker that replays with this rate rule (0: not said) would decide otherwise
        than this gate, or None."""
        if (rate, burst) == (0, 0) or (rate, burst) == (self.rate, self.burst):
            return None
        return (f"replays inputs with the rate rule {rate:g}/s, burst {burst:g}, where dispatch applies "
                f"{self.rate:g}/s, burst {self.burst:g}: a recovery there may apply inputs dispatch refused "
                "(give both CHUNKSERVE_INPUT_RATE_PER_S and CHUNKSERVE_INPUT_BURST the same values)")

    def note_refused(self, sid: str, seq: int) -> None:
        """Keep ``seq`` as refused elsewhere (a misfiled key) too."""
        if seq >= 1:
            for kept in (self._refused, self._recent):
                seqs = kept.pop(sid, [])  # put last: the bound forgets the sessions refused longest ago
                kept[sid] = seqs[-(MAX_REFUSED - 1):] + [seq]
                bound(kept)

    def refused_before(self, sid: str, below: int | None = None) -> tuple[int, ...]:
        """The session's refused seqs since the last call (its next routed input names them);
        with ``below`` (the routed input's seq), only those before it: an owner withdraws no
        seq after the input that names it, so a later one is kept for the next input (an input
        parked behind its open and routed after the ones refused there named them, and the
        owner applied them from the log although each was dead-lettered)."""
        named = self.pending(sid, below)
        self.named(sid, named)
        return named

    def pending(self, sid: str, below: int | None = None) -> tuple[int, ...]:
        """:meth:`refused_before` without letting them go: an input names them, and they are
        let go (:meth:`named`) once it is routed; a try that fails before (the store or the
        broker away) names them again, where it had lost them."""
        return tuple(seq for seq in self._refused.get(sid, ()) if below is None or seq < below)

    def named(self, sid: str, seqs: tuple[int, ...]) -> None:
        """A routed input named these: they are not named again (but by an input routed again)."""
        if seqs and sid in self._refused:
            left = [seq for seq in self._refused[sid] if seq not in seqs]
            if left:
                self._refused[sid] = left
            else:
                del self._refused[sid]

    def recently_refused(self, sid: str, below: int) -> tuple[int, ...]:
        """The session's last refused seqs below ``below``, named or not: an input routed again
        after its owner refused it names them too (its first routing's names went to that
        owner)."""
        return tuple(seq for seq in self._recent.get(sid, ()) if seq < below)
