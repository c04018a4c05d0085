"""The pip-only path: with no Java the embedded broker is Tansu, and chunkserve still serves.

Most tests run on the embedded Apache Kafka; these keep the fallback honest: the rule that
picks it, the line that says what it loses, and sessions served end to end on it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Iterator

import pytest

from infra.embedded import TANSU_LOSES, embedded_broker_kind, for_tansu, start_embedded_broker
from infra.flow import run_flow
from schemas.errors import ConfigError, InfraError
from streams.config import Settings

pytestmark = [pytest.mark.integration, pytest.mark.tansu]


def test_the_one_rule_picks_kafka_where_java_is_and_tansu_where_it_is_not(tmp_path):
    no_java = {"PATH": str(tmp_path)}  # a folder with no java in it
    assert embedded_broker_kind(no_java) == "tansu"
    assert embedded_broker_kind({**no_java, "CHUNKSERVE_EMBEDDED_BROKER": "kafka"}) == "kafka"
    assert embedded_broker_kind({"CHUNKSERVE_EMBEDDED_BROKER": "Tansu"}) == "tansu"
    with pytest.raises(ConfigError, match="env: CHUNKSERVE_EMBEDDED_BROKER: .redpanda.: choose kafka or tansu"):
        embedded_broker_kind({"CHUNKSERVE_EMBEDDED_BROKER": "redpanda"})


@pytest.fixture(scope="module")
def tansu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    broker = start_embedded_broker(tmp_path_factory.mktemp("tansu"), kind="tansu")
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


def test_starting_tansu_says_what_it_loses(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="infra.embedded"):
        broker = start_embedded_broker(tmp_path, kind="tansu")
    broker.stop()
    assert broker.describe()["kind"] == "tansu"
    assert [r.getMessage() for r in caplog.records if TANSU_LOSES in r.getMessage()]
    with pytest.raises(InfraError, match="one broker"):
        start_embedded_broker(tmp_path, brokers=3, kind="tansu")


def test_sessions_flow_end_to_end_on_tansu(tansu, redis_url, namespace, tmp_path):
    settings = for_tansu(Settings(topic_prefix=f"{namespace}.", namespace=namespace)
                         .with_endpoints(tansu, redis_url))
    assert settings.kafka.idempotence == "off" and settings.fetch_wait_ms == 10
    summary = asyncio.run(run_flow(settings, tmp_path / "logs", sessions=2, chunks=4, workers=2,
                                   inputs=2, chunk_interval_s=0.02, timeout_s=90))
    assert summary.problems == []
    assert summary.chunk_indices and summary.unserved(4, [1, 2]) == []
