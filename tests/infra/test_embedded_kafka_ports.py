"""The embedded Apache Kafka picks free ports for a new cluster; a port taken by another
process before the node binds it (any outgoing connection may get it) made the node exit, and
a CI run's bench failed so. A new cluster starts again on new ports; one that served keeps its."""

from __future__ import annotations

import json
import socket

import pytest

from infra.apache_kafka import EmbeddedKafka, java_available
from schemas.errors import InfraError

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not java_available(), reason="the embedded Apache Kafka needs Java")]


def test_a_new_cluster_whose_port_was_taken_starts_on_new_ones(tmp_path):
    kafka = EmbeddedKafka(tmp_path / "kafka")
    taken = kafka.nodes[0].port
    squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    squatter.bind(("127.0.0.1", taken))
    squatter.listen()
    try:
        kafka.start()
        try:
            assert kafka.nodes[0].port != taken and kafka.nodes[0].running
            saved = json.loads((tmp_path / "kafka" / "cluster.json").read_text())
            assert saved["nodes"] == [[kafka.nodes[0].port, kafka.nodes[0].controller_port]]
            assert saved["cluster_id"] == kafka.cluster_id
        finally:
            kafka.stop()
        # a cluster that has served keeps its ports: its clients would not find it elsewhere
        again = EmbeddedKafka(tmp_path / "kafka")
        assert again.nodes[0].port == kafka.nodes[0].port
        squatter.close()
        squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        squatter.bind(("127.0.0.1", again.nodes[0].port))
        squatter.listen()
        with pytest.raises(InfraError, match="exited with 1"):
            again.start()
    finally:
        squatter.close()
