"""The Kafka ACL table: who may write the command topics, and what the bindings look like.
(Applied and enforced on Apache Kafka in tests/infra/test_kafka_security.py.)"""

from __future__ import annotations

import pytest

from schemas.topics import (DEAD_LETTERS, SCALING_COMMANDS, SESSION_EVENTS, SESSION_INPUTS,
                            WORKER_COMMANDS, WORKER_EVENTS)
from streams.kafka_acls import ROLES, Binding, bindings, kafka_acls_line


def _writers(topic: str) -> set[str]:
    return {name for name, role in ROLES.items() if topic in role.writes}


def test_only_dispatch_and_control_command_workers_and_only_control_scales():
    assert _writers(WORKER_COMMANDS) == {"dispatch", "control"}
    assert _writers(SCALING_COMMANDS) == {"control"}
    assert _writers(SESSION_EVENTS) == _writers(SESSION_INPUTS) == {"producer", "client"}
    assert ROLES["worker"].reads == (WORKER_COMMANDS, SESSION_INPUTS)
    assert set(ROLES["worker"].writes) == {WORKER_EVENTS, DEAD_LETTERS}
    assert ROLES["watcher"].writes == () == ROLES["auditor"].writes


def test_the_auditor_reads_every_topic_replay_and_story_fold():
    from infra.replay import CLUSTER_TOPICS, STORY_TOPICS

    assert set(ROLES["auditor"].reads) == set(CLUSTER_TOPICS) | set(STORY_TOPICS)
    assert ROLES["auditor"].group is ROLES["auditor"].group_prefix is ROLES["auditor"].faust_app is None


def test_bindings_name_physical_topics_groups_and_faust_leader_topics():
    got = set(bindings("p.", {"worker": "User:gpu"}, roles=["worker", "dispatch", "provisioner"]))
    assert Binding("User:gpu", "Topic", "p.worker-commands", "Read") in got
    assert not any(b.principal == "User:worker" for b in got)  # mapped
    assert Binding("User:dispatch", "Group", "p.dispatch", "Read") in got
    assert Binding("User:dispatch", "Topic", "p.dispatch-__assignor-__leader", "Create") in got
    assert Binding("User:provisioner", "Group", "p.provisioner", "Read") in got
    assert not any(b.operation == "Create" and "__leader" not in b.name for b in got)
    client = set(bindings("p.", roles=["client"]))  # its groups, one per run: one prefixed binding
    assert Binding("User:client", "Group", "p.client-", "Read", "prefixed") in client
    assert {b.name for b in client if b.resource == "Topic" and b.operation == "Read"} == {"p.worker-events", "p.dead-letters"}
    assert "--group p.client- --resource-pattern-type prefixed" in kafka_acls_line(
        Binding("User:client", "Group", "p.client-", "Read", "prefixed"))
    with pytest.raises(KeyError):
        bindings("p.", roles=["admin"])
    with pytest.raises(KeyError, match="--principal: unknown role 'wroker'"):  # not silently User:worker
        bindings("p.", {"wroker": "User:gpu"})


def test_a_printed_line_is_a_kafka_acls_command():
    line = kafka_acls_line(Binding("User:worker", "Topic", "p.worker-events", "Write"), "b:9093")
    assert line == ("kafka-acls.sh --bootstrap-server b:9093 --command-config admin.properties --add "
                    "--allow-principal User:worker --operation Write --topic p.worker-events "
                    "--resource-pattern-type literal")
