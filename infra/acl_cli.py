"""``chunkserve acls``: print the Kafka ACLs of every role (``streams.kafka_acls``), or apply
them to the configured cluster as its admin; ``--redis`` prints the Redis ACL user
(``streams.acl``)."""

from __future__ import annotations

import asyncio
import os
from typing import List

import typer
from rich.console import Console

from schemas.errors import ConfigError

__all__ = ["register"]

console = Console(emoji=False, soft_wrap=True)  # piped output keeps paths whole; ":x:" stays text


def _principals(pairs: List[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        role, sep, principal = pair.partition("=")
        if not sep or not principal:
            raise typer.BadParameter(f"{pair!r}: write ROLE=PRINCIPAL, e.g. worker=User:gpu-fleet")
        out[role] = principal if ":" in principal else f"User:{principal}"
    return out


def acls_cmd(
    print_: bool = typer.Option(False, "--print", help="Print one kafka-acls.sh command per binding."),
    apply: bool = typer.Option(False, "--apply", help="Create the bindings on the configured cluster "
                               "(run with the admin's SASL credentials)."),
    principal: List[str] = typer.Option([], "--principal", help="ROLE=PRINCIPAL: the principal a "
                                        "role runs as (default User:<role>); repeatable."),
    role: List[str] = typer.Option([], "--role", help="Only this role (repeatable; default all)."),
    redis: bool = typer.Option(False, "--redis", help="Print the Redis ACL user instead: the ACL SETUSER "
                               "command for the configured namespace (and Redis Cluster, redis.cluster)."),
) -> None:
    """The Kafka ACLs each role needs (producer, dispatch, control, detector, metrics, worker,
    provisioner, watcher, auditor, client), for the configured topic prefix: printed, or applied; or the
    Redis ACL user's command (run it on every node, with the password in place of PASSWORD)."""
    from streams.config_file import load_with_sources
    from streams.kafka_acls import apply_acls, bindings, kafka_acls_line
    from streams.preflight import check
    from infra.cli_common import CONFIG as _CONFIG

    if redis:
        if print_ or apply or principal or role:
            raise typer.BadParameter("--redis prints the Redis ACL user alone")
        from streams.acl import acl_rules

        settings, _ = load_with_sources(_CONFIG["path"], os.environ)
        user = settings.redis.username or "chunkserve"
        typer.echo(" ".join(["ACL SETUSER", user, "on", ">PASSWORD",
                             *acl_rules(settings.namespace, cluster=settings.redis.cluster == "on")]))
        return
    if print_ == apply:
        raise typer.BadParameter("choose one of --print and --apply")
    try:
        settings, sources = load_with_sources(_CONFIG["path"], os.environ)
        wanted = bindings(settings.topic_prefix, _principals(principal), role or None)
    except KeyError as exc:
        raise typer.BadParameter(str(exc.args[0]))
    if print_:
        for b in wanted:
            typer.echo(kafka_acls_line(b, settings.kafka.bootstrap or "$BOOTSTRAP"))
        return
    if not settings.kafka.bootstrap:
        raise ConfigError("kafka.bootstrap", "no broker configured: set CHUNKSERVE_KAFKA_BOOTSTRAP")
    asyncio.run(check(settings, sources, redis=False))
    n = asyncio.run(apply_acls(settings, wanted))
    principals = sorted({b.principal for b in wanted})
    console.print(f"applied {n} ACL bindings for {', '.join(principals)} on {settings.kafka.bootstrap}",
                  soft_wrap=True)


def command_key_cmd(
    key_id: str = typer.Argument(..., help="The new key's id (letters, digits, - and _)."),
    hmac_key: bool = typer.Option(False, "--hmac", help="A 32-byte HMAC key instead (every process that "
                                  "verifies it could sign with it)."),
) -> None:
    """Make a command-signing key: an Ed25519 pair by default. Prints two CHUNKSERVE_COMMAND_KEYS
    entries: the private one for the processes that write commands (dispatch, control, and an
    operator's handoff), the public one for those that only read them (workers, the
    provisioner); `up` and the provisioner hand their readers the public one themselves."""
    import re

    from streams.signing import new_key

    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", key_id):
        raise typer.BadParameter(f"{key_id!r}: letters, digits, - and _ (at most 64)", param_hint="KEY_ID")
    private, public = new_key(key_id, "hmac" if hmac_key else "ed25519")
    typer.echo(f"signs and verifies (keep it secret): {private}")
    if not hmac_key:
        typer.echo(f"verifies only:                      {public}")


def event_key_cmd(
    key_id: str = typer.Argument("", help="A new master key's id (letters, digits, - and _)."),
    worker: str = typer.Option("", "--worker", help="Print this worker's own key instead, derived from the "
                               "masters in CHUNKSERVE_EVENT_KEYS (for a worker started by hand)."),
) -> None:
    """Make a master key that signs `worker-events` (an entry of CHUNKSERVE_EVENT_KEYS, for
    dispatch, control, metrics and the provisioner), or, with --worker ID, print that worker's
    own key (CHUNKSERVE_WORKER_EVENT_KEY), which signs only the events keyed by its id; `up`
    and the provisioner hand each of their workers its own."""
    import re
    import secrets

    from streams.signing import EVENT_KEYS_ENV, EventKeys

    if worker:
        own = EventKeys.from_env().for_worker(worker)
        if own is None:
            raise ConfigError(EVENT_KEYS_ENV, "not set: a worker's key is derived from the masters", "environment")
        typer.echo(own)
        return
    if not key_id:
        raise typer.BadParameter("missing: give a new master key's id, or --worker ID", param_hint="KEY_ID")
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", key_id):
        raise typer.BadParameter(f"{key_id!r}: letters, digits, - and _ (at most 64)", param_hint="KEY_ID")
    typer.echo(f"{key_id}:{secrets.token_hex(32)}")


def register(app: typer.Typer) -> None:
    """Add ``acls``, ``command-key`` and ``event-key`` to ``app``."""
    app.command("acls")(acls_cmd)
    app.command("command-key")(command_key_cmd)
    app.command("event-key")(event_key_cmd)
