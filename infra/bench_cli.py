"""CLI commands ``bench ...``: each runs one benchmark and writes its JSON.

``register(app)`` adds the ``bench`` group to the main app.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Optional

import typer

from infra.cli_common import err_console as _stderr, int_list as _int_list, load_settings as _settings, write_json as _write_json
from infra.outputs import folder_option, json_option, writable
from schemas.errors import ConfigError

__all__ = ["register"]

bench_app = typer.Typer(help="Benchmarks; each writes JSON.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add the ``bench`` commands to ``app``."""
    app.add_typer(bench_app, name="bench")


@bench_app.command("scheduler")
def bench_scheduler(
    gpus: str = typer.Option("64,256,1024", help="Pool sizes to time, comma-separated."),
    instances: int = typer.Option(200, min=1, help="Random small instances compared with the exhaustive oracle."),
    seed: int = typer.Option(0, min=0, help="Seed of the generated pools and instances."),
    json_out: Optional[Path] = json_option("Write the result here."),
) -> None:
    """Time one decision round on loaded pools; measure the gap to exhaustive placement."""
    from infra.bench.scheduler import run

    result = run(_int_list(gpus, "--gpus"), instances=instances, seed=seed)
    _write_json(result, json_out)


@bench_app.command("control-plane")
def bench_control_plane(
    sessions: int = typer.Option(5000, min=1, help="Concurrent sessions to open."),
    workers: int = typer.Option(4, min=1, help="Light workers (claim and acknowledge, no model)."),
    inputs: int = typer.Option(1, min=0, help="Inputs (PushText) per session."),
    rate: float = typer.Option(500.0, min=1.0, help="Opens (and pushes) published per second."),
    dispatch_replicas: int = typer.Option(1, min=1, help="Dispatch replicas."),
    timeout: float = typer.Option(120.0, min=1.0, help="Give up waiting after this many seconds."),
    redis_cluster: bool = typer.Option(False, "--redis-cluster", help="Run the store on an embedded "
                                       "Redis Cluster (3 masters, a replica each)."),
    replica_acks: Optional[int] = typer.Option(None, min=0, max=16, help="Replicas a fenced write waits "
                                               "for on the cluster (default 1)."),
    warmup: float = typer.Option(10.0, min=0.0, help="Seconds of sessions opened (one input each) at the "
                                 "rate and kept open before measuring."),
    json_out: Optional[Path] = json_option("Write the result here."),
    log_dir: Optional[Path] = folder_option("log-dir", "Folder for the processes' logs."),
) -> None:
    """CreateLive and PushText latency through the real broker, dispatch and Redis."""
    from infra.bench.control_plane import run

    result = run(_settings(require_endpoints=False), sessions, workers=workers,
                 inputs_per_session=inputs, log_dir=log_dir, rate=rate,
                 dispatch_replicas=dispatch_replicas, timeout_s=timeout,
                 redis_cluster=redis_cluster, replica_acks=replica_acks, warmup_s=warmup)
    _write_json(result, json_out)


@bench_app.command("broker")
def bench_broker(
    rate: int = typer.Option(600, min=1, help="Records per second produced."),
    seconds: int = typer.Option(30, min=2, help="How long to produce."),
    partitions: int = typer.Option(8, min=1, help="Partitions of the topic."),
    compare: bool = typer.Option(False, "--compare", help="Also run the other embedded broker (Tansu beside Kafka)."),
    json_out: Optional[Path] = json_option("Write the result here."),
) -> None:
    """The embedded broker's CPU and one-hop latency per window under a steady producer, and its idle hop per fetch wait."""
    from infra.bench.broker import run

    try:
        result = run(rate, seconds, partitions, window_s=max(1.0, seconds / 6), compare=compare)
    except ValueError as exc:
        _stderr.print(f"[red]{exc}[/red]")
        raise typer.Exit(2)
    _write_json(result, json_out)


@bench_app.command("fuzz")
def bench_fuzz(
    records: int = typer.Option(1_000_000, min=1, help="Hostile records fed to the decoders."),
    consumer_records: int = typer.Option(2000, min=0, help="More, through a real consumer loop (added to "
                                                          "the JSON's records)."),
    processor_records: int = typer.Option(3000, min=0, help="More, through the running faust processors "
                                                           "(added to the JSON's records)."),
    seed: int = typer.Option(0, min=0, help="Seed of the generated and mutated records."),
    json_out: Optional[Path] = json_option("Write the result here."),
) -> None:
    """Generated and mutated records against every decoder, a real consumer loop and every
    faust processor (dispatch, detector, metrics, control) running as a process."""
    from infra.bench.fuzz import run
    from infra.embedded import infrastructure

    base = _settings(require_endpoints=False)
    run_id = uuid.uuid4().hex[:6]
    logging.getLogger("streams.kafka").setLevel(logging.ERROR)  # one warning per bad record otherwise
    with infrastructure() as infra:
        settings = infra.settings(base).isolated(f"fuzz-{run_id}")
        result = run(records, seed, settings if consumer_records or processor_records else None,
                     consumer_records, processor_records)
    _write_json(result, json_out)
    if result["crashes"] or result["hangs"]:
        raise typer.Exit(1)


@bench_app.command("worker")
def bench_worker(
    json_out: Optional[Path] = json_option("Write the result here."),
    profile_out: Optional[Path] = typer.Option(None, help="Also write the latencies as a latency profile."),
    sessions: int = typer.Option(32, min=1, help="Sessions offloaded and restored."),
    migrations: int = typer.Option(40, min=1, help="Migrations timed."),
    model_spec: Optional[str] = typer.Option(None, "--model", help="A model of your own, module:Name "
                                             "(as `worker --model`); default: the reference model."),
    device: str = typer.Option("cpu", help="torch device: cpu, cuda, cuda:1, ..."),
) -> None:
    """Chunk latency by batch, coalescing speedup, state size, offload/restore, migration time."""
    from infra.bench.worker import run, write_profile
    from infra.embedded import EmbeddedRedis
    from workers.model_plugin import load_model

    writable(**{"profile-out": profile_out})  # before the run, not after it
    settings = _settings(require_endpoints=False)
    try:  # a model that cannot serve: one line, before Redis is started
        load_model(model_spec, device)
    except ConfigError as exc:
        _stderr.print(f"[red]configuration error:[/red] {exc}", soft_wrap=True)
        raise typer.Exit(2)
    embedded = None if settings.redis.url else EmbeddedRedis().start()
    try:
        result = run(settings.redis.url or embedded.url, sessions=sessions, migrations=migrations,  # type: ignore[union-attr]
                     model=model_spec, device=device)
    finally:
        if embedded is not None:
            embedded.stop()
    _write_json(result, json_out)
    if profile_out is not None:
        write_profile(result, profile_out)
