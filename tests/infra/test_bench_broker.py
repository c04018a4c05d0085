"""``chunkserve bench broker`` loads an embedded broker and samples its CPU per window."""

from __future__ import annotations

import pytest

from infra.bench.broker import run

pytestmark = pytest.mark.integration


def test_broker_bench_samples_every_window(monkeypatch):
    monkeypatch.delenv("CHUNKSERVE_KAFKA_BOOTSTRAP", raising=False)
    out = run(rate=200, seconds=3, partitions=2, window_s=1.0)
    assert len(out["windows"]) >= 2
    assert [w["records"] for w in out["windows"]] == sorted(w["records"] for w in out["windows"])
    assert out["windows"][-1]["records"] <= 600 and all(w["broker_cpu_pct"] >= 0 for w in out["windows"])
    assert out["last_window_cpu_pct"] == out["windows"][-1]["broker_cpu_pct"]


def test_broker_bench_refuses_an_external_broker(monkeypatch):
    monkeypatch.setenv("CHUNKSERVE_KAFKA_BOOTSTRAP", "kafka:9092")
    with pytest.raises(ValueError, match="embedded"):
        run(rate=10, seconds=2)
