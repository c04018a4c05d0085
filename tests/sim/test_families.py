"""Trace families have the shapes they claim (seeded; small traces)."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from infra.sim.families import FAMILIES, FamilyConfig, generate_family
from infra.sim.trace import parse_trace, write_trace
from processors.lifecycle import EventKind

BOOT_S = 60.0


def _gen(family, **kw):
    return generate_family(FamilyConfig(family, **{"duration_s": 1200.0, "sessions": 1200, **kw}))


def _times(events, kind):
    return np.array([e.t for e in events if e.kind is kind])


@pytest.mark.parametrize("family", FAMILIES)
def test_families_are_valid_reproducible_traces(family, tmp_path):
    events = _gen(family, duration_s=300.0, sessions=200)
    assert events == _gen(family, duration_s=300.0, sessions=200)
    assert events != _gen(family, duration_s=300.0, sessions=200, seed=1)
    write_trace(events, tmp_path / "t.csv")
    with open(tmp_path / "t.csv", newline="") as fh:
        parsed = parse_trace(csv.reader(fh))
    assert len(parsed.events) == len(events)


def _burst(times, width):
    """Most events within any window of ``width`` seconds (after time 0)."""
    t = np.sort(times[times > 0])
    return int((np.searchsorted(t, t + width) - np.arange(t.size)).max()) if t.size else 0


def _active_mean(events):
    n, area, last = 0, 0.0, 0.0
    for e in events:
        area += n * (e.t - last)
        last = e.t
        n += {EventKind.OPEN: 1, EventKind.ACTIVE: 1, EventKind.IDLE: -1}.get(e.kind, 0)
        if e.kind is EventKind.CLOSE:
            n = max(0, n - 1)
    return area / last


def test_flash_crowds_rise_far_faster_than_a_boot():
    flash, calm = _gen("flash"), _gen("calm")
    width = BOOT_S / 6  # 10 s
    crowd = _burst(_times(flash, EventKind.OPEN), width)
    assert crowd > 4 * _burst(_times(calm, EventKind.OPEN), width)
    assert crowd > 0.2 * _active_mean(flash)  # a fifth of the load arrives within a sixth of a boot


def test_mass_idle_pauses_half_the_active_sessions_together():
    paused, calm = _gen("mass-idle"), _gen("calm")
    together = _burst(_times(paused, EventKind.IDLE), 2.0)
    assert together > 5 * _burst(_times(calm, EventKind.IDLE), 2.0)
    assert together > 0.3 * _active_mean(paused)
    back = _burst(_times(paused, EventKind.ACTIVE), 10.0)
    assert back > 2 * _burst(_times(calm, EventKind.ACTIVE), 10.0)  # and come back together


def test_longtail_durations_have_a_heavier_tail():
    def long_share(events):  # sessions opened in (0, 300]: share lasting 10x their median (censored at the end)
        start, end = {}, {}
        for e in events:
            if e.kind is EventKind.OPEN and 0 < e.t <= 300:
                start[e.session_id] = e.t
            elif e.kind is EventKind.CLOSE and e.session_id in start:
                end[e.session_id] = e.t
        life = np.array([end[s] - start[s] for s in start])
        return float(np.mean(life > 10 * np.median(life)))

    assert long_share(_gen("longtail")) > 0.02 > 5 * long_share(_gen("calm"))


def test_diurnal_swings_and_scale4x_is_four_times_calm():
    opens = _times(_gen("diurnal"), EventKind.OPEN)
    per = np.histogram(opens[opens > 0], bins=np.arange(0, 1201, 100.0))[0]
    assert per.max() > 5 * max(1, per.min())
    calm = len({e.session_id for e in _gen("calm")})
    big = len({e.session_id for e in _gen("scale4x")})
    assert 3.4 * calm < big < 4.6 * calm
