"""The AsyncAPI 3.0 document of every topic, key and message, generated from the classes."""

from __future__ import annotations

import json
from typing import Any

from ._docs import EVENT_HEADERS, EXAMPLE_VALUES, HEADERS, TOPIC_NOTES, field_doc
from ._fields import object_schema, to_fields
from .codec import DEFAULT_MAX_BYTES, TAG, TYPE_HEADER, VERSION
from .topics import SCALING_COMMANDS, TOPIC_FRAMING_BYTES, TOPICS, WORKER_COMMANDS, WORKER_EVENTS

__all__ = ["asyncapi_document", "asyncapi_json"]


# where a keyed record lands: a worker recovering a session replays its inputs from there
PARTITIONER = ("Kafka's default partitioner, murmur2 of the key modulo the partition count "
               "(the Java client's default; librdkafka: `partitioner=murmur2_random`)")


DELIVERY = ("Delivery is at-least-once: a record may arrive twice (after a retry or a "
            "consumer restart); generations and per-session sequence numbers make duplicates "
            "harmless, and consumers must tolerate them.")
SIGNED = (WORKER_COMMANDS, SCALING_COMMANDS)
ENCODING = ("Encoding: the map's keys and every `type: string` field are msgpack str (UTF-8); "
            "`format: binary` fields are msgpack bin; `integer` fields are msgpack int and "
            "`number` fields float or int; JSON is not accepted. Nested objects are maps too. A map "
            "that gives a key twice is refused, and so is a record with more than one `cs-t` header.")
TOPIC_CREATION = ("Topics are created by chunkserve (`chunkserve topics`, `chunkserve up`, the "
                  "provisioner) with the partition counts of its settings: producers should "
                  "not create them, since a topic auto-created with the broker's default "
                  "partition count puts a session's inputs where a recovery does not read them. "
                  "Beside these channels the faust processors keep one internal topic each, "
                  "`{prefix}<processor>-__assignor-__leader` (dispatch, detector, control, metrics), "
                  "which clients never touch but ACLs and prefix rules must allow them.")


def _describe(record: str, props: dict[str, Any]) -> None:
    """Put each field's description (and unit, as ``x-unit``) on its schema."""
    for name, schema in props.items():
        text, unit = field_doc(record, name)
        if unit:
            text = f"{text} Unit: {unit}."
        schema["description"] = text
        if unit:
            schema["x-unit"] = unit


def _headers(tag: str, topic: str) -> dict[str, Any]:
    props: dict[str, Any] = {TYPE_HEADER: {"type": "string", "const": tag, "description": HEADERS[TYPE_HEADER]}}
    if topic in SIGNED or topic == WORKER_EVENTS:
        said = HEADERS if topic in SIGNED else EVENT_HEADERS
        props["cs-kid"] = {"type": "string", "description": said["cs-kid"]}
        props["cs-mac"] = {"type": "string", "format": "binary", "description": said["cs-mac"]}
    return {"type": "object", "properties": props}


def _summary(cls: Any) -> str:
    """The docstring's first paragraph as one line."""
    paragraph = (cls.__doc__ or "").strip().split("\n\n")[0]
    return " ".join(line.strip() for line in paragraph.splitlines())


def _example(cls: Any) -> dict[str, Any]:
    """A valid record of ``cls`` as its wire map (built, so validated; bytes fields left out)."""
    from .records import Generation

    fields = cls.__dataclass_fields__
    kwargs = {k: v for k, v in EXAMPLE_VALUES.items() if k in fields}
    kwargs.update({k.split(".")[1]: v for k, v in EXAMPLE_VALUES.items() if k.startswith(cls.__name__ + ".")})
    if "generation" in fields:
        kwargs["generation"] = Generation("default-0", 1)
    wire = {TAG: cls.TAG, VERSION: cls.VERSION, **to_fields(cls(**kwargs))}
    return {k: v for k, v in wire.items() if not isinstance(v, bytes)}


#: AsyncAPI's security scheme type for each SASL mechanism chunkserve's clients offer
SASL_SCHEMES = {"plain": "PLAIN", "scramSha256": "SCRAM-SHA-256", "scramSha512": "SCRAM-SHA-512"}


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
            _describe(name, payload["properties"])
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
                "summary": _summary(cls),
                "contentType": "application/msgpack",
                "headers": _headers(cls.TAG, spec.name),
                "payload": payload,
                "examples": [{"name": f"a {name}", "payload": _example(cls)}],
                "bindings": {"kafka": {"key": {"type": "string", "description": spec.key_name}}},
            }
            refs[name] = {"$ref": f"#/components/messages/{name}"}
        channels[spec.name] = {
            "address": "{prefix}" + spec.name,
            "description": f"{spec.summary} Written by {spec.writers}; read by {spec.readers}. "
                           f"Keyed by {spec.key_name} (UTF-8) and partitioned by {PARTITIONER}. "
                           f"{TOPIC_NOTES[spec.name]} {DELIVERY} Records over {spec.max_bytes} bytes are refused "
                           f"by default (setting `record_bytes.{spec.name}`) by chunkserve's writers and "
                           f"readers; the topic's `max.message.bytes` is that bound plus {TOPIC_FRAMING_BYTES} "
                           "(a record batch's framing), so the broker refuses a client that skips the check "
                           "only past it.",
            "bindings": {"kafka": {"topicConfiguration": {"max.message.bytes": spec.max_bytes + TOPIC_FRAMING_BYTES}}},
            "parameters": {"prefix": {"description": "the configurable topic prefix (setting "
                                                     "`topic_prefix`, default `chunkserve.`)",
                                      "default": "chunkserve."}},
            "messages": refs,
        }
    return {
        "asyncapi": "3.0.0",
        "servers": {"cluster": {
            "host": "{bootstrap}",
            "protocol": "kafka",
            "description": "The Kafka cluster chunkserve is configured with (setting `kafka.bootstrap`, env "
                           "CHUNKSERVE_KAFKA_BOOTSTRAP; `chunkserve broker start` prints the embedded one's). "
                           "With TLS or SASL configured (`kafka.security_protocol`), clients need the same. "
                           "Producers may compress batches with any codec Kafka offers (gzip, snappy, lz4, "
                           "zstd) and may write in transactions: chunkserve reads committed records only "
                           "(an aborted transaction's are never acted on; an open one holds back what "
                           "follows it on its partitions until it ends).",
            "variables": {"bootstrap": {"description": "host:port of a broker", "examples": ["127.0.0.1:9092"]}},
        }, "cluster-sasl-ssl": {
            "host": "{bootstrap}",
            "protocol": "kafka-secure",
            "description": "The same cluster with TLS and SASL (`kafka.security_protocol = SASL_SSL`; "
                           "SASL_PLAINTEXT is SASL without TLS). The client verifies the broker's certificate "
                           "against the cluster's CA (`kafka.ssl_cafile`) and signs in with one of the "
                           "mechanisms below (`kafka.sasl_mechanism`, PLAIN when unset) as its role's "
                           "principal. With the broker's authorizer on, each role may touch only its own "
                           "topics and consumer groups: `chunkserve acls --print` lists the bindings. A "
                           "producer needs Write on session-events and session-inputs, and a Read binding "
                           "on any topic it also reads (such as worker-events, to see its inputs accepted).",
            "variables": {"bootstrap": {"description": "host:port of a broker's SASL_SSL listener",
                                        "examples": ["127.0.0.1:9093"]}},
            "security": [{"$ref": f"#/components/securitySchemes/{name}"} for name in SASL_SCHEMES],
        }},
        "info": {
            "title": "chunkserve topics",
            "version": version,
            "description": "Every record is a msgpack map with a type tag `t` and a schema "
                           "version `v`; each channel bounds its record size (and no record may exceed "
                           f"`max_record_bytes`, {DEFAULT_MAX_BYTES} by default). "
                           "Delivery is at-least-once; generations make duplicates harmless. "
                           f"{ENCODING} {TOPIC_CREATION}",
        },
        "defaultContentType": "application/msgpack",
        "channels": channels,
        "operations": _operations(channels),
        "components": {"messages": messages, "schemas": _described_components(schemas),
                       "securitySchemes": {name: {"type": name, "description": f"SASL/{mechanism}: the "
                                                  "user name and password of the role's principal"}
                                           for name, mechanism in SASL_SCHEMES.items()}},
    }


def _operations(channels: dict[str, Any]) -> dict[str, Any]:
    """What chunkserve (the application this document describes) does on each channel: it
    receives what producers write (a client sends there) and sends the rest (a client may
    subscribe; worker-commands and scaling-commands are chunkserve's own, signed)."""
    ops: dict[str, Any] = {}
    for spec in TOPICS.values():
        refs = [{"$ref": f"#/channels/{spec.name}/messages/{name}"} for name in channels[spec.name]["messages"]]
        own = {"channel": {"$ref": f"#/channels/{spec.name}"}, "messages": refs}
        if "producers" in spec.writers:
            ops[f"{spec.name}.receive"] = {"action": "receive", **own,
                                           "summary": f"chunkserve reads it ({spec.readers}): clients send here."}
        else:
            ops[f"{spec.name}.send"] = {"action": "send", **own,
                                        "summary": f"chunkserve writes it ({spec.writers}); read by {spec.readers}."}
    return ops


def _described_components(schemas: dict[str, Any]) -> dict[str, Any]:
    for name, schema in schemas.items():
        _describe(name, schema["properties"])
    return schemas


def asyncapi_json() -> str:
    """The document as the JSON text committed at ``docs/asyncapi.json``."""
    return json.dumps(asyncapi_document(), indent=2, sort_keys=False) + "\n"
