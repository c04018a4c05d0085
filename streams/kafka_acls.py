"""The Kafka ACLs of a chunkserve deployment, as data: what each role reads, writes and joins.

``ROLES`` is the one table; every binding chunkserve prints or applies comes from it, and
nothing else grants a principal anything. Each role runs as its own principal
(``User:<role>`` unless mapped otherwise) and gets only its topics: READ on what it reads,
WRITE on what it writes (an idempotent producer needs nothing more), READ on its consumer
group, and for a faust processor its group (the app id) and its leader-election topic, which
faust creates. Topics themselves are created by the admin (``chunkserve topics``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from schemas.errors import AccessDeniedError, InfraError
from schemas.topics import (DEAD_LETTERS, METRICS, SCALING_COMMANDS, SESSION_EVENTS,
                            SESSION_INPUTS, WORKER_COMMANDS, WORKER_EVENTS)

from .config import Settings

__all__ = ["Role", "ROLES", "Binding", "bindings", "kafka_acls_line", "apply_acls", "current_acls"]


@dataclass(frozen=True)
class Role:
    """What one kind of process does on the broker (logical topic names)."""

    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    group: str | None = None  # a consumer group of its own: ``{prefix}{group}``
    group_prefix: str | None = None  # consumer groups of its own, one per run: ``{prefix}{group_prefix}*``
    faust_app: str | None = None  # a faust app: group ``{prefix}{app}``, leader topic ``...-__assignor-__leader``


ROLES: dict[str, Role] = {
    # SessionClient: opens, flips and closes sessions, pushes inputs
    "producer": Role(writes=(SESSION_EVENTS, SESSION_INPUTS)),
    # admits sessions (where the control leader's admission plans say), routes inputs (and
    # reads a session's inputs back on close), recovers
    "dispatch": Role(reads=(SESSION_EVENTS, SESSION_INPUTS, WORKER_EVENTS, SCALING_COMMANDS),
                     writes=(WORKER_COMMANDS, METRICS, DEAD_LETTERS), faust_app="dispatch"),
    # folds the log without a group; Handoff, scaling, placement reports, WorkerDown
    "control": Role(reads=(SESSION_EVENTS, WORKER_EVENTS, SCALING_COMMANDS),
                    writes=(WORKER_COMMANDS, WORKER_EVENTS, SCALING_COMMANDS, METRICS),
                    faust_app="control"),
    "detector": Role(reads=(SESSION_EVENTS,), writes=(METRICS, DEAD_LETTERS), faust_app="detector"),
    "metrics": Role(reads=(WORKER_EVENTS, SESSION_EVENTS, METRICS), writes=(METRICS, DEAD_LETTERS),
                    faust_app="metrics"),
    # reads its own worker-commands partition without a group, and session-inputs on recovery
    "worker": Role(reads=(WORKER_COMMANDS, SESSION_INPUTS), writes=(WORKER_EVENTS, DEAD_LETTERS)),
    "provisioner": Role(reads=(SCALING_COMMANDS,), writes=(WORKER_EVENTS, DEAD_LETTERS),
                        group="provisioner"),
    # chunkserve watch: read-only, without a group
    "watcher": Role(reads=(METRICS, WORKER_EVENTS)),
    # chunkserve replay and story: read-only, without a group, the log an operator folds
    "auditor": Role(reads=(SESSION_EVENTS, WORKER_EVENTS, WORKER_COMMANDS, SCALING_COMMANDS, DEAD_LETTERS)),
    # a producer that reads its inputs' verdicts (examples/node-producer): the producer's
    # writes, worker-events and dead-letters, and consumer groups named <prefix>client-*
    "client": Role(reads=(WORKER_EVENTS, DEAD_LETTERS), writes=(SESSION_EVENTS, SESSION_INPUTS),
                   group_prefix="client-"),
}

_RESOURCE = {"Topic": 2, "Group": 3}
_OPERATION = {"Read": 3, "Write": 4, "Create": 5, "Describe": 8}
_PATTERN_LITERAL, _ALLOW, _ANY = 3, 3, 1
_PATTERN = {"literal": _PATTERN_LITERAL, "prefixed": 4}
_CLUSTER_AUTHORIZATION_FAILED = 31  # the Kafka protocol's error code


@dataclass(frozen=True, order=True)
class Binding:
    """One ALLOW rule: ``principal`` may ``operation`` the ``resource`` named ``name`` (or, with
    ``pattern`` prefixed, every one whose name starts with it)."""

    principal: str
    resource: str  # Topic | Group
    name: str
    operation: str  # Read | Write | Create
    pattern: str = "literal"  # literal | prefixed


def _role_bindings(principal: str, role: Role, prefix: str) -> Iterable[Binding]:
    for topic in role.reads:
        yield Binding(principal, "Topic", prefix + topic, "Read")
    for topic in role.writes:
        yield Binding(principal, "Topic", prefix + topic, "Write")
    if role.group is not None:
        yield Binding(principal, "Group", prefix + role.group, "Read")
    if role.group_prefix is not None:
        yield Binding(principal, "Group", prefix + role.group_prefix, "Read", "prefixed")
    if role.faust_app is not None:
        app = prefix + role.faust_app
        yield Binding(principal, "Group", app, "Read")
        leader = f"{app}-__assignor-__leader"
        for op in ("Create", "Read", "Write"):
            yield Binding(principal, "Topic", leader, op)


def bindings(prefix: str, principals: Mapping[str, str] | None = None,
             roles: Iterable[str] | None = None) -> list[Binding]:
    """Every binding of ``roles`` (default all) for topics under ``prefix``; a role's
    principal is ``principals[role]`` or ``User:<role>``."""
    principals = principals or {}
    for name in principals:  # a typo (`wroker=...`) would leave that role on User:<role>
        if name not in ROLES:
            raise KeyError(f"--principal: unknown role {name!r}: one of {', '.join(ROLES)}")
    out: list[Binding] = []
    for name in roles or ROLES:
        if name not in ROLES:
            raise KeyError(f"unknown role {name!r}: one of {', '.join(ROLES)}")
        principal = principals.get(name, f"User:{name}")
        out.extend(_role_bindings(principal, ROLES[name], prefix))
    return out


def kafka_acls_line(b: Binding, bootstrap: str = "$BOOTSTRAP") -> str:
    """The ``kafka-acls.sh`` command that creates ``b``."""
    return (f"kafka-acls.sh --bootstrap-server {bootstrap} --command-config admin.properties --add "
            f"--allow-principal {b.principal} --operation {b.operation} "
            f"--{b.resource.lower()} {b.name} --resource-pattern-type {b.pattern}")


def _admin(settings: Settings) -> Any:
    from aiokafka.admin import AIOKafkaAdminClient

    return AIOKafkaAdminClient(**settings.kafka.client_kwargs(), request_timeout_ms=10_000)


async def apply_acls(settings: Settings, wanted: list[Binding]) -> int:
    """Create ``wanted`` on the configured cluster (as its admin); existing ones stay as they
    are. Returns how many were sent. aiokafka 0.14 has the CreateAcls request but no admin
    method for it: it is sent as the admin client sends its own."""
    from aiokafka.errors import for_code
    from aiokafka.protocol.admin import CreateAclsRequest

    admin = _admin(settings)
    await admin.start()
    try:
        node = admin._client.get_random_node()
        answers = await asyncio.gather(*(admin._send_request(CreateAclsRequest(
            _RESOURCE[b.resource], b.name, _PATTERN[b.pattern], b.principal, "*",
            _OPERATION[b.operation], _ALLOW), node) for b in wanted))
    finally:
        await admin.close()
    codes = {code for resp in answers for code, _ in resp.creation_responses}
    if _CLUSTER_AUTHORIZATION_FAILED in codes:  # every binding refused alike: say it once
        who = f"User:{settings.kafka.sasl_username or 'ANONYMOUS'}"
        raise AccessDeniedError(who, "Alter", "the cluster (creating ACLs)",
                                "ClusterAuthorizationFailedError: run acls --apply with the admin's credentials")
    for b, resp in zip(wanted, answers):
        for code, message in resp.creation_responses:
            if code:
                raise InfraError(f"the broker refused the ACL {b.principal} {b.operation} "
                                 f"{b.resource}:{b.name}: {for_code(code).__name__} {message or ''}".rstrip())
    return len(wanted)


async def current_acls(settings: Settings) -> set[Binding]:
    """Every ALLOW binding (literal or prefixed) on the cluster's topics and groups."""
    from aiokafka.errors import for_code
    from aiokafka.protocol.admin import DescribeAclsRequest

    names = {v: k for k, v in _RESOURCE.items()}
    ops = {v: k for k, v in _OPERATION.items()}
    admin = _admin(settings)
    await admin.start()
    try:
        found: set[Binding] = set()
        for resource in _RESOURCE.values():
            resp = await admin._send_request(DescribeAclsRequest(
                resource, None, _ANY, None, None, _ANY, _ALLOW))  # type: ignore[arg-type]
            if resp.error_code:
                raise InfraError(f"DescribeAcls: {for_code(resp.error_code).__name__} {resp.error_message or ''}")
            for rtype, name, pattern, acls in resp.resources:
                kind = next((k for k, v in _PATTERN.items() if v == pattern), str(pattern))
                for principal, _host, op, _perm in acls:
                    found.add(Binding(principal, names[rtype], name, ops.get(op, str(op)), kind))
        return found
    finally:
        await admin.close()
