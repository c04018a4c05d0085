"""The detector's default thresholds against the trace generator's volatility levels."""

from __future__ import annotations

import numpy as np
import pytest

from infra.sim.simulator import signals_for
from infra.sim.tracegen import GenConfig, generate
from processors.detector import DetectorConfig


def _levels_read(level, seed):
    events = generate(GenConfig(level=level, duration_s=900.0, sessions=1250, seed=seed))
    sigs = signals_for(events, 5.0, DetectorConfig()).signals
    return float(np.median([s.level for s in sigs if s.now >= 60.0]))


@pytest.mark.parametrize("seed", [0, 1])
def test_default_thresholds_read_generated_levels(seed):
    """Calibration: the same load at level 1 reads calm, at 5 middling, at 10 bursty."""
    assert _levels_read(1, seed) <= 2
    assert 4 <= _levels_read(5, seed) <= 6
    assert _levels_read(10, seed) >= 9
