"""Dispatch's budgets for inputs before they are routed: the rate rule's count of a window
that began before this process read the partition (read back from the log), and the re-reads
of inputs whose session is not (yet) in the store."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Awaitable, Callable, Iterator

from schemas.input_rate import rate_counted
from schemas.records import InputPushed

from ..dispatch import Input
from ..input_gate import InputGate

__all__ = ["MAX_REREADING", "RateWindows", "Rereads"]

log = logging.getLogger("processors.agents.dispatch")

# inputs of unknown sessions read again at once (the rest are refused at once)
MAX_REREADING = 64


class RateWindows:
    """Before the gate counts an input: when its rate window began before this process read
    the partition (a start, a restart, a partition taken over from another replica), the
    window's count starts at the session's inputs read back from the log
    (``count_in_window(sid, partition, offset, start_s)``: their seqs, in log order), so the
    rule decides as it did, and as a replay does."""

    def __init__(self, gate: InputGate, count_in_window: Callable[[str, int, int, float], Awaitable[list[int]]] | None,
                 name: str) -> None:
        self.gate, self.count_in_window, self.name = gate, count_in_window, name
        self._reading_since: dict[int, float] = {}  # partition -> the first timestamp read there

    async def read(self, rec: InputPushed, key: bytes | None, partition: int, offset: int, timestamp_s: float) -> None:
        since = self._reading_since.setdefault(partition, timestamp_s)
        counts, sid = self.gate.counts, rec.session_id
        window = counts.window(timestamp_s)
        start_s = counts.start_s(window)
        if self.count_in_window is None or offset < 0 or counts.known(sid, window) or start_s >= since:
            return  # the common case, decided before the payload is measured
        if not rate_counted(rec, key, self.gate.max_bytes):
            return
        try:
            earlier = await self.count_in_window(sid, partition, offset, start_s)
        except Exception as exc:  # noqa: BLE001 - the broker away: count from here, as before a restart
            log.warning("%s: could not read back the rate window of %s (%s); counting from here", self.name, sid, exc)
            earlier = []
        counts.seed(sid, window, earlier)


class Rereads:
    """Inputs of sessions not (yet) in the store, read again ``per_input`` times while their
    open may be in flight, within a budget of their own: a flood of made-up ids cannot hold
    every in-flight place for the owner wait (past ``budget`` such an input is refused at
    once). ``now``: the inputs being read again, as (session, seq, partition, offset)."""

    def __init__(self, per_input: int, budget: int) -> None:
        self.per_input, self.budget = per_input, budget
        self.now: set[tuple[str, int, int, int]] = set()

    def allowance(self) -> int:
        return self.per_input if len(self.now) < self.budget else 0

    async def pause(self, inp: Input, seconds: float) -> None:
        self.now.add((inp.session_id, inp.seq, inp.partition, inp.offset))
        await asyncio.sleep(seconds)

    @contextlib.contextmanager
    def ended(self, key: tuple[str, int, int, int]) -> Iterator[None]:
        try:
            yield
        finally:
            self.now.discard(key)
