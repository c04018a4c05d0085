"""Sequences an outside review of the worker's core found answered wrongly (the same before
the core): an early input handed to its session without the checks an input routed after
the Assign gets, a Suspend delivered twice, an offload refused after a handoff froze the
session. Each input ends accepted or refused; each generation is released once."""

from __future__ import annotations

import asyncio
from typing import Any

from schemas.errors import LimitError
from schemas.records import (Assign, CommandRejected, Frozen, Generation, Handoff, InputAccepted, Record,
                             Released, RoutedInput, Suspend)
from streams.generations_memory import MemoryGenerationStore
from workers.commands import CommandHandler
from tests.workers.test_ownership_model import _handler


def _rin(gen: Generation, seq: int, refused_before: tuple[int, ...] = ()) -> RoutedInput:
    return RoutedInput(worker_id="w", session_id="s", generation=gen, seq=seq, kind="text", payload=f"in {seq}",
                       ts=0.0, refused_before=refused_before)


async def _started(store: Any = None) -> tuple[Any, list[Record], list[float], Generation, CommandHandler]:
    """A worker's handler holding nothing yet, and session s committed to it (generation g1)."""
    store, sent, now = store or MemoryGenerationStore("t"), [], [10.0]
    await store.register_worker("w", 2)
    g1 = await store.commit("s", 0, "w")
    return store, sent, now, g1, _handler(store, sent, lambda: now[0])


def _about(sent: list[Record], seq: int) -> list[Record]:
    return [r for r in sent if isinstance(r, (InputAccepted, CommandRejected)) and getattr(r, "seq", -1) == seq]


def test_a_seq_given_up_on_that_comes_before_the_restoring_assign_is_answered() -> None:
    """Owner g1 gives up on seq 1 after the gap wait, applies 2, offloads (snapshot keeps
    skipped={1}). The session wakes as g2 on the same worker; a late copy of seq 1, routed with
    g2, comes before g2's Assign (another dispatch replica). After the Assign it is never
    answered: the early inputs were handed over without Held.offer, which refuses it 'late' (as
    it does when the same copy comes after the Assign)."""

    async def run() -> list[Record]:
        store, sent, now, g1, h = await _started()
        await h.handle(Assign(worker_id="w", session_id="s", generation=g1, ts=0.0, prompt="p"))
        await h.handle(_rin(g1, 2))  # seq 1 missing
        now[0] += 6.0
        await h.expire_gaps()  # 1 given up on, 2 applied
        await h.handle(Suspend(worker_id="w", session_id="s", generation=g1, ts=0.0))
        assert "s" not in h.sessions and (await store.session("s")).skipped == (1,)
        g2 = await store.commit("s", g1.epoch, "w")  # woken on w again
        sent.clear()
        await h.handle(_rin(g2, 1))  # the late copy, before its Assign: kept as early
        await h.handle(Assign(worker_id="w", session_id="s", generation=g2, ts=0.0, prompt="p", restore=True))
        now[0] += 60.0
        await h.expire_gaps()
        return sent

    sent = asyncio.run(run())
    assert [(type(r).__name__, getattr(r, "reason", "")) for r in _about(sent, 1)] == [("CommandRejected", "late")]


def test_an_early_input_naming_a_seq_dispatch_refused_does_not_wait_for_it() -> None:
    """Dispatch refused seq 1 (its rate rule, say) and routes seq 2 naming it (refused_before).
    Routed after the Assign, 2 is applied at once; routed just before the Assign (another
    dispatch replica), it waited the whole gap wait for seq 1, which never comes: it was handed
    over without Held.offer's withdraw."""

    async def run(before: bool) -> list[int]:
        store, sent, now, g1, h = await _started()
        assign = Assign(worker_id="w", session_id="s", generation=g1, ts=0.0, prompt="p")
        for rec in ([_rin(g1, 2, refused_before=(1,)), assign] if before else [assign, _rin(g1, 2, refused_before=(1,))]):
            await h.handle(rec)
        return [r.seq for r in sent if isinstance(r, InputAccepted)]

    assert asyncio.run(run(before=False)) == [2]
    assert asyncio.run(run(before=True)) == [2]  # not after the gap wait


def test_a_suspend_redelivered_after_the_offload_reports_released_once() -> None:
    """A Suspend delivered twice (at-least-once): the second finds no session held and the
    store's generation current (a suspended session keeps it); it was taken for one that
    overtook its Assign, released again and reported twice. It is refused now."""

    async def run() -> list[Record]:
        store, sent, now, g1, h = await _started()
        await h.handle(Assign(worker_id="w", session_id="s", generation=g1, ts=0.0, prompt="p"))
        suspend = Suspend(worker_id="w", session_id="s", generation=g1, ts=0.0)
        await h.handle(suspend)
        await h.handle(suspend)
        return sent

    sent = asyncio.run(run())
    assert [(r.generation, r.reason) for r in sent if isinstance(r, Released)] == [(Generation("w", 1), "suspended")]
    assert [(r.command, r.reason) for r in sent if isinstance(r, CommandRejected)] == [(Suspend.TAG, "not_owner")]


def test_an_offload_refused_after_a_handoff_froze_the_session_leaves_it_running() -> None:
    """Handoff freezes (Frozen sent), then a Suspend's snapshot is over the limit: the session
    was left held, neither executing nor frozen, so it never ran a chunk again and the
    stuck-handoff thaw (which looks for frozen sessions) never freed it. It runs again now."""

    class Limited(MemoryGenerationStore):
        puts = 0

        async def put_snapshot(self, *a: Any, **kw: Any) -> Any:
            type(self).puts += 1
            if type(self).puts > 1:
                raise LimitError("snapshot", 10**9, 10, "max_snapshot_bytes")
            return await super().put_snapshot(*a, **kw)

    async def run() -> tuple[list[Record], Any, int]:
        store, sent, now, g1, h = await _started(Limited("t"))
        await h.handle(Assign(worker_id="w", session_id="s", generation=g1, ts=0.0, prompt="p"))
        await h.handle(Handoff(worker_id="w", session_id="s", generation=g1, ts=0.0, target_worker="v"))
        await h.handle(Suspend(worker_id="w", session_id="s", generation=g1, ts=0.0))
        now[0] += 3600.0
        await h.thaw_stuck(10.0)
        return sent, h.sessions["s"], len(h.schedule.pop_due(now[0]))

    sent, sess, due = asyncio.run(run())
    assert any(isinstance(r, Frozen) for r in sent)
    assert [r.reason for r in sent if isinstance(r, CommandRejected)] == ["over_limit"]
    assert sess.executing and due == 1, "held, neither running nor frozen: stuck"
