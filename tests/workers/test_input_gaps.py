"""An owner gives up on a gap in O(its memory of given-up seqs), however far ahead the next
input is numbered: one input with a seq near 2**53 stalled the worker (it listed every seq
up to it) and, through recoveries, every worker that took the session."""

from __future__ import annotations

import tracemalloc
from dataclasses import dataclass

from schemas.records import Generation, RoutedInput
from workers.ownership import MAX_PENDING_INPUTS, Held

GEN = Generation("w1", 1)


@dataclass
class _State:
    input_seq: int = 0


def _input(seq: int) -> RoutedInput:
    return RoutedInput(worker_id="w1", session_id="s", generation=GEN, seq=seq, kind="text", payload="x", ts=0.0)


def test_a_gap_to_a_seq_far_ahead_is_given_up_on_listing_only_the_latest_seqs():
    held = Held(GEN, _State(input_seq=1))
    far = 2**22  # the old listing of every seq took memory in proportion (2**53: for ever)
    assert held.offer(_input(far), 5.0) is None
    assert held.next_input(0.0) is None and held.gap_since == 0.0  # the gap is waited for first
    tracemalloc.start()
    try:
        got = held.next_input(6.0, skip_gaps=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got is not None and got.seq == far
    assert peak < 4 * 1024 * 1024, peak  # a set of 2**22 ints is over 100 MB
    assert held.skipped == set(range(far - MAX_PENDING_INPUTS, far))  # the latest seqs given up on
    late = held.offer(_input(far - 1), 5.0)
    assert late is not None and late.reason == "late"


def test_a_short_gap_keeps_every_seq_given_up_on():
    held = Held(GEN, _State(input_seq=1), skipped={1})
    held.offer(_input(5), 5.0)
    assert held.next_input(6.0, skip_gaps=True).seq == 5
    assert held.skipped == {1, 2, 3, 4}


def test_a_text_conditions_on_its_first_4_kib_only():
    """An input at the 64 KiB bound is hashed no further than 4 KiB (the whole of it, and
    again with each later input, held the worker's loop for seconds, past its heartbeat)."""
    from workers._layers import MAX_TEXT_BYTES, hash_ngrams

    head = "a" * MAX_TEXT_BYTES
    assert hash_ngrams([head + "b" * 60_000], 4096, (1, 2, 3)) == hash_ngrams([head + "c"], 4096, (1, 2, 3))
    assert hash_ngrams(["ab"], 4096, (1, 2, 3)) != hash_ngrams(["ac"], 4096, (1, 2, 3))
    assert len(hash_ngrams([head * 16], 4096, (1, 2, 3))) == 3 * (MAX_TEXT_BYTES + 2) - 3


def test_an_input_older_than_the_seqs_still_listed_is_refused_not_taken_for_a_duplicate():
    """After a jump from 1 to 5000 only the latest 1,024 seqs given up on are listed: 2, 3,
    2000 and 3975 came later and were dropped without a word, taken for copies of inputs
    applied. They are refused; a copy of 5000 is still a duplicate, 3976 late as before."""
    held = Held(GEN, _State(input_seq=1))
    assert held.offer(_input(5000), 5.0) is None
    got = held.next_input(6.0, skip_gaps=True)
    assert got is not None and got.seq == 5000
    held.state.input_seq = 5000
    for seq in (2, 3, 2000, 5000 - MAX_PENDING_INPUTS - 1):
        refused = held.offer(_input(seq), 5.0)
        assert refused is not None and refused.reason == "late" and "still tells apart" in refused.detail, seq
    assert held.offer(_input(5000 - MAX_PENDING_INPUTS), 5.0).reason == "late"  # listed: given up on
    assert held.offer(_input(5000), 5.0) is None  # applied: a duplicate, its verdict stands


def test_a_gap_given_up_on_with_nothing_dropped_from_the_list_refuses_no_copy_of_an_applied_input():
    held = Held(GEN, _State(input_seq=10))
    assert held.offer(_input(13), 5.0) is None
    assert held.next_input(6.0, skip_gaps=True).seq == 13
    held.state.input_seq = 13
    assert held.skipped == {11, 12} and held.untold_below == 0
    assert held.offer(_input(5), 5.0) is None  # applied before the gap: a duplicate
    assert held.offer(_input(12), 5.0).reason == "late"


def test_a_full_list_from_a_snapshot_refuses_what_is_older_than_it():
    """A new owner starts from the snapshot's list, which keeps only the latest seqs: below a
    full one it cannot tell a copy from an input given up on, so it refuses."""
    from streams.store_ops import MAX_SKIPPED

    listed = set(range(1000, 1000 + MAX_SKIPPED))
    held = Held(GEN, _State(input_seq=2000), skipped=listed)
    assert held.untold_below == 1000
    assert held.offer(_input(999), 5.0).reason == "late"
    assert held.offer(_input(1500), 5.0) is None  # within the list's reach, not in it: applied
    assert Held(GEN, _State(input_seq=2000), skipped=set(list(listed)[1:])).untold_below == 0


def test_a_seq_used_again_by_a_later_record_is_refused_and_the_same_record_again_is_not():
    """A producer that restarted numbering from 1 wrote seqs 1-3 again after 1-5 were applied:
    dispatch routed them and the owner dropped them without a word (taken for duplicate
    deliveries), so they were neither accepted nor refused. A record later in the log than the
    last applied input is refused; the applied record delivered again stays a silent duplicate."""
    def at(seq: int, offset: int, partition: int = 3) -> RoutedInput:
        return RoutedInput(worker_id="w1", session_id="s", generation=GEN, seq=seq, kind="text", payload="x",
                           ts=0.0, source_partition=partition, source_offset=offset)

    held = Held(GEN, _State(input_seq=0))
    for seq in range(1, 6):
        assert held.offer(at(seq, 10 + seq), 5.0) is None
        got = held.next_input(0.0)
        held.state.input_seq = got.seq
        held.applied(got)
    assert held.input_pos == (3, 15)
    assert held.offer(at(5, 15), 5.0) is None and held.offer(at(2, 12), 5.0) is None  # delivered again
    refused = held.offer(at(1, 16), 5.0)  # seq 1 once more, after the last applied input
    assert refused is not None and refused.reason == "late" and "uses its seq again" in refused.detail
    assert "next_seq" in refused.detail
    assert held.offer(at(6, 17), 5.0) is None  # the seq that goes on is taken
    fresh = Held(GEN, _State(input_seq=5))  # restored from a snapshot without a position: as before
    assert fresh.offer(at(1, 16), 5.0) is None
