"""The AsyncAPI document says enough to code against: every field described (with its
unit), headers, keys, ordering and delivery per topic, a valid example per message."""

from __future__ import annotations

import msgpack

from schemas.asyncapi import asyncapi_document
from schemas.codec import decoder_for
from schemas.topics import TOPICS

DOC = asyncapi_document()
MESSAGES = DOC["components"]["messages"]


def _channel_of(title: str) -> str:
    return next(name for name, c in DOC["channels"].items()
                if any(ref["$ref"].endswith("/" + title) for ref in c["messages"].values()))


def test_every_field_of_every_record_is_described():
    undescribed = [(title, field) for title, m in MESSAGES.items()
                   for field, schema in m["payload"]["properties"].items() if not schema.get("description")]
    undescribed += [(name, field) for name, s in DOC["components"]["schemas"].items()
                    for field, schema in s["properties"].items() if not schema.get("description")]
    assert undescribed == []
    assert sum(len(m["payload"]["properties"]) for m in MESSAGES.values()) > 160


def test_units_are_stated_where_a_field_has_one():
    props = {(t, f): s for t, m in MESSAGES.items() for f, s in m["payload"]["properties"].items()}
    assert props["SessionOpened", "ts"]["x-unit"] == "s" and "Unix seconds" in props["SessionOpened", "ts"]["description"]
    assert props["CostTick", "cost"]["x-unit"] == "USD" and "cumulative" in props["CostTick", "cost"]["description"]
    assert props["CostTick", "gpu_seconds"]["x-unit"] == "s"
    assert props["Heartbeat", "device_util"]["x-unit"] == "1" and props["Heartbeat", "device_util"]["maximum"] == 1.0
    assert props["Heartbeat", "power_w"]["x-unit"] == "W"
    for (title, field), schema in props.items():
        if "x-unit" in schema:
            assert f"Unit: {schema['x-unit']}." in schema["description"], (title, field)


def test_headers_keys_ordering_and_delivery_per_topic():
    for title, m in MESSAGES.items():
        topic = _channel_of(title)
        headers = m["headers"]["properties"]
        assert headers["cs-t"]["const"] == m["name"]
        assert ("cs-mac" in headers) == (topic in ("worker-commands", "scaling-commands", "worker-events")), title
        if topic == "worker-events":  # bound to the worker it is keyed by
            assert "keyed by" in headers["cs-mac"]["description"], title
    for name, channel in DOC["channels"].items():
        text = channel["description"]
        assert "at-least-once" in text and "order" in text and "murmur2" in text, name
        assert channel["parameters"]["prefix"]["default"] == "chunkserve."
    key = MESSAGES["CostTick"]["bindings"]["kafka"]["key"]["description"]
    writers = " ".join(c["description"].split(";")[0] for c in DOC["channels"].values())
    assert key == "t" and "rebalancer" not in writers and "autoscaler" not in writers  # processes one can run


def test_every_message_has_an_example_its_topic_decodes():
    for title, m in MESSAGES.items():
        (example,) = m["examples"]
        topic = _channel_of(title)
        rec = decoder_for(topic, TOPICS[topic].max_bytes).decode(msgpack.packb(example["payload"]))
        assert type(rec).__name__ == title


def test_every_type_tag_the_prose_names_exists():
    """A reader looks for what the descriptions name: a tag quoted there is a real one."""
    import json
    import re

    tags = {m["name"] for m in MESSAGES.values()}
    prefixes = {tag.split(".")[0] for tag in tags}
    quoted = set(re.findall(r"`([a-z]+\.[a-z_]+)`", json.dumps(DOC)))
    named = {q for q in quoted if q.split(".")[0] in prefixes}
    assert named and named <= tags, sorted(named - tags)
    summaries = [m["summary"] for m in MESSAGES.values()]
    assert all(s.endswith((".", ")")) for s in summaries), [s for s in summaries if not s.endswith((".", ")"))]


def test_operations_say_where_a_client_sends_and_what_it_may_read():
    """Code generators need operations: chunkserve receives on the producers' channels (a
    client sends there) and sends on the rest; every message reference resolves."""
    ops = DOC["operations"]
    assert {k for k, o in ops.items() if o["action"] == "receive"} == {"session-events.receive", "session-inputs.receive"}
    assert {"metrics.send", "dead-letters.send", "worker-events.send"} <= set(ops)
    assert len(ops) == len(DOC["channels"])
    for op in ops.values():
        channel = op["channel"]["$ref"].split("/")[-1]
        for ref in op["messages"]:
            _, _, ch, _, name = ref["$ref"].split("/")
            assert ch == channel and name in DOC["channels"][channel]["messages"]
    assert DOC["servers"]["cluster"]["protocol"] == "kafka" and "{bootstrap}" in DOC["servers"]["cluster"]["host"]
