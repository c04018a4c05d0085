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
    assert sum(summary["dead_letter_reasons"].values()) == summary["dead_letters"]  # each one's reason said
    assert (report / "timeline.png").stat().st_size > 10_000


def test_fleet_scales_out_then_in_and_sessions_survive(tmp_path):
    """A trace that rises to 18 active sessions then falls to 3: the autoscaler scales out,
    then drains workers and shuts them down once empty while the sessions left keep running;
    the audit stays clean."""
    rows = ["t_s,session_id,event"]
    rows += [f"{i * 0.2:.1f},s{i},open" for i in range(18)]
    rows += [f"{150 + i:.1f},s{i},close" for i in range(3, 18)]  # the load falls at 15 s of wall time
    rows += [f"{700 + i:.1f},s{i},close" for i in range(3)]  # 55 s of wall time to scale in
    trace = tmp_path / "rise-and-fall.csv"
    trace.write_text("\n".join(rows) + "\n")
    env = dict(os.environ, CHUNKSERVE_BURST_MEMORY_S="0")  # no burst reserve: scale in on the fall
    env.pop("CHUNKSERVE_KAFKA_BOOTSTRAP", None)
    report = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "infra", "demo", "--trace", str(trace), "--duration", "75", "--max-workers", "3",
         "--report-dir", str(report)], env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((report / "summary.json").read_text())
    events = summary["scale_events"]
    assert events["scale_out"] >= 1 and events["drain"] >= 1 and events["shutdown"] >= 1, summary["scale_log"]
    assert any(line.split()[1] == "drain" for line in summary["scale_log"])  # the log shows it too
    assert summary["sessions"] == 18 and summary["chunks"] > 0
    assert all(v == 0 for v in summary["audit"].values()), summary["audit"]


def test_dead_letters_are_summed_by_reason_with_numbers_and_ids_folded():
    from infra.demo import dead_letter_reasons
    from schemas.records import DeadLetter

    def dead(why: str) -> DeadLetter:
        return DeadLetter(source_topic="session-inputs", partition=0, offset=1, reason=why, consumer="dispatch", ts=1.0)

    got = dead_letter_reasons([dead("session closed before input 3 was applied (late at 'w1')"),
                               dead("session closed before input 17 was applied (late at 'w2')"),
                               dead("refused: input rate over 2.5/s")])
    assert got == {"session closed before input N was applied (late at N)": 2, "refused: input rate over N/s": 1}
