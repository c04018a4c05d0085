"""Prometheus exposition: every family from the start, names with units, the fleet figures."""

from __future__ import annotations

import urllib.request
from typing import get_args

from prometheus_client import CollectorRegistry, generate_latest

from processors.agents.metrics import SessionTally, observe_fleet
from schemas import records as r
from schemas.topics import TOPICS
from streams.prom import fleet_metrics, metrics, start_metrics_server

G = r.Generation("w1", 1)


def _exposed(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def test_a_process_that_has_seen_nothing_exposes_every_topic_at_zero():
    registry = CollectorRegistry()
    metrics(registry)
    body = _exposed(registry)
    for topic in TOPICS:
        for name in ("consumed", "produced", "dead_lettered"):
            assert f'chunkserve_records_{name}_total{{topic="{topic}"}} 0.0' in body
        assert f'chunkserve_event_time_replaced_total{{topic="{topic}"}} 0.0' in body
    # and every refusal reason (these families had only their HELP line until the first one)
    fleet_metrics(registry)
    body = _exposed(registry)
    for reason in get_args(r.RejectReason):
        assert f'chunkserve_commands_rejected_total{{reason="{reason}"}} 0.0' in body
        assert f'chunkserve_fleet_commands_rejected_total{{reason="{reason}"}} 0.0' in body


def test_names_carry_their_units():
    registry = CollectorRegistry()
    metrics(registry)
    fleet_metrics(registry)
    names = {m.name for m in registry.collect()}
    assert "chunkserve_worker_device_utilization_ratio" in names
    assert "chunkserve_worker_device_utilization" not in names
    for m in registry.collect():
        if m.type == "counter":  # the client adds _total to the samples
            assert all(s.name.endswith(("_total", "_created")) for s in m.samples), m.name
        elif m.name.endswith(("latency", "seconds_total")):
            raise AssertionError(f"{m.name}: a time without its unit")


def test_the_metrics_endpoint_listens_where_it_is_told():
    from infra.embedded import free_port

    registry = CollectorRegistry()
    server = start_metrics_server(free_port(), registry, addr="0.0.0.0")
    try:
        assert server.server_address[0] == "0.0.0.0"
        body = urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics").read().decode()
    finally:
        server.shutdown()
    assert 'chunkserve_records_consumed_total{topic="worker-events"} 0.0' in body


def test_sessions_by_state_follow_the_lifecycle_and_closed_ones_stay_closed():
    tally = SessionTally()
    for rec in [r.SessionOpened(session_id="a", ts=1), r.SessionOpened(session_id="b", ts=1),
                r.SessionOpened(session_id="c", ts=1), r.SessionIdle(session_id="b", ts=2),
                r.SessionIdle(session_id="b", ts=2),  # a duplicate changes nothing
                r.SessionClosed(session_id="c", ts=3),
                r.SessionActive(session_id="z", ts=3),  # its open not seen: active all the same
                r.Heartbeat(worker_id="w1", ts=3, sessions=0, executing=0, capacity=1),
                r.SessionOpened(session_id="c", ts=4)]:  # a closed id opened again: dispatch refuses it
        tally.fold(rec)
    assert tally.counts() == {"active": 2, "idle": 1}
    assert set(tally.open) == {"a", "b", "z"} and set(tally.closed) == {"c"}


def test_fleet_figures_from_the_records_that_carry_them():
    registry = CollectorRegistry()
    fleet = fleet_metrics(registry)
    assert 'chunkserve_fleet_scale_events_total{direction="scale-in"} 0.0' in _exposed(registry)
    for rec in [r.ChunkDone(worker_id="w1", session_id="a", generation=G, chunk_index=0, ts=1, latency_s=0.03),
                r.ChunkDone(worker_id="w1", session_id="a", generation=G, chunk_index=1, ts=2, latency_s=0.3),
                r.Released(worker_id="w1", session_id="a", generation=G, ts=3, reason="migrated"),
                r.Released(worker_id="w1", session_id="b", generation=G, ts=3, reason="closed"),
                r.CommandRejected(worker_id="w1", session_id="a", command="cmd.assign", reason="stale_epoch", ts=4),
                r.ScalingDecision(ts=5, current=1, target=2, u_max=0.9, u_target=0.5, delta=0.1, level=1,
                                  reason="scale-out"),
                r.CostTick(ts=6, gpus=2, gpu_seconds=120.0, cost=0.5),
                r.CostTick(ts=6, gpus=9, gpu_seconds=9.0, cost=9.0, pool="other")]:  # a pool's: not the total
        observe_fleet(fleet, rec)
    body = _exposed(registry)
    assert "chunkserve_fleet_chunk_latency_seconds_count 2.0" in body
    assert 'chunkserve_fleet_chunk_latency_seconds_bucket{le="0.05"} 1.0' in body
    assert "chunkserve_fleet_migrations_total 1.0" in body
    assert 'chunkserve_fleet_commands_rejected_total{reason="stale_epoch"} 1.0' in body
    assert 'chunkserve_fleet_scale_events_total{direction="scale-out"} 1.0' in body
    assert "chunkserve_fleet_workers 2.0" in body and "chunkserve_fleet_cost_dollars 0.5" in body
    assert "chunkserve_fleet_gpu_seconds 120.0" in body


def test_the_grafana_dashboard_plots_only_metrics_that_exist():
    import json
    import re
    from pathlib import Path

    doc = json.loads((Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json").read_text())
    registry = CollectorRegistry()
    metrics(registry)
    fleet_metrics(registry)
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    samples = {m.name + x for m in registry.collect() for x in suffixes[m.type]}
    gauges = {m.name for m in registry.collect() if m.type == "gauge"}
    titles = {p["title"] for p in doc["panels"]}
    assert {"Workers", "Sessions", "Chunk latency", "Migrations", "Scale events", "Cost",
            "Rejections by reason"} <= titles
    for p in doc["panels"]:
        for target in p["targets"]:
            for name in re.findall(r"chunkserve_[a-z_]+", target["expr"]):
                assert name in samples, f"panel {p['title']!r} plots {name}, which nothing exports"
            # rate and increase read counters only (on a gauge Prometheus warns, and a drop reads as a reset)
            for name in re.findall(r"(?:rate|increase)\((chunkserve_[a-z_]+)", target["expr"]):
                assert name not in gauges, f"panel {p['title']!r} takes the rate of the gauge {name} (deriv reads one)"
