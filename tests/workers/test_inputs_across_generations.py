"""Inputs missing when a session changes generation (an offload, then a restore): none is
lost. The store is its in-memory twin and the model a counter, as in the
ownership model test."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from schemas.records import (Assign, CommandRejected, InputAccepted, InputPushed, Record, RoutedInput, Suspend,
                             Terminate)
from streams.generations_memory import MemoryGenerationStore
from streams.input_log import LoggedInput
from tests.workers.test_ownership_model import GAP_WAIT_S, _handler


def _input(gen: Any, seq: int, worker: str = "w") -> RoutedInput:
    return RoutedInput(worker_id=worker, session_id="s", generation=gen, seq=seq, kind="text", payload=f"in {seq}", ts=0.0)


def _outcomes(sent: list[Record]) -> tuple[list[int], list[tuple[int, str]]]:
    accepted = [r.seq for r in sent if isinstance(r, InputAccepted)]
    refused = [(r.seq, r.reason) for r in sent if isinstance(r, CommandRejected) and r.command == RoutedInput.TAG]
    return accepted, refused


def _offloaded_past_a_gap(loop: asyncio.AbstractEventLoop, logged: tuple[Any, ...]) -> tuple[Any, ...]:
    """Inputs 1 and 3 routed to an owner (the log holds ``logged``), then an offload:
    ``(run, handler, store, sent, generation)``."""
    store, sent = MemoryGenerationStore("t"), []
    handler = _handler(store, sent, lambda: 0.0, logged=logged)
    run = loop.run_until_complete
    run(store.register_worker("w", 4))
    gen = run(store.commit("s", 0, "w"))
    run(handler.handle(Assign(worker_id="w", session_id="s", generation=gen, ts=0.0, prompt="p")))
    for seq in (1, 3):
        run(handler.handle(_input(gen, seq)))
    run(handler.handle(Suspend(worker_id="w", session_id="s", generation=gen, ts=0.0)))
    return run, handler, store, sent, gen


def test_an_input_missing_at_an_offload_is_refused_as_late_by_the_next_owner_not_dropped():
    """Input 3 waits for 2 when the session is offloaded: the offload applies 3 past 2 (a
    snapshot keeps no waiting input) and records 2 as given up on, so when 2 comes to the
    next owner it is refused as late. It was dropped before: the next owner took a seq below
    its snapshot's for a duplicate of one applied (neither applied nor refused)."""
    loop = asyncio.new_event_loop()
    try:
        run, handler, store, sent, first = _offloaded_past_a_gap(loop, ())
        assert _outcomes(sent) == ([1, 3], [])
        assert (run(store.session("s")).input_seq, run(store.session("s")).skipped) == (3, (2,))
        second = run(store.commit("s", first.epoch, "w"))  # the restore an input makes dispatch ask for
        run(handler.handle(Assign(worker_id="w", session_id="s", generation=second, ts=0.0, prompt="p", restore=True)))
        run(handler.handle(_input(second, 2)))
        run(handler.handle(_input(second, 4)))
        assert _outcomes(sent) == ([1, 3, 4], [(2, "late")])
    finally:
        loop.close()


def test_a_seq_given_up_on_is_refused_as_late_by_the_next_owner_too():
    """After the gap wait, 3 is applied without 2; the session then moves (offload, restore on
    another worker from the store's snapshot). When 2 comes at last, the new owner refuses it
    as late, as the old one would have, instead of taking it for a duplicate."""
    loop = asyncio.new_event_loop()
    try:
        store, sent, now = MemoryGenerationStore("t"), [], [0.0]
        w, v = _handler(store, sent, lambda: now[0]), _handler(store, sent, lambda: now[0], "v")
        run = loop.run_until_complete
        run(store.register_worker("w", 4))
        run(store.register_worker("v", 4))
        first = run(store.commit("s", 0, "w"))
        run(w.handle(Assign(worker_id="w", session_id="s", generation=first, ts=0.0, prompt="p")))
        run(w.handle(_input(first, 1)))
        run(w.handle(_input(first, 3)))
        now[0] = GAP_WAIT_S + 0.1
        run(w.expire_gaps())
        assert _outcomes(sent) == ([1, 3], [])
        run(w.handle(Suspend(worker_id="w", session_id="s", generation=first, ts=0.0)))
        second = run(store.commit("s", first.epoch, "v"))
        run(v.handle(Assign(worker_id="v", session_id="s", generation=second, ts=0.0, prompt="p", restore=True)))
        assert v.sessions["s"].applied_seq == 3  # from the store's snapshot, not w's host memory
        run(v.handle(_input(second, 2, "v")))
        assert _outcomes(sent) == ([1, 3], [(2, "late")])
    finally:
        loop.close()


def test_a_recovery_does_not_wait_for_inputs_the_log_says_were_refused():
    """A recovery replays the session's inputs from the log; 2 and 3 were refused by dispatch
    (over the rate) and input 4 names them, so the new owner applies 4 at once instead of
    waiting out the gap for inputs that will never come (it waited 5 s before)."""
    loop = asyncio.new_event_loop()
    try:
        pushed = [InputPushed(session_id="s", seq=seq, kind="text", payload=f"in {seq}", ts=0.0) for seq in (1, 4)]
        logged = (LoggedInput(0, 10, pushed[0]), LoggedInput(0, 13, pushed[1], refused_before=(2, 3)))
        store, sent, now = MemoryGenerationStore("t"), [], [0.0]
        handler = _handler(store, sent, lambda: now[0], logged=logged)
        run = loop.run_until_complete
        run(store.register_worker("w", 4))
        gen = run(store.commit("s", 0, "w"))
        run(handler.handle(Assign(worker_id="w", session_id="s", generation=gen, ts=0.0, prompt="p", recover=True)))
        assert _outcomes(sent) == ([], [])  # read beside the serving loop: the session waits for it
        run(asyncio.sleep(0))
        run(handler.replayed())
        assert _outcomes(sent) == ([1, 4], [])
        assert run(store.session("s")).input_seq == 4
    finally:
        loop.close()


def _gap_run(routed: list[tuple[int, tuple[int, ...]]], logged_seqs: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """Inputs routed to one owner (seq, refused_before) while the log holds ``logged_seqs``:
    what it applied at once, and after the gap wait."""
    loop = asyncio.new_event_loop()
    try:
        logged = tuple(LoggedInput(0, seq, InputPushed(session_id="s", seq=seq, kind="text", payload=f"in {seq}",
                                                       ts=0.0)) for seq in logged_seqs)
        store, sent, now = MemoryGenerationStore("t"), [], [0.0]
        handler = _handler(store, sent, lambda: now[0], logged=logged)
        run = loop.run_until_complete
        run(store.register_worker("w", 4))
        gen = run(store.commit("s", 0, "w"))
        run(handler.handle(Assign(worker_id="w", session_id="s", generation=gen, ts=0.0, prompt="p")))
        for seq, named in routed:
            run(handler.handle(RoutedInput(worker_id="w", session_id="s", generation=gen, seq=seq, kind="text",
                                           payload=f"in {seq}", ts=0.0, refused_before=named)))
        at_once = _outcomes(sent)[0]
        now[0] = GAP_WAIT_S + 1
        run(handler.expire_gaps())
        assert _outcomes(sent)[1] == []
        return at_once, _outcomes(sent)[0]
    finally:
        loop.close()


def test_a_gap_is_filled_from_the_log_before_it_is_given_up_on():
    """Input 2's routed copy never came (it went to an owner the session had just left, killed
    before handing it back): after the gap wait the owner finds 2 in the log and applies it,
    then 3, where it applied 3 past 2 and 2 was neither applied nor refused."""
    assert _gap_run([(1, ()), (3, ())], (1, 2, 3)) == ([1], [1, 2, 3])
    assert _gap_run([(1, ()), (3, ())], (1, 3)) == ([1], [1, 3])  # not in the log: given up on


def test_a_seq_dispatch_refused_is_not_applied_from_the_log():
    """Dispatch refused 2 (an input for a session it did not know yet, say) and names it on 3:
    the owner applies 3 at once and never takes 2 from the log."""
    assert _gap_run([(1, ()), (3, (2,))], (1, 2, 3)) == ([1, 3], [1, 3])


def test_the_inputs_applied_are_reported_before_an_offload_or_a_close_is_made_durable():
    """The owner waits for its InputAccepted reports to be acknowledged before it releases the
    session in the store at an offload or a close: killed after the release, the reports were
    lost while the snapshot held the inputs, so the next owner (restoring, not replaying) went
    on past them and they ended neither applied nor refused for anyone reading the topics."""
    loop = asyncio.new_event_loop()
    try:
        store, sent, now = MemoryGenerationStore("t"), [], [0.0]
        seen: list[tuple[int, str]] = []

        async def flush() -> None:  # what was reported, and the store's state, when it is called
            view = await store.session("s")
            seen.append((len([r for r in sent if isinstance(r, InputAccepted)]), view.state if view else "-"))

        handler = _handler(store, sent, lambda: now[0])
        handler.p = replace(handler.p, flush=flush)
        run = loop.run_until_complete
        run(store.register_worker("w", 4))
        gen = run(store.commit("s", 0, "w"))
        run(handler.handle(Assign(worker_id="w", session_id="s", generation=gen, ts=0.0, prompt="p")))
        run(handler.handle(_input(gen, 1)))
        run(handler.handle(_input(gen, 3)))  # waits for 2: applied at the offload, past it
        run(handler.handle(Suspend(worker_id="w", session_id="s", generation=gen, ts=0.0)))
        assert seen == [(2, "active")]  # both reported, then released
        second = run(store.commit("s", gen.epoch, "w"))
        run(handler.handle(Assign(worker_id="w", session_id="s", generation=second, ts=0.0, prompt="p", restore=True)))
        run(handler.handle(_input(second, 4)))
        run(handler.handle(Terminate(worker_id="w", session_id="s", generation=second, ts=0.0)))
        assert seen[-1] == (3, "active") and run(store.session("s")).state == "closed"
    finally:
        loop.close()


def test_an_offload_looks_for_a_missing_input_in_the_log_before_it_gives_up_on_it():
    """Input 2's routed copy went to a worker that was killed: at the offload the owner finds
    2 in the log and applies it before 3, where it gave up on 2 and nobody ever refused it."""
    loop = asyncio.new_event_loop()
    try:
        logged = tuple(LoggedInput(0, seq, InputPushed(session_id="s", seq=seq, kind="text", payload=f"in {seq}",
                                                       ts=0.0)) for seq in (1, 2, 3))
        run, _, store, sent, _ = _offloaded_past_a_gap(loop, logged)
        assert _outcomes(sent) == ([1, 2, 3], []) and run(store.session("s")).skipped == ()
    finally:
        loop.close()
