"""The fifth workload model's traces (a second outside reviewer's) have the shapes they
claim, round-trip through a trace file and scale with the sessions asked for."""

from __future__ import annotations

import numpy as np
import pytest

from infra.sim.evaluate import REVIEW_SPLIT, TraceSpec, make_trace
from infra.sim.review import REVIEW, ReviewConfig, generate_review
from infra.sim.trace import MB, load_trace, write_trace
from processors.lifecycle import EventKind
from schemas.errors import ConfigError


def _executing(events, step=10.0, end=1200.0):
    """Sessions executing at each multiple of ``step``."""
    running: set[str] = set()
    out, i, at = [], 0, 0.0
    while at < end:
        while i < len(events) and events[i].t <= at:
            e = events[i]
            (running.add if e.kind in (EventKind.OPEN, EventKind.ACTIVE) else running.discard)(e.session_id)
            i += 1
        out.append(len(running))
        at += step
    return np.array(out)


@pytest.mark.parametrize("family", REVIEW)
def test_traces_are_seeded_valid_and_round_trip(family, tmp_path):
    cfg = ReviewConfig(family, duration_s=300.0)
    events = generate_review(cfg)
    assert events == generate_review(cfg) != generate_review(ReviewConfig(family, duration_s=300.0, seed=7))
    write_trace(events, tmp_path / "t.csv")
    assert list(load_trace(tmp_path / "t.csv").events)[: len(events)] == events  # (those left open close at the end)
    assert all(100 * MB <= e.state_bytes <= 40000 * MB for e in events if e.kind is EventKind.OPEN)  # 0.1-40 GB


def test_each_family_has_its_shape():
    office, viral, batchy = (generate_review(ReviewConfig(f)) for f in REVIEW)
    at0 = [sum(e.t == 0 and e.kind is EventKind.OPEN for e in x) for x in (office, viral, batchy)]
    assert at0[0] > 100 and at0[1] == 0 and at0[2] > 40  # mid-stream, a launch, mid-stream
    opens = np.array([e.t for e in viral if e.kind is EventKind.OPEN])
    per_min = np.bincount((opens // 60).astype(int), minlength=20)
    assert per_min[13:15].sum() > 5 * per_min[0:2].sum()  # doubling every 4 minutes, eightfold from 12 on
    office_opens = np.array([e.t for e in office if e.kind is EventKind.OPEN and e.t > 0])
    assert np.sum(np.abs(office_opens - 600) < 120) > 2 * np.sum(office_opens < 240)  # the sine's top halfway
    swing = np.diff(_executing(batchy, step=30.0))
    assert swing.max() > 40 and swing.min() < -40  # groups join together and leave together


def test_the_split_is_the_reviewers_traces_and_scales_with_sessions():
    assert [s.name for s in REVIEW_SPLIT] == ["office/s2024", "viral/s2024", "batchy/s2024"]
    one, two = (make_trace(TraceSpec("batchy", 3, 600.0, n)) for n in (1600, 3200))
    assert 1.6 * one.sessions < two.sessions < 2.4 * one.sessions
    with pytest.raises(ConfigError):
        ReviewConfig("weekly")


def test_trace_gen_and_evaluate_name_the_fifth_models_families(tmp_path):
    from typer.testing import CliRunner

    from infra.cli import app

    out = tmp_path / "b.csv"
    ok = CliRunner().invoke(app, ["trace", "gen", "--family", "batchy", "--duration", "120", "--sessions", "100", "-o", str(out)])
    assert ok.exit_code == 0, ok.output
    assert list(load_trace(out).events)[:3] == generate_review(ReviewConfig("batchy", 120.0, 100 / 1600, 0))[:3]
    split = CliRunner().invoke(app, ["evaluate", "--split", "bogus"])
    assert split.exit_code == 2 and "review" in split.output
    only = CliRunner().invoke(app, ["evaluate", "--split", "review", "--only", "batchy/s0"])
    assert only.exit_code == 2 and "batchy/s2024" in only.output  # the split's seed is named
