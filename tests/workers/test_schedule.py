"""The worker's due-chunk schedule finds exactly what a full scan of its sessions finds."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.records import Generation
from workers.ownership import Held
from workers.schedule import Schedule

OPS = st.lists(st.tuples(st.sampled_from(["add", "move", "drop", "pop"]), st.integers(0, 7),
                         st.floats(0.0, 10.0)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_schedule_matches_a_full_scan(ops):
    sessions: dict[str, Held] = {}
    schedule = Schedule(sessions)
    for op, n, t in ops:
        sid = f"s{n}"
        if op == "add":
            sessions[sid] = Held(Generation("w", 1), state=SimpleNamespace(input_seq=0), next_due=t)
            schedule.add(sid, sessions[sid])
        elif op == "move" and sid in sessions:  # a chunk ran, or a resume: due at another time
            sessions[sid].next_due = t
            schedule.add(sid, sessions[sid])
        elif op == "drop":
            sessions.pop(sid, None)
        elif op == "pop":
            expected = sorted(s for s, x in sessions.items() if x.next_due <= t)
            due = schedule.pop_due(t)
            assert sorted(s for s, _ in due) == expected
            assert all(sessions[s] is x for s, x in due)
            for s, x in due:  # served: due again later
                x.next_due = t + 1.0 + n
                schedule.add(s, x)
        first = schedule.first()
        assert first == min((x.next_due for x in sessions.values()), default=None)
