"""The refusal a worker sends back for an input of a session it does not hold names the
store's state as the store says it (the dead-letter reason an operator reads)."""

from __future__ import annotations

from schemas.records import Generation, RoutedInput
from streams.store_records import StoreState
from workers.ownership import stray_input_refusal


def _input(gen: Generation) -> RoutedInput:
    return RoutedInput(worker_id="w1", session_id="s", generation=gen, seq=4, kind="text", payload="x", ts=0.0)


def test_a_stray_input_is_refused_with_the_stores_word_for_the_state():
    gen = Generation("w1", 3)
    assert stray_input_refusal(_input(gen), StoreState.ACTIVE, gen) is None  # its Assign is on the way: wait
    moved = stray_input_refusal(_input(gen), StoreState.SUSPENDED, gen)
    assert moved is not None and moved.reason == "not_owner" and moved.detail == "current: w1@3 (suspended)"
    newer = stray_input_refusal(_input(gen), StoreState.ACTIVE, Generation("w2", 4))
    assert newer is not None and newer.reason == "stale_epoch" and newer.detail == "current: w2@4 (active)"
    unknown = stray_input_refusal(_input(gen), None, None)
    assert unknown is not None and unknown.detail == "current: None (unknown)"
