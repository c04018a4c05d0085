"""``chunkserve bench broker`` loads an embedded broker and samples its CPU per window."""

from __future__ import annotations

import pytest

from infra.bench.broker import HOP_FLOOR_WAITS_MS, run

pytestmark = pytest.mark.integration


@pytest.mark.tansu
def test_broker_bench_samples_every_window_on_both_embedded_brokers(monkeypatch):
    monkeypatch.delenv("CHUNKSERVE_KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.setenv("CHUNKSERVE_EMBEDDED_BROKER", "kafka")
    top = run(rate=200, seconds=3, partitions=2, window_s=1.0, compare=True)
    assert top["broker"]["kind"] == "apache-kafka" and top["broker"]["brokers"] == 1
    assert top["broker"]["version"].startswith("4.")
    assert list(top["compare"]) == ["tansu"] and top["compare"]["tansu"]["broker"]["kind"] == "tansu"
    for out in (top, top["compare"]["tansu"]):
        assert len(out["windows"]) >= 2
        assert [w["records"] for w in out["windows"]] == sorted(w["records"] for w in out["windows"])
        assert out["windows"][-1]["records"] <= 600 and all(w["broker_cpu_pct"] >= 0 for w in out["windows"])
        assert out["last_window_cpu_pct"] == out["windows"][-1]["broker_cpu_pct"]
        # every record sent in a window was read back and timed (a hop cannot take negative time)
        assert all(0 < w["hop_ms"]["p50"] <= w["hop_ms"]["p99"] for w in out["windows"])
        assert sorted(out["hop_floor_ms"]) == sorted(str(w) for w in HOP_FLOOR_WAITS_MS)
        assert all(0 < h["p50"] <= h["p99"] for h in out["hop_floor_ms"].values())


def test_broker_bench_refuses_an_external_broker(monkeypatch):
    monkeypatch.setenv("CHUNKSERVE_KAFKA_BOOTSTRAP", "kafka:9092")
    with pytest.raises(ValueError, match="embedded"):
        run(rate=10, seconds=2)


@pytest.mark.tansu
def test_embedded_tansu_runs_one_runtime_thread_unless_told_otherwise(tmp_path, monkeypatch):
    from infra.embedded import EmbeddedTansu

    def environ_of(broker: EmbeddedTansu) -> dict[str, str]:
        raw = open(f"/proc/{broker.pid}/environ", "rb").read().split(b"\0")
        return dict(item.decode().split("=", 1) for item in raw if b"=" in item)

    monkeypatch.delenv("TOKIO_WORKER_THREADS", raising=False)
    broker = EmbeddedTansu(log_path=tmp_path / "a.log").start()
    try:
        assert environ_of(broker)["TOKIO_WORKER_THREADS"] == "1"
    finally:
        broker.stop()
    monkeypatch.setenv("TOKIO_WORKER_THREADS", "3")  # an operator's own setting wins
    broker = EmbeddedTansu(log_path=tmp_path / "b.log").start()
    try:
        assert environ_of(broker)["TOKIO_WORKER_THREADS"] == "3"
    finally:
        broker.stop()
