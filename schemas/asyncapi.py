"""The AsyncAPI 3.0 document of every topic, key and message, generated from the classes."""

from __future__ import annotations

import json
from typing import Any

from ._fields import object_schema
from .codec import DEFAULT_MAX_BYTES, TAG, VERSION
from .topics import TOPICS

__all__ = ["asyncapi_document", "asyncapi_json"]


# where a keyed record lands: a worker recovering a session replays its inputs from there
PARTITIONER = ("Kafka's default partitioner, murmur2 of the key modulo the partition count "
               "(the Java client's default; librdkafka: `partitioner=murmur2_random`)")


def asyncapi_document(version: str = "0.1.0") -> dict[str, Any]:
    """The document as a plain dict (stable ordering, no timestamps)."""
    channels: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    for spec in TOPICS.values():
        refs = {}
        for cls in spec.records:
            name = cls.__name__
            payload = object_schema(cls, schemas)
            payload["properties"] = {
                TAG: {"type": "string", "const": cls.TAG, "description": "type tag"},
                VERSION: {"type": "integer", "minimum": 1, "maximum": cls.VERSION,
                          "description": "schema version"},
                **payload["properties"],
            }
            payload["required"] = [TAG, VERSION, *payload["required"]]
            messages[name] = {
                "name": cls.TAG,
                "title": name,
                "summary": (cls.__doc__ or "").strip().splitlines()[0],
                "contentType": "application/msgpack",
                "payload": payload,
                "bindings": {"kafka": {"key": {"type": "string", "description": spec.key_name}}},
            }
            refs[name] = {"$ref": f"#/components/messages/{name}"}
        channels[spec.name] = {
            "address": "{prefix}" + spec.name,
            "description": f"{spec.summary} Written by {spec.writers}; read by {spec.readers}. "
                           f"Keyed by {spec.key_name} (UTF-8) and partitioned by {PARTITIONER}. Records over {spec.max_bytes} bytes are refused "
                           f"by default (setting `record_bytes.{spec.name}`).",
            "bindings": {"kafka": {"topicConfiguration": {"max.message.bytes": spec.max_bytes}}},
            "parameters": {"prefix": {"description": "the configurable topic prefix"}},
            "messages": refs,
        }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "chunkserve topics",
            "version": version,
            "description": "Every record is a msgpack map with a type tag `t` and a schema "
                           "version `v`; each channel bounds its record size (and no record may exceed "
                           f"`max_record_bytes`, {DEFAULT_MAX_BYTES} by default). "
                           "Delivery is at-least-once; generations make duplicates harmless.",
        },
        "defaultContentType": "application/msgpack",
        "channels": channels,
        "components": {"messages": messages, "schemas": schemas},
    }


def asyncapi_json() -> str:
    """The document as the JSON text committed at ``docs/asyncapi.json``."""
    return json.dumps(asyncapi_document(), indent=2, sort_keys=False) + "\n"
