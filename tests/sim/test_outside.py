"""The fourth workload model's traces (an outside reviewer's) have the shapes they claim,
round-trip through a trace file with their state growth, and scale with the sessions asked for."""

from __future__ import annotations

import numpy as np
import pytest

from infra.sim.evaluate import OUTSIDE_SPLIT, TraceSpec, make_trace
from infra.sim.outside import OUTSIDE, OutsideConfig, generate_outside
from infra.sim.trace import load_trace, write_trace
from processors.lifecycle import EventKind
from schemas.errors import ConfigError


def _opens(events):
    return np.array([e.t for e in events if e.kind is EventKind.OPEN])


def _executing(events, at):
    """Sessions executing just after ``at``."""
    running: set[str] = set()
    for e in events:
        if e.t > at:
            break
        if e.kind in (EventKind.OPEN, EventKind.ACTIVE):
            running.add(e.session_id)
        else:
            running.discard(e.session_id)
    return len(running)


@pytest.mark.parametrize("family", OUTSIDE)
def test_traces_are_seeded_valid_and_round_trip_with_their_growth(family, tmp_path):
    cfg = OutsideConfig(family, duration_s=300.0)
    events = generate_outside(cfg)
    assert events == generate_outside(cfg) != generate_outside(OutsideConfig(family, duration_s=300.0, seed=12))
    write_trace(events, tmp_path / "t.csv")
    assert list(load_trace(tmp_path / "t.csv").events) == events  # sizes on active rows kept
    grows = any(e.kind is EventKind.ACTIVE and e.state_bytes for e in events)
    assert grows == (family in ("weekly", "bimodal"))  # some sessions grow there


def test_each_family_has_its_shape():
    hawkes, weekly, bimodal, recall = (generate_outside(OutsideConfig(f)) for f in OUTSIDE)
    assert sum(e.t == 0 for e in hawkes) < 3 and sum(e.t == 0 for e in recall) < 3  # launches
    assert sum(e.t == 0 and e.kind is EventKind.OPEN for e in weekly) == 260
    assert sum(e.t == 0 and e.kind is EventKind.OPEN for e in bimodal) == 380
    per10 = [np.bincount((_opens(x) // 10).astype(int)) for x in (hawkes, recall)]
    dispersion = [p.var() / p.mean() for p in per10]
    assert dispersion[0] > 2.0 > 1.5 > dispersion[1]  # arrivals that excite more; Poisson ones (about 1)
    assert _executing(recall, 723.0) > 2 * _executing(recall, 715.0)  # the recall at 0.6 of the trace
    day = 1200.0 / 7  # Thursday 07:00 is 17 h after the start: the morning ramp
    before = np.sum((_opens(weekly) > 17 / 24 * day - 20) & (_opens(weekly) < 17 / 24 * day))
    after = np.sum((_opens(weekly) > 17 / 24 * day + 6) & (_opens(weekly) < 17 / 24 * day + 26))
    assert after > 5 * max(1, before)


def test_the_split_is_the_reviewers_traces_and_scales_with_sessions():
    assert [s.name for s in OUTSIDE_SPLIT] == ["hawkes/s11", "weekly/s11", "bimodal/s11", "recall/s11"]
    base = make_trace(TraceSpec("bimodal", 11, 300.0))
    double = make_trace(TraceSpec("bimodal", 11, 300.0, sessions=3200))
    assert 1.7 < double.sessions / base.sessions < 2.3
    with pytest.raises(ConfigError):
        OutsideConfig("nope")
