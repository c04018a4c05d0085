"""How dispatch refuses: a record dead-lettered as it came, once per place in the log, and an
input refused after routing dead-lettered where it sits, each seq named on the session's next
routed input so its owner does not wait for it. A part of :class:`~.dispatch.DispatchShell`."""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from schemas.codec import encode
from schemas.records import CommandRejected, InputPushed, Record, RoutedInput
from streams.kafka import dead_letter_record

from ..dispatch import Input
from ..input_gate import InputGate
from .input_budgets import DeadLetterOnce, Remembered

__all__ = ["Refusals"]


class Refusals:
    """The refusals of a dispatch replica (what it uses of the shell is declared below)."""

    name: str
    publisher: Any
    gate: InputGate
    dead_letters: DeadLetterOnce
    places: Remembered[tuple[str, int], tuple[int, int]]
    inputs_topic: str
    read_inputs: Callable[[str, int], Awaitable[list[Any]]] | None

    async def dead_letter(self, publisher: Any, msg: Any, why: str) -> None:
        """Dead-letter a record as it came, once per place in the log (``DeadLetterOnce``)."""
        await self.dead_letters.send((getattr(msg, "topic", None), getattr(msg, "partition", None),
                                      getattr(msg, "offset", None)), lambda: publisher.dead_letter(msg, why, self.name))

    async def refuse(self, inp: Input, why: str) -> None:
        self.gate.note_refused(inp.session_id, inp.seq)  # named on the next routed input: not waited for
        why = f"refused: {why}"  # every dead letter's reason says schema: or refused: first
        if inp.origin is not None:  # the record as it came: dead-lettered with its own bytes
            await self.dead_letter(self.publisher, inp.origin, why)
            return
        partition, offset = inp.partition, inp.offset
        if partition < 0 and inp.refused is not None and inp.refused.source_partition >= 0:
            # refused by its owner, which names the record it was routed (two records of one
            # seq, a restarted producer's, each get their own dead letter)
            partition, offset = inp.refused.source_partition, inp.refused.source_offset
        if partition < 0:  # refused after routing, by an owner that named no place: where it was when routed
            partition, offset = self.places.get((inp.session_id, inp.seq)) or (-1, -1)
        if partition < 0 and self.read_inputs is not None:
            # refused after routing (by its owner): the dead letter names where the input sits
            found = [g for g in await self.read_inputs(inp.session_id, inp.seq - 1) if g.record.seq == inp.seq]
            if found:
                partition, offset = found[0].partition, found[0].offset
            else:
                why += " (its place in the log was not found)"
        await self.dead_letters.send((self.inputs_topic, partition, offset),
                                     lambda: self.refuse_input(inp.session_id, inp.seq, inp.kind, inp.payload,
                                                               inp.ts, why, max(partition, 0), max(offset, 0)))

    async def refuse_parked(self, rec: InputPushed, msg: Any, why: str, publisher: Any) -> None:
        """An input refused before it was routed (behind its session's wait for room, or its
        routing failed for good): dead-lettered as it came, and named on the session's next
        routed input, so its owner neither waits for it nor applies it from the log (an
        outside run: three inputs were refused so and applied too)."""
        self.gate.note_refused(rec.session_id, rec.seq)
        await self.dead_letter(publisher, msg, f"refused: {why}")

    async def refuse_input(self, sid: str, seq: int, kind: str, payload: str, ts: float,
                           why: str, partition: int = 0, offset: int = 0) -> None:
        raw = encode(InputPushed(session_id=sid, seq=seq,
                                 kind=kind if kind in ("text", "prompt", "control") else "text",  # type: ignore[arg-type]
                                 payload=payload, ts=ts))
        await self.publisher.send(dead_letter_record(
            self.inputs_topic, partition, offset, raw, sid.encode(), why[:1000], self.name))

    async def gave_up(self, rec: Record, exc: Exception) -> None:
        """A worker event acted on in vain (the store or the broker away past the tries): an
        input its owner handed back is refused with the reason, never left neither way; a
        Frozen is let go (the owner runs the session again after its handoff wait)."""
        if isinstance(rec, CommandRejected) and rec.command == RoutedInput.TAG and rec.seq >= 1:
            await self.refuse(Input(rec.session_id, rec.seq, rec.kind, rec.payload, rec.ts, refused=rec),
                              f"dispatch could not route it again after its owner refused it ({exc})")
