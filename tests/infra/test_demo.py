"""`chunkserve demo`, short: the autoscaled fleet serves a trace and the audit is clean."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_demo_runs_short_and_writes_its_report(tmp_path):
    env = dict(os.environ)
    env.pop("CHUNKSERVE_KAFKA_BOOTSTRAP", None)  # the demo starts its own embedded broker
    report = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "infra", "demo", "--duration", "25", "--sessions", "16",
         "--report-dir", str(report), "--log-dir", str(tmp_path / "logs")],
        env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "ownership audit: dual-owner releases 0, stale releases 0" in proc.stdout
    summary = json.loads((report / "summary.json").read_text())
    assert summary["chunks"] > 0 and summary["workers_started"] >= 1
    assert summary["scale_events"]["scale_out"] >= 1
    assert summary["sessions"] >= 5
    assert all(v == 0 for v in summary["audit"].values()), summary["audit"]
    assert (report / "timeline.png").stat().st_size > 10_000
