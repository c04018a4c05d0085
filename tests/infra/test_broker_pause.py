"""A broker paused past its session (SIGSTOP, then SIGCONT) is fenced, and its group
coordinator unloads and reloads: meanwhile it answers OffsetFetch (v2+) with an error for the
whole request (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS) and no partitions, as seen on the
embedded Apache Kafka 4.1.1. Consumers must ask again, not take it for "nothing committed" and
start over from the earliest offset (``streams.kafka.guard_offset_fetch``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import errors
from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.protocol.commit import OffsetFetchResponse_v3
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from streams.kafka import guard_offset_fetch

TP = TopicPartition("t", 0)


class _Client:
    def __init__(self, *replies: Any) -> None:
        self.replies = list(replies)

    async def send(self, node_id: int, request: Any, group: Any = None) -> Any:
        return self.replies.pop(0)


class _Coordinator(GroupCoordinator):
    """aiokafka's coordinator without its start-up: ``_client`` answers with ``replies``."""

    def __init__(self, *replies: Any) -> None:  # noqa: super().__init__ would start tasks
        self.group_id, self.coordinator_id, self._client, self.dead = "g", 1, _Client(*replies), 0

    def coordinator_dead(self) -> None:
        self.dead += 1


@pytest.mark.parametrize("code, error", [(14, errors.GroupLoadInProgressError),
                                         (16, errors.NotCoordinatorForGroupError)])
def test_an_error_for_the_whole_request_is_asked_again_not_taken_for_no_commit(code, error):
    guard_offset_fetch()
    # as Kafka answers while its coordinator reloads: the error, and no partitions at all
    coordinator = _Coordinator(OffsetFetchResponse_v3(0, [], code))
    with pytest.raises(error) as raised:  # unguarded, aiokafka returned {}: "nothing committed"
        asyncio.run(coordinator._do_fetch_commit_offsets([TP]))
    assert raised.value.retriable  # aiokafka's callers ask again after their backoff
    assert coordinator.dead == (code == 16)  # and look for the coordinator again


def test_an_answer_with_offsets_is_read_as_before():
    guard_offset_fetch()
    coordinator = _Coordinator(OffsetFetchResponse_v3(0, [("t", [(0, 42, "", 0)])], 0))
    assert asyncio.run(coordinator._do_fetch_commit_offsets([TP])) == {TP: OffsetAndMetadata(42, "")}
