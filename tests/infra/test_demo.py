"""`chunkserve demo`: the autoscaled fleet serves the default trace (scale-out, then drains
with migrations and shutdowns) or a trace file, and the audit is clean."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_the_default_demo_scales_out_then_drains_moves_and_shuts_down(tmp_path):
    """`make demo` as it runs: the generated load rises, then falls to 4 sessions; the fleet
    scales out, then drains a worker that still holds sessions, moves them off at chunk
    boundaries and shuts it down, with a clean audit, a report and the plot."""
    env = dict(os.environ)
    env.pop("CHUNKSERVE_KAFKA_BOOTSTRAP", None)  # the demo starts its own embedded broker
    report = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "infra", "demo", "--report-dir", str(report), "--log-dir", str(tmp_path / "logs")],
        env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "ownership audit: dual-owner releases 0, stale releases 0" in proc.stdout
    summary = json.loads((report / "summary.json").read_text())
    events, log = summary["scale_events"], summary["scale_log"]
    assert events["scale_out"] >= 1 and events["drain"] >= 1 and events["shutdown"] >= 1, log
    assert summary["drain_migrations"] >= 1, log  # a drained worker held sessions, moved off
    drained = {line.split()[2] for line in log if line.split()[1] == "drain"}
    moved_off = {line.split()[3].split("->")[0] for line in log if line.split()[1] == "migrate"}
    shut = {line.split()[2] for line in log if line.split()[1] == "shutdown"}
    assert drained & moved_off & shut, log  # one worker drained, emptied and shut down
    assert summary["sessions"] >= 5 and summary["chunks"] > 0 and summary["offloads"] > 0
    assert all(v == 0 for v in summary["audit"].values()), summary["audit"]
    assert sum(summary["dead_letter_reasons"].values()) == summary["dead_letters"]  # each one's reason said
    assert set(summary["dead_letter_examples"]) == set(summary["dead_letter_reasons"])  # with its first as written
    assert (report / "timeline.png").stat().st_size > 10_000


def test_a_trace_file_is_replayed(tmp_path):
    """``--trace``: 18 sessions from a file, the fleet scales out for them, the audit is clean
    (the scale-in is the default demo's test)."""
    rows = ["t_s,session_id,event"]
    rows += [f"{i * 0.2:.1f},s{i},open" for i in range(18)]
    rows += [f"{100 + i:.1f},s{i},close" for i in range(3, 18)]
    rows += [f"{200 + i:.1f},s{i},close" for i in range(3)]
    trace = tmp_path / "rise-and-fall.csv"
    trace.write_text("\n".join(rows) + "\n")
    env = dict(os.environ)
    env.pop("CHUNKSERVE_KAFKA_BOOTSTRAP", None)
    report = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "infra", "demo", "--trace", str(trace), "--max-workers", "3", "--report-dir", str(report)],
        env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((report / "summary.json").read_text())
    assert summary["scale_events"]["scale_out"] >= 1, summary["scale_log"]
    assert summary["sessions"] == 18 and summary["chunks"] > 0
    assert all(v == 0 for v in summary["audit"].values()), summary["audit"]


def test_the_scale_log_names_each_migration_and_counts_those_off_drained_workers():
    from infra.demo import drain_migrations, scale_log
    from schemas.records import Drain, Generation, Reinstate, Released, WorkerDown

    def moved(sid: str, src: str, ts: float) -> Released:
        return Released(worker_id=src, session_id=sid, generation=Generation(src, 1), ts=ts, reason="migrated",
                        successor=Generation("w2", 2))

    records = [moved("a", "w1", 10.0), Drain(pool="default", worker_id="w1", ts=11.0), moved("b", "w1", 12.0),
               moved("c", "w3", 13.0)]
    assert drain_migrations(records) == 1  # b: a moves before the drain, c off a worker not drained
    assert scale_log(records, 10.0) == ["0.0 migrate a w1->w2", "1.0 drain w1", "2.0 migrate b w1->w2",
                                        "3.0 migrate c w3->w2"]
    back = records + [Reinstate(pool="default", worker_id="w1", ts=14.0), moved("d", "w1", 15.0),
                      Drain(pool="default", worker_id="w1", ts=16.0), moved("e", "w1", 17.0)]
    assert drain_migrations(back) == 2  # b and e: d moved off w1 while it was taken back
    assert scale_log(back, 10.0)[4:] == ["4.0 reinstate w1", "5.0 migrate d w1->w2", "6.0 drain w1", "7.0 migrate e w1->w2"]
    downs = [WorkerDown(worker_id="w1", ts=14.0, reason="shutdown"),
             WorkerDown(worker_id="w1", ts=14.5, reason="shutdown by provisioner")]
    assert scale_log(downs, 10.0) == ["4.0 down w1 (shutdown)", "4.5 down w1 (shutdown by provisioner)"]


def test_dead_letters_are_summed_by_reason_with_numbers_and_ids_folded():
    from infra.demo import dead_letter_reasons
    from schemas.records import DeadLetter

    def dead(why: str) -> DeadLetter:
        return DeadLetter(source_topic="session-inputs", partition=0, offset=1, reason=why, consumer="dispatch", ts=1.0)

    got = dead_letter_reasons([dead("session closed before input 3 was applied (late at 'w1')"),
                               dead("session closed before input 17 was applied (late at 'w2')"),
                               dead("refused: input rate over 2.5/s"),
                               dead("refused: session s000050 was closed: a session id is not used again"),
                               dead("refused: session s000051 was closed: a session id is not used again")])
    assert got == {"session closed before input N was applied": 2, "refused: input rate over N/s": 1,
                   "refused: session N was closed: a session id is not used again": 2}
    from infra.demo import dead_letter_examples  # and each group's first, as written: its worker ids readable

    assert dead_letter_examples([dead("session closed before input 3 was applied (late at 'w1')"),
                                 dead("session closed before input 17 was applied (late at 'w2')")]) == {
        "session closed before input N was applied": "session closed before input 3 was applied (late at 'w1')"}
