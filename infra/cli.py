"""The ``chunkserve`` command line."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Mapping, Optional

import typer
from rich.table import Table

from infra.cli_common import (CONFIG as _CONFIG, console, err_console as _stderr, load_settings as _settings,
                               write_json as _write_json)
from infra.outputs import folder_option, folder_problem, json_option, writable, write_output
from schemas.errors import ChunkserveError, ConfigError
from schemas.records import ID_MAX_LEN, Record, WorkerProvisioned
from streams.config import PROVISIONER_ENV, Settings

app = typer.Typer(help="chunkserve: serve long-lived, stateful, GPU-backed streaming sessions.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
schemas_app = typer.Typer(help="Wire contracts.", no_args_is_help=True)
app.add_typer(schemas_app, name="schemas")


def _register_extensions() -> None:
    from infra.broker_cli import register as register_broker
    from infra.sim_cli import register as register_sim

    __import__("infra.bench_cli", fromlist=["register"]).register(app)
    register_sim(app)
    register_broker(app)
    __import__("infra.place_cli", fromlist=["register"]).register(app)
    __import__("infra.acl_cli", fromlist=["register"]).register(app)


_register_extensions()




@app.callback()
def _global_options(
    config: Optional[Path] = typer.Option(None, "--config", envvar="CHUNKSERVE_CONFIG",
                                          help="TOML configuration file; CHUNKSERVE_* variables override it."),
) -> None:
    """chunkserve: serve long-lived, stateful, GPU-backed streaming sessions."""
    _CONFIG["path"] = config
    if config is not None:  # child processes read the same file
        os.environ["CHUNKSERVE_CONFIG"] = str(config)
    from workers.supervision import watch_parent

    watch_parent()  # a child of `up` or of the provisioner stops when its parent is gone


def _metrics_server(port: Optional[int], host: str) -> None:
    from streams.prom import start_metrics_server

    if port:
        try:
            start_metrics_server(port, addr=host)
        except OSError as exc:
            _stderr.print(f"[red]--metrics-host {host} --metrics-port {port}:[/red] cannot listen ({exc.strerror})")
            raise typer.Exit(2)
        log.info("Prometheus metrics on %s:%d/metrics", host, port)


MetricsPort = typer.Option(None, "--metrics-port", min=1, max=65535, help="Serve Prometheus metrics on this port.")
MetricsHost = typer.Option("127.0.0.1", "--metrics-host",
                           help="Address the metrics endpoint listens on (0.0.0.0: every interface).")
def _log_format_given(ctx: typer.Context, param: typer.CallbackParam, value: str) -> str:
    """Checked as the command line is read: before anything connects or starts. From the
    environment, it reads as every other setting does (a usage error named the variable as
    an option's fallback)."""
    from infra.logs import FORMATS

    if value not in FORMATS:
        source = ctx.get_parameter_source(param.name or "")  # (typer's own copy of click's enum)
        if getattr(source, "name", None) == "ENVIRONMENT":
            _stderr.print(f"[red]configuration error:[/red] env CHUNKSERVE_LOG_FORMAT: log_format: {value!r}: choose "
                          f"from {', '.join(FORMATS)}", soft_wrap=True, highlight=False)
            raise typer.Exit(2)
        raise typer.BadParameter(f"{value!r}: choose from {', '.join(FORMATS)}")
    return value


LogFormat = typer.Option("text", "--log-format", envvar="CHUNKSERVE_LOG_FORMAT", callback=_log_format_given,
                         help="Log lines as text or json (one object a line); children inherit it.")
log = logging.getLogger("chunkserve")


def _logging(log_format: str, level: str = "INFO") -> dict:
    """Configure this process's logging (``infra.logs``); children started later log alike."""
    import logging.config

    from infra.logs import logging_config

    config = logging_config(log_format, level)  # the format was checked as the command line was read (LogFormat)
    logging.config.dictConfig(config)
    os.environ["CHUNKSERVE_LOG_FORMAT"] = log_format
    return config


def _warn_unsigned(settings: Settings, worker: bool = False) -> None:
    if not settings.command_keys.enabled:
        log.warning("command signing is off: set CHUNKSERVE_COMMAND_KEYS to sign and verify worker "
                    "and scaling commands")
    if worker and settings.event_keys.masters:
        log.warning("this worker holds CHUNKSERVE_EVENT_KEYS, which sign events for every worker: hand it "
                    "only its own (`chunkserve event-key --worker ID`) as CHUNKSERVE_WORKER_EVENT_KEY")


@schemas_app.command("asyncapi")
def schemas_asyncapi(output: Optional[Path] = typer.Option(None, "-o", "--output",
                                                            help="Write here instead of stdout.")) -> None:
    """Print the AsyncAPI document of every topic, key and message."""
    from schemas.asyncapi import asyncapi_json

    writable(output=output)
    text = asyncapi_json()
    if output is None:
        sys.stdout.write(text)
    else:
        write_output("output", output, text)
        console.print(f"wrote {output}")


@app.command("topics")
def topics() -> None:
    """Create every chunkserve topic that is missing on the configured broker, and list them
    with the partitions the broker gives each (a topic made before keeps its own count)."""
    from streams.topics import ensure_topics, partition_counts

    settings = _settings()
    catalogue = asyncio.run(ensure_topics(settings))
    configured = catalogue.all()
    actual = asyncio.run(partition_counts(settings, list(configured)))
    for name, n in configured.items():
        has = actual.get(name)
        console.print(f"{name}  partitions={has if has is not None else '?'}"
                      + (f"  (configured {n}: partitions are set when a topic is made)" if has is not None and has != n else ""),
                      highlight=False)
    missing = [name for name in configured if name not in actual]
    if missing:  # it said nothing and exited 0 (a principal that may neither see nor make them)
        who = settings.kafka.sasl_username
        _stderr.print(f"[red]error: {len(missing)} of {len(configured)} topics are not on the broker, or not visible "
                      f"to {'principal User:' + who if who else 'this client'}, and could not be made[/red] "
                      "(creating them takes Create on the cluster, seeing them Describe: run `chunkserve topics` "
                      "as the admin, see `chunkserve acls`)", soft_wrap=True)
        raise typer.Exit(2)


@app.command("worker")
def worker(
    worker_id: str = typer.Option(..., help="This worker's id (unique in the fleet)."),
    capacity: int = typer.Option(8, min=1, help="Most sessions this worker executes at once (K)."),
    chunk_interval: float = typer.Option(0.1, min=0.0, help="Seconds between a session's chunks."),
    device: str = typer.Option("cpu", help="torch device: cpu, cuda, cuda:1, ..."),
    checkpoint: Optional[Path] = typer.Option(None, help="safetensors checkpoint of the reference model."),
    model_spec: Optional[str] = typer.Option(
        None, "--model", help="A model of your own, module:Name (a workers.model.StreamingModel, or a class or "
        "factory making one, given device=); default: CHUNKSERVE_WORKER_MODEL, else the reference model."),
    pool: str = typer.Option("default", help="Pool this worker belongs to."),
    gpu_type: str = typer.Option("cpu", help="Device type name, as in the latency profile."),
    metrics_port: Optional[int] = MetricsPort,
    metrics_host: str = MetricsHost,
    log_format: str = LogFormat,
) -> None:
    """Run one worker: claim sessions, run coalesced chunks, release only when current."""
    from workers.model_plugin import MODEL_ENV, load_model
    from workers.runtime import WorkerConfig, serve

    from_env = model_spec is None and bool(os.environ.get(MODEL_ENV))
    spec = os.environ[MODEL_ENV] if from_env else model_spec
    try:
        _check_worker_options(worker_id, device)  # before the endpoints are asked: no broker needed to say it
        try:
            _settings(require_endpoints=False).check_capacity(capacity)
        except ConfigError as exc:  # the flag's, named as the flag
            raise ConfigError("--capacity", str(exc).split(": ", 2)[-1], "command line") from None
        try:  # a missing or foreign checkpoint, a model that cannot serve: said before the broker is asked
            model = load_model(spec, device, checkpoint, *((f"env {MODEL_ENV}", "model") if from_env else ()))
        except ConfigError as exc:
            raise exc if spec is not None else ConfigError("--checkpoint", str(exc).split(": ", 2)[-1], "command line") from None
        settings = _settings()
    except ConfigError as exc:
        _stderr.print(f"[red]configuration error:[/red] {exc}", soft_wrap=True)
        raise typer.Exit(2)
    _logging(log_format)
    _warn_unsigned(settings, worker=True)
    log.info("worker %s serves the model %s", worker_id, spec or "workers.model:ReferenceModel (the reference model)")
    _metrics_server(metrics_port, metrics_host)
    provisioner = os.environ.get(PROVISIONER_ENV)
    if provisioner:  # started by a provisioner, which can stop it: said before its WorkerUp
        asyncio.run(_publish(settings, WorkerProvisioned(worker_id=worker_id, ts=time.time(),
                                                         provisioner=provisioner, pool=pool)))
    cfg = WorkerConfig(worker_id=worker_id, capacity=capacity, chunk_interval_s=chunk_interval,
                       device=device, pool=pool, gpu_type=gpu_type)

    serve(settings, cfg, model)


def _check_children_env(settings: Settings) -> None:
    """The settings `up`'s children read from the environment alone (the control processor's
    policy, profile, GPU type and pacing, the detector's window, the cost tick, the workers'
    capacity and model): a bad one is refused here, in one line, before any child starts."""
    from processors.agents.control import ControlShell
    from processors.agents.control_config import ControlConfig
    from processors.agents.detector import detector_settings
    from processors.agents.metrics import metrics_settings
    from streams.config_file import env_number

    ControlShell(ControlConfig.from_env())
    detector_settings(os.environ)
    metrics_settings(os.environ)
    _check_log_dir(os.environ)
    if spec := os.environ.get("CHUNKSERVE_WORKER_MODEL"):  # each worker would exit on it, again and again
        from streams.plugin import resolve

        try:
            resolve(spec, "CHUNKSERVE_WORKER_MODEL")
        except ConfigError as exc:
            raise ConfigError("model", f"{spec}: {exc.reason}", "env CHUNKSERVE_WORKER_MODEL") from None
    capacity = env_number(os.environ, "CHUNKSERVE_WORKER_CAPACITY", 8, positive=True)
    try:  # each worker refuses one over max_sessions_per_worker: `up` would run with none
        settings.check_capacity(int(capacity))
    except ConfigError as exc:
        raise ConfigError(exc.key, str(exc).split(": ", 2)[-1], "env CHUNKSERVE_WORKER_CAPACITY") from None


def _role_env(settings: Settings) -> dict[str, dict[str, str]]:
    """Each processor's and the provisioner's own Kafka principal, from
    ``CHUNKSERVE_<ROLE>_KAFKA_SASL_USERNAME`` / ``_PASSWORD`` (both or neither: then it signs
    in as ``up`` does); the workers' are the provisioner's to hand out."""
    from streams.config_file import SASL_ROLES, env_var, role_credentials, role_sasl_env

    out: dict[str, dict[str, str]] = {}
    for role in SASL_ROLES:
        credentials = role_credentials(os.environ, role)
        if credentials is not None and "SASL" not in settings.kafka.security_protocol:
            raise ConfigError(role_sasl_env(role)[0], f"a principal of its own needs SASL, and "
                              f"kafka.security_protocol is {settings.kafka.security_protocol}", "environment")
        if credentials is not None and role != "worker":
            out[role] = dict(zip((env_var("kafka.sasl_username"), env_var("kafka.sasl_password")), credentials))
    return out


def _check_role_principals(settings: Settings) -> None:
    """Each role's own principal (``CHUNKSERVE_<ROLE>_KAFKA_SASL_*``) signs in to the broker, or
    ``up`` stops here in one line naming its variables: a wrong one had its child exit six
    times (`Unable to bootstrap`) before the fleet stopped, the reason in the child's log only."""
    import dataclasses

    from streams.config_file import SASL_ROLES, role_credentials, role_sasl_env
    from streams.preflight import check

    for role in SASL_ROLES:
        credentials = role_credentials(os.environ, role)
        if credentials is None:
            continue
        kafka = dataclasses.replace(settings.kafka, sasl_username=credentials[0], sasl_password=credentials[1])
        try:
            asyncio.run(check(dataclasses.replace(settings, kafka=kafka), {}, redis=False))
        except ConfigError as exc:
            user_var, password_var = role_sasl_env(role)
            said = str(exc).split(": ", 2)[-1]
            if "refused the SASL" in said:
                said = (f"the broker refused the SASL {kafka.sasl_mechanism or 'PLAIN'} credentials of "
                        f"{credentials[0]!r} (password from {password_var})")
            raise ConfigError(user_var, f"the {role} role's own principal: {said}", "environment") from None


def _logs_at(log_dir: Optional[Path], prefix: str) -> Path:
    """``--log-dir``, made now that nothing was refused (the command line only checked that it
    could be), or a new temporary folder."""
    if log_dir is None:
        made = Path(tempfile.mkdtemp(prefix=prefix))
        atexit.register(_drop_if_empty, made)  # a run refused before anything logged left it behind
        return made
    problem = folder_problem(log_dir)
    if problem:
        raise ConfigError("--log-dir", problem, str(log_dir))
    return log_dir


def _drop_if_empty(folder: Path) -> None:
    with contextlib.suppress(OSError):
        folder.rmdir()  # only an empty one goes


def _check_log_dir(env: Mapping[str, str]) -> None:
    """``CHUNKSERVE_LOG_DIR`` (where the provisioner logs its workers) a folder there or one
    that can be made (it is made now), or ConfigError naming the variable."""
    raw = env.get("CHUNKSERVE_LOG_DIR")
    problem = folder_problem(Path(raw)) if raw else None
    if problem:
        raise ConfigError("CHUNKSERVE_LOG_DIR", problem, "environment")


def _check_worker_options(worker_id: str, device: str) -> None:
    """A worker id it can publish under and a torch device this machine has, or ConfigError."""
    import torch

    if not worker_id.strip():
        raise ConfigError("--worker-id", "must be a non-empty id", "command line")
    if len(worker_id) > ID_MAX_LEN:  # every record naming the worker would be refused
        raise ConfigError("--worker-id", f"{len(worker_id)} characters: at most {ID_MAX_LEN}", "command line")
    try:
        kind = torch.device(device).type
    except RuntimeError:
        raise ConfigError("--device", f"not a torch device: {device!r} (cpu, cuda, cuda:1, ...)", "command line") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device", f"{device!r}: no CUDA device here", "command line")


PROCESSORS = ("dispatch", "detector", "control", "metrics")


async def _publish(settings: Settings, rec: Record) -> None:
    from streams.kafka import RecordProducer

    async with RecordProducer(settings, client_id="chunkserve-cli") as producer:
        await producer.send(rec)


@app.command("provisioner")
def provisioner(metrics_port: Optional[int] = MetricsPort, metrics_host: str = MetricsHost,
                worker_metrics_port: Optional[int] = typer.Option(
                    None, "--worker-metrics-port", min=1, max=65535,
                    help="Each worker started serves Prometheus metrics on the next free port from this one."),
                targets: Optional[Path] = typer.Option(
                    None, "--targets", help="Keep the running workers' metrics endpoints in this Prometheus "
                    "file_sd file."),
                log_format: str = LogFormat) -> None:
    """Run the local process provisioner: starts, drains and stops workers on scaling commands."""
    from workers.provisioner import run_provisioner

    writable(targets=targets)  # kept up to date while it runs: checked before it starts
    _check_log_dir(os.environ)
    settings = _settings()
    _logging(log_format)
    _warn_unsigned(settings)
    _metrics_server(metrics_port, metrics_host)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_provisioner(settings, stop, targets=targets,
                              metrics=(metrics_host, worker_metrics_port) if worker_metrics_port else None)

    asyncio.run(main())


def _processor_name(value: str) -> str:
    """A processor's name, checked as the command line is read (before any setting is)."""
    if value not in PROCESSORS:
        raise typer.BadParameter(f"unknown processor {value!r}; choose from {', '.join(sorted(PROCESSORS))}")
    return value


@app.command("processor")
def processor(name: str = typer.Argument(..., help="Which processor: dispatch, detector, control, metrics.",
                                         callback=_processor_name),
              metrics_port: Optional[int] = MetricsPort, metrics_host: str = MetricsHost,
              log_format: str = LogFormat) -> None:
    """Run one control-plane processor (a faust worker) against the configured cluster."""
    settings = _settings()
    config = _logging(log_format, "WARNING")
    _warn_unsigned(settings)
    _metrics_server(metrics_port, metrics_host)
    builders = {name: f"processors.agents.{name}" for name in PROCESSORS}
    from streams.faust_app import ProcessorWorker, shorten_gil_switch

    shorten_gil_switch()
    module = __import__(builders[name], fromlist=["build_app"])
    faust_app = module.build_app(settings)
    terminal = sys.stdout.isatty()  # else no banner, no spinner: a log file holds log lines only
    runner = ProcessorWorker(faust_app, loglevel="warning", quiet=not terminal, logging_config=config,
                             settings=settings, lease=getattr(module, "LEASE", None))
    if not terminal:
        runner.spinner = None
    try:
        runner.execute_from_commandline()
    except SystemExit:
        if runner.refused is None:
            raise
    if runner.refused is not None:  # the broker refused its start-up (one line, exit code 1), or another
        raise runner.refused  # live process holds its lease (exit code 2)


@app.command("demo")
def demo(
    duration: float = typer.Option(90.0, min=20.0, help="Wall-clock seconds of the run (with --trace: the "
                                                       "trace's length over --speed instead)."),
    sessions: int = typer.Option(60, min=1, help="Expected sessions in the generated trace."),
    level: int = typer.Option(5, min=1, max=10, help="Volatility level of the generated trace."),
    speed: float = typer.Option(10.0, min=1.0, help="Trace seconds replayed per wall second."),
    max_workers: int = typer.Option(4, min=1, help="Most workers the autoscaler may run."),
    seed: int = typer.Option(0, min=0, help="Seed of the generated trace."),
    report_dir: Optional[Path] = folder_option("report-dir", "Folder for summary.json and timeline.png."),
    log_dir: Optional[Path] = folder_option("log-dir", "Folder for the processes' logs."),
    trace: Optional[Path] = typer.Option(None, help="Replay this trace file instead of a generated one."),
    fall: bool = typer.Option(True, "--fall/--no-fall",
                              help="The generated trace's load falls after 55% of it, to 4 sessions (the scale-in)."),
    policy: str = typer.Option("turboserve", envvar="CHUNKSERVE_POLICY",
                               help="The control processor's policy: a built-in or module:Name."),
) -> None:
    """An autoscaled fleet on the embedded broker and Redis serving a generated trace whose
    load rises and falls (or --trace), then a summary, an ownership audit and a report folder
    with the timeline plot. The workers run the reference model, so the latency profile is its own (reference-cpu)."""
    from rich.live import Live

    from infra.demo import DemoConfig, run_demo
    from infra.embedded import infrastructure

    base = _settings(require_endpoints=False)
    report = report_dir or Path("reports") / time.strftime("demo-%Y%m%d-%H%M%S")
    if trace is not None:
        from infra.sim.trace import load_trace

        try:
            load_trace(trace)  # a bad file is named with its line before anything starts
        except ChunkserveError as exc:
            _stderr.print(f"[red]error:[/red] {exc}", soft_wrap=True)  # as simulate says it
            raise typer.Exit(2)
    from processors.agents.control_config import make_policy
    from processors.latency import load_profiles

    # an unknown one, or one that keeps idle sessions resident, is named before anything
    # starts (ConfigError: exit 2)
    make_policy(policy, load_profiles("reference-cpu"), "cpu", source="--policy or env CHUNKSERVE_POLICY")
    if os.environ.get("CHUNKSERVE_PROFILE") not in (None, "reference-cpu"):
        console.print("demo: CHUNKSERVE_PROFILE is not used: the workers run the reference model, "
                      "whose measured profile is reference-cpu")
    logs = _logs_at(log_dir, "chunkserve-demo-logs-")  # once nothing was refused
    cfg = DemoConfig(duration_s=duration, sessions=sessions, level=level, speed=speed,
                     max_workers=max_workers, seed=seed, trace=str(trace) if trace else None, policy=policy,
                     fall_at=DemoConfig.fall_at if fall else None)
    run_id = uuid.uuid4().hex[:6]
    with infrastructure(logs) as infra:
        settings = infra.settings(base).isolated(f"demo-{run_id}")
        console.print(f"broker {infra.bootstrap} ({infra.describe()['kind']})  redis {infra.redis_url}  logs {logs}")
        with Live(_live_table({"phase": "starting"}), console=console, refresh_per_second=4) as live:
            summary = asyncio.run(run_demo(settings, cfg, logs, report,
                                           on_tick=lambda s: live.update(_live_table(s))))
    _print_demo(summary, report)
    if any(summary["audit"].values()):
        raise typer.Exit(1)


def _live_table(state: dict) -> Table:
    table = Table(title="chunkserve demo (live)", show_header=False)
    for key, value in state.items():
        table.add_row(key, str(value))
    return table


def _clipped(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n - 3] + "..."


def _print_demo(s: dict, report: Path) -> None:
    table = Table(title="chunkserve demo")
    table.add_column("figure")
    table.add_column("value")
    lat = s["chunk_latency_ms"]
    rows = [("sessions", s["sessions"]), ("chunks", s["chunks"]),
            ("chunk latency p50 / p99 / worst", f"{lat['p50']} / {lat['p99']} / {lat['worst']} ms"),
            ("workers started", s["workers_started"]),
            ("migrations", f"{s['migrations']} ({s['drain_migrations']} off drained workers)"),
            ("scale events (workers)", s["scale_events"]),
            ("offloads / restores", f"{s['offloads']} / {s['restores']}"),
            ("cost", f"{s['cost']} (GPU-hours at the profile's price per hour)"),
            ("dead letters", "; ".join([str(s["dead_letters"])] + [
                f"{n} x {why} (first: {_clipped(s['dead_letter_examples'].get(why, why), 160)})"
                for why, n in s["dead_letter_reasons"].items()][:4])),
            ("inputs refused with a reason", s["inputs_refused"]), ("wall", f"{s['wall_s']} s")]
    for k, v in rows:
        table.add_row(k, str(v))
    console.print(table)
    audit = s["audit"]
    colour = "red" if any(audit.values()) else "green"
    console.print(f"[{colour}]ownership audit: dual-owner releases {audit['dual_owner']}, stale releases "
                  f"{audit['stale_releases']}, inputs lost {audit['inputs_lost']}, duplicated "
                  f"{audit['inputs_duplicated']}, out of order {audit['inputs_out_of_order']}[/{colour}]")
    console.print(f"report: {report / 'summary.json'}  {report / 'timeline.png'}")


@app.command("smoke")
def smoke(
    sessions: int = typer.Option(3, min=1, help="Sessions to open."),
    chunks: int = typer.Option(12, min=1, help="Chunks each session streams at least before it closes."),
    workers: int = typer.Option(2, min=1, help="Worker processes to start."),
    inputs: int = typer.Option(2, min=0, help="Inputs (PushText) per session."),
    json_out: Optional[Path] = json_option("Write the summary here."),
    log_dir: Optional[Path] = folder_option("log-dir", "Folder for the processes' logs."),
) -> None:
    """A few sessions end to end (dispatch and fixed workers, no autoscaling), then the audit."""
    from infra.embedded import infrastructure
    from infra.flow import run_flow

    base = _settings(require_endpoints=False)
    logs = _logs_at(log_dir, "chunkserve-smoke-")
    run_id = uuid.uuid4().hex[:6]
    started = time.monotonic()
    with console.status("starting the broker and Redis") as status:
        with infrastructure(logs) as infra:
            settings = infra.settings(base).isolated(f"smoke-{run_id}")
            console.print(f"broker {infra.bootstrap} ({infra.describe()['kind']})  redis {infra.redis_url}  logs {logs}")
            summary = asyncio.run(run_flow(settings, logs, sessions=sessions, chunks=chunks,
                                           workers=workers, inputs=inputs,
                                           progress=lambda m: status.update(m)))
    _print_summary(summary, time.monotonic() - started)
    if json_out:
        _write_json(summary.as_dict(), json_out)
    if summary.problems:
        raise typer.Exit(1)


@app.command("ownership-check")
def ownership_check(
    runs: int = typer.Option(100_000, min=1, help="Randomized runs, split evenly over the protocols."),
    protocol: str = typer.Option("all", help="all, or a comma list of assignment, claim-only, worker-id, generation."),
    seed: int = typer.Option(0, min=0, help="Seed of the random schedules."),
    redis_sample: int = typer.Option(200, min=0, help="Extra generation runs against real Redis."),
    processes: int = typer.Option(2, min=1, help="Worker processes for the in-memory runs."),
    store: str = typer.Option("linearizable", help="linearizable (one store), or replica: a master "
                              "with an asynchronous replica that fails over (pure model, no Redis)."),
    replica_ack: bool = typer.Option(True, "--replica-ack/--no-replica-ack",
                                     help="With --store replica: fenced writes count once the replica has them."),
    json_out: Optional[Path] = json_option("Write the result here."),
) -> None:
    """The protocol study: drive four ownership protocols through the same faulty schedules."""
    from infra.embedded import EmbeddedRedis
    from infra.ownership_check import PROTOCOLS, STORES, run

    chosen = list(PROTOCOLS) if protocol == "all" else [p.strip() for p in protocol.split(",")]
    unknown = [p for p in chosen if p not in PROTOCOLS]
    if unknown:
        raise typer.BadParameter(f"unknown protocol(s) {unknown}; choose from {list(PROTOCOLS)}",
                                 param_hint="--protocol")
    if store not in STORES:
        raise typer.BadParameter(f"unknown store {store!r}; choose from {list(STORES)}", param_hint="--store")
    settings = _settings(require_endpoints=False)
    embedded = None
    if redis_sample and not settings.redis.url and store == "linearizable":
        embedded = EmbeddedRedis().start()
    try:
        url = settings.redis.url or (embedded.url if embedded else None)
        result = run(runs, chosen, seed, redis_url=url, redis_sample=redis_sample, processes=processes,
                     store=store, replica_ack=replica_ack)
    finally:
        if embedded is not None:
            embedded.stop()
    _write_json(result, json_out)


UP_STOP_GRACE_S = 3.0  # per group of `up`'s children: three groups stop within 10 s


@app.command("up")
def up(
    dispatchers: int = typer.Option(1, min=1, help="Dispatch replicas (one consumer group)."),
    log_dir: Optional[Path] = folder_option("log-dir", "Folder for the processes' logs."),
    metrics_port: Optional[int] = typer.Option(
        None, "--metrics-port", min=1, max=65535, help="Serve `up`'s metrics on this port and give each child the next "
        "one (listed in <log-dir>/prometheus-targets.json, a Prometheus file_sd file); the workers the "
        "provisioner starts take free ports from ten past its own (in <log-dir>/prometheus-workers.json)."),
    metrics_host: str = MetricsHost,
    log_format: str = LogFormat,
    adopt_store: bool = typer.Option(False, "--adopt-store", help="Take the configured Redis as the store of "
                                     "the topics' sessions although it records nothing of them (see docs/broker.md); "
                                     "without it such a Redis is refused."),
) -> None:
    """Run every processor and the provisioner against the configured cluster until Ctrl-C or
    SIGTERM, which stop them in order (control, the provisioner draining its workers, the rest).
    A child that exits is started again (each rebuilds its state from the topics); one that
    refused a setting, or exited six times in five minutes, stops the fleet."""
    from prometheus_client import Counter, Gauge

    from workers.supervision import port_free, prometheus_targets
    from infra.local import FleetLease, LocalFleet, after_exit, last_words
    from streams.config_file import load_with_sources
    from streams.log_binding import bind_store
    from streams.topics import ensure_topics

    early = _settings(require_endpoints=False)
    _check_children_env(early)  # what only a child reads is refused here, before any starts
    role_env = _role_env(early)
    children = dispatchers + 4  # the processors and the provisioner; its workers from ten past its port
    if metrics_port and metrics_port + children + 10 > 65535:
        raise ConfigError("--metrics-port", f"{metrics_port} leaves too few ports after it: its {children} children "
                          f"take the next free ones and the provisioner's workers those from ten past its own "
                          f"(give one up to {65535 - children - 10})", "command line")
    settings = _settings()
    _check_role_principals(settings)  # a role's wrong password: one line now, not six restarts of a child
    _logging(log_format)  # and its children's, through CHUNKSERVE_LOG_FORMAT
    _warn_unsigned(settings)
    lease = FleetLease(settings)
    lease.take()  # one fleet per topic prefix: a second is refused before it starts anything
    try:  # a Redis that lost the log's sessions (or serves other topics) is refused before anything starts,
        # the topics included (an outside run found all seven made on a fresh broker `up` then refused)
        asyncio.run(bind_store(settings, adopt=adopt_store, sources=load_with_sources(_CONFIG["path"], os.environ)[1]))
        asyncio.run(ensure_topics(settings))
    except BaseException:
        lease.release()
        raise
    logs = _logs_at(log_dir, "chunkserve-up-")
    fleet = LocalFleet(settings, logs, role_env=role_env)
    _metrics_server(metrics_port, metrics_host)
    running = Gauge("chunkserve_up_process_running", "1 while the child of `up` runs", ["process"])
    restarted = Counter("chunkserve_up_restarts_total", "Times `up` started an exited child again", ["process"])
    ports = iter(range(metrics_port + 1, 65536)) if metrics_port else None
    given: list[int] = []  # in the order the children start (the fleet's order)

    def exposed() -> list[str]:  # the next port after the last one given that is free now
        if ports is None:
            return []
        given.append(next(p for p in ports if port_free(metrics_host, p)))
        return ["--metrics-port", str(given[-1]), "--metrics-host", metrics_host]

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt  # SIGTERM stops the fleet as Ctrl-C does

    signal.signal(signal.SIGTERM, interrupt)
    # Ctrl-C too, even when started with SIGINT ignored (a script's `up &`: an outside run's
    # SIGINT did nothing for 30 s)
    signal.signal(signal.SIGINT, interrupt)
    try:
        for i in range(dispatchers):
            fleet.start_processor("dispatch", replica=str(i), options=exposed())
        for name in ("detector", "control", "metrics"):
            fleet.start_processor(name, options=exposed())
        own = exposed()  # the provisioner's workers take free ports from ten past its own
        fleet.start_provisioner(options=own + (["--worker-metrics-port", str(given[-1] + 10), "--targets",
                                                str(logs / "prometheus-workers.json")] if own else []))
        for name in fleet.procs:  # every child's series from the start, 0 until it restarts
            restarted.labels(name)
        if metrics_port:
            targets = prometheus_targets(metrics_host, {"up": metrics_port, **dict(zip(fleet.procs, given))})
            (logs / "prometheus-targets.json").write_text(json.dumps(targets, indent=2) + "\n")
        console.print(f"up: {', '.join(fleet.procs)}; logs in {logs}; Ctrl-C or SIGTERM stops them")
        restarts: dict[str, list[float]] = {}
        while True:
            if lease.lost is not None:
                _stderr.print(f"[red]up: {lease.lost}: stopping the fleet[/red]", soft_wrap=True)
                raise typer.Exit(2)
            for name, ok in fleet.alive().items():
                running.labels(name).set(ok)
                if ok:
                    continue
                code = fleet.procs[name].returncode
                # killed by a signal, it said nothing: its log's last line is older news
                said = f"killed by {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() \
                    else last_words(logs / f"{name}.log")
                stop = after_exit(code, restarts.setdefault(name, []), time.monotonic())
                if stop is not None:
                    _stderr.print(f"[red]up: {name} exited with code {code} ({said}); {stop}: "
                                  "stopping the fleet[/red]", soft_wrap=True)
                    raise typer.Exit(2 if code == 2 else 1)
                console.print(f"up: {name} exited with code {code} ({said}); starting it again", soft_wrap=True)
                restarts[name].append(time.monotonic())
                restarted.labels(name).inc()
                fleet.restart(name)
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM does not cut the stop short
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        # no new scaling decision, then the provisioner drains and stops its workers, then the rest
        fleet.stop_all(first=("control-0", "provisioner"), grace_s=UP_STOP_GRACE_S)
        with contextlib.suppress(Exception):  # how far the log reached: topics made anew are told apart
            asyncio.run(asyncio.wait_for(bind_store(settings, adopt=True), 3.0))
        lease.release()
        if metrics_port:  # no target left to scrape, as the provisioner leaves its workers' file
            (logs / "prometheus-targets.json").write_text("[]\n")
        console.print("up: stopped")


@app.command("watch")
def watch_cmd(
    duration: Optional[float] = typer.Option(None, min=1.0, help="Stop after this many seconds."),
    from_offset: Optional[int] = typer.Option(None, min=0, help="Start at this offset (default: the end)."),
    no_render: bool = typer.Option(False, "--no-render", help="No live table; the summary goes to --json, else to stdout."),
    json_out: Optional[Path] = json_option("Write the final summary here."),
    metrics_port: Optional[int] = MetricsPort,
    metrics_host: str = MetricsHost,
) -> None:
    """Follow the metrics and worker events: GPUs, sessions, worst chunk latency, migrations,
    cost; until --duration, Ctrl-C or SIGTERM, each of which ends it with the summary."""
    from infra.watch import watch

    settings = _settings(redis=False)  # the topics alone: after an incident, Redis may be away
    _logging("text", "WARNING")  # a broker's outage said once per 30 s, not 40 lines a second over the table
    _metrics_server(metrics_port, metrics_host)

    async def main() -> dict:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if no_render:  # the live table says nothing else: say how it ends (on stderr: stdout is the JSON's)
            print("watch: following metrics and worker-events; Ctrl-C or SIGTERM stops it with the summary",
                  file=sys.stderr, flush=True)
        return await watch(settings, duration, render=not no_render, from_offset=from_offset, stop=stop)

    try:
        result = asyncio.run(main())
    except KeyboardInterrupt:  # before the handlers above were in place: nothing read yet
        return
    if result.get("unread"):
        _stderr.print(f"[yellow]watch: stopped {result['unread']} records short of the log's end as it was at the "
                      "start (--from-offset): the summary is of the part read; a longer --duration reads on[/yellow]",
                      soft_wrap=True)
    if json_out is not None or no_render:
        _write_json(result, json_out)


def _replayable(value: str) -> str:
    """A processor whose state replay rebuilds, checked as the command line is read (before
    any setting is: a bad name was answered with the missing broker's message)."""
    if value not in ("control", "dispatch", "detector"):
        raise typer.BadParameter(f"unknown processor {value!r}: choose control, dispatch or detector")
    return value


@app.command("replay")
def replay_cmd(
    processor: str = typer.Argument("control", help="Whose state to rebuild: control, dispatch, detector.",
                                    callback=_replayable),
    offset: int = typer.Option(0, min=0, help="Start at this offset in every partition (0: the beginning)."),
    json_out: Optional[Path] = json_option("Write the rebuilt state here."),
) -> None:
    """Rebuild a processor's state from the topics and print it (the log is the truth)."""
    from infra.replay import replay

    settings = _settings(redis=False)  # the topics alone: after an incident, Redis may be away
    try:
        result = asyncio.run(replay(settings, processor, offset))
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="processor")
    if json_out is None and "session_states" in result:
        states = ", ".join(f"{k} {v}" for k, v in sorted(result["session_states"].items())) or "none"
        past = f" at or after offset {offset}" if offset else ""
        refused = f" ({result['refused']} more refused for their signature, not folded)" if result["refused"] else ""
        _stderr.print(f"{result['records']} records{past}{refused}; sessions by state: {states}; "  # stdout: the JSON alone
                      f"workers {len(result['workers'])}", highlight=False)
    _write_json(result, json_out)


@app.command("story")
def story_cmd(
    session_id: str = typer.Argument(..., help="The session whose story to tell."),
    last: int = typer.Option(50, "--last", min=1, max=100_000, help="Show its last N entries."),
    json_out: Optional[Path] = json_option("Write the story here."),
) -> None:
    """What the topics say happened to one session: its events, the commands and worker reports
    of it (claims, freezes, handoffs, releases, refusals), its dead letters, its chunks."""
    from infra.replay import session_log

    settings = _settings(redis=False)  # the topics alone: after an incident, Redis may be away
    result = asyncio.run(session_log(settings, session_id, last))
    if not result["records"] and not result["refused"]:
        raise ChunkserveError(f"{session_id}: no record of this session in the topics of prefix {settings.topic_prefix!r}")
    if json_out is None:
        for line in result["story"]:
            console.print(f"{session_id} {line}", highlight=False, markup=False)
        refused = f" ({result['refused']} more refused for their signature)" if result["refused"] else ""
        console.print(f"{result['records']} records{refused}; {result['chunks']} chunks; {result['inputs_accepted']} "
                      "inputs accepted", highlight=False)
        return  # the story as text; as JSON only with --json (it was both, so no reader could parse it)
    _write_json(result, json_out)


@app.command("handoff")
def handoff_cmd(
    session_id: str = typer.Argument(..., help="The session to move."),
    target: str = typer.Argument(..., help="The worker to move it to."),
    wait: float = typer.Option(30.0, min=0.0, help="Seconds to wait until the target holds it (0: send and return)."),
    json_out: Optional[Path] = json_option("Write the outcome here."),
) -> None:
    """Move a live session to another worker at its next chunk boundary (a Handoff to its
    owner, as a rebalance sends); exit 1 when refused or not moved within --wait."""
    from infra.handoff import hand_off

    settings = _settings()
    try:
        result = asyncio.run(hand_off(settings, session_id, target, wait))
    except ChunkserveError as exc:  # refused: the outcome is written too (it wrote nothing)
        if json_out is not None and not isinstance(exc, ConfigError):
            _write_json({"session": session_id, "to": target, "moved": False, "refused": str(exc)}, json_out)
        raise
    said = "moved" if result["moved"] else ("sent" if wait == 0 else f"not moved within {wait:g} s")
    console.print(f"{session_id}: {said} ({result['from']} -> {target}; now {result['now']})", highlight=False)
    if not settings.command_keys.enabled and not result["moved"]:  # a signing fleet refused it as unsigned
        _stderr.print("handoff: it was sent unsigned (CHUNKSERVE_COMMAND_KEYS is not set): a fleet that signs "
                      "its commands refuses it (`chunkserve story` shows `worker.rejected unsigned`)", soft_wrap=True)
    if json_out is not None:
        _write_json(result, json_out)
    if wait > 0 and not result["moved"]:
        raise typer.Exit(1)


@app.command("chaos")
def chaos(
    sessions: int = typer.Option(12, min=1, help="Sessions kept open through the faults."),
    duration: float = typer.Option(40.0, min=10.0, help="Seconds of faults and traffic."),
    workers: int = typer.Option(4, min=3, help="Worker processes (one is paused, one killed)."),
    seed: int = typer.Option(0, min=0, help="Seed of the duplicated/delayed commands."),
    brokers: int = typer.Option(1, min=1, help="Apache Kafka brokers to start (the embedded cluster)."),
    broker_faults: bool = typer.Option(False, "--broker-faults", help="Also kill the leading broker "
                                       "and restart it (3+ brokers), then kill and restart every broker."),
    outage: float = typer.Option(0.0, min=0.0, help="Seconds every broker stays down in the full restart."),
    process_faults: bool = typer.Option(True, "--process-faults/--no-process-faults",
                                        help="Pause a worker, kill a worker, kill a dispatch replica."),
    redis_cluster: bool = typer.Option(False, "--redis-cluster", help="Run the store on an embedded "
                                       "Redis Cluster (3 masters, a replica each) and SIGKILL the "
                                       "namespace's master mid-run (--redis-faults times)."),
    redis_faults: Optional[int] = typer.Option(None, min=0, help="With --redis-cluster: how many times to "
                                               "kill the namespace's master, each after the last one killed "
                                               "is back as a replica (default 1)."),
    replica_acks: Optional[int] = typer.Option(None, min=0, max=16, help="Replicas a fenced write waits "
                                               "for on the cluster (default 1; 0: the control run)."),
    migrate_every: float = typer.Option(0.0, min=0.0, help="Seconds between operator Handoffs of a random "
                                        "session to another worker (0: none; the run's policy never migrates)."),
    json_out: Optional[Path] = json_option("Write the audit here."),
    log_dir: Optional[Path] = folder_option("log-dir", "Folder for the processes' logs."),
) -> None:
    """Run the live system under faults (pause, crash, dead dispatcher, duplicated and delayed
    commands; broker failover and full restart with --broker-faults; a Redis master's death
    with --redis-cluster) and audit ownership, capacity, inputs and replay."""
    from infra.broker_faults import KINDS
    from infra.chaos import AUDIT_KEYS, ChaosConfig, run_chaos
    from infra.embedded import infrastructure

    if redis_faults and not redis_cluster:
        raise typer.BadParameter("Redis faults need the embedded cluster: add --redis-cluster",
                                 param_hint="--redis-faults")
    base = _settings(require_endpoints=False)
    run_id = uuid.uuid4().hex[:6]
    cfg = ChaosConfig(sessions=sessions, duration_s=duration, workers=workers, seed=seed,
                      broker_faults=KINDS if broker_faults else (), outage_s=outage,
                      process_faults=process_faults, migrate_every_s=migrate_every,
                      redis_faults=(1 if redis_faults is None else redis_faults) if redis_cluster else 0)
    logs = _logs_at(log_dir, "chunkserve-chaos-")  # once the settings were taken
    own_broker = "kafka" if broker_faults or brokers > 1 else None  # faults need a cluster of our own
    if broker_faults:  # the run's own clients: connection errors are what it asked for
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    with console.status("starting") as status:
        with infrastructure(logs, brokers=brokers, kind=own_broker) as infra, \
                contextlib.ExitStack() as stack:
            settings = infra.settings(base).isolated(f"chaos-{run_id}")
            cluster = None
            if redis_cluster:
                from dataclasses import replace

                from infra.redis_cluster import EmbeddedRedisCluster

                cluster = stack.enter_context(EmbeddedRedisCluster(logs / "redis-cluster"))
                settings = replace(settings, redis=replace(settings.redis, url=cluster.url, cluster="on",
                                                           replica_acks=replica_acks))
            result = asyncio.run(run_chaos(settings, cfg, logs, progress=lambda m: status.update(m),
                                           broker=infra.broker, redis_cluster=cluster))
            result["broker"] = infra.describe()
    _write_json(result, json_out)
    bad = {k: result[k] for k in AUDIT_KEYS if result[k]}
    if bad:
        _stderr.print(f"[red]audit failed:[/red] {bad}")
        raise typer.Exit(1)
    redis = result.get("redis")
    console.print(f"[green]audit clean[/green]: {result['chunks']} chunks, faults {result['faults']}, "
                  f"broker faults {result['broker_faults']}, max recovery {result['max_recovery_s']} s"
                  + (f", Redis failovers {redis['failovers']} (longest unserved {redis['longest_unserved_s']} s)"
                     if redis else ""))


def _print_summary(summary: object, wall_s: float) -> None:
    s = summary  # FlowSummary
    table = Table(title="chunkserve smoke")
    for col in ("session", "generation", "chunks", "inputs applied", "released"):
        table.add_column(col)
    for sid in sorted(s.chunk_indices):  # type: ignore[attr-defined]
        table.add_row(sid, ", ".join(s.generations[sid]), str(len(s.chunk_indices[sid])),  # type: ignore[attr-defined]
                      str(s.inputs_accepted.get(sid, [])), s.released.get(sid, "-"))  # type: ignore[attr-defined]
    console.print(table)
    console.print(
        f"workers {s.workers}  sessions {s.sessions}  chunks {s.chunks}  "  # type: ignore[attr-defined]
        f"chunk latency p50 {s.chunk_latency_ms_p50:.1f} ms max {s.chunk_latency_ms_max:.1f} ms  "  # type: ignore[attr-defined]
        f"metrics records {s.metrics_records}  dead letters {s.dead_letters}  "  # type: ignore[attr-defined]
        f"rejected commands {s.rejected}  wall {wall_s:.1f} s")  # type: ignore[attr-defined]
    if s.problems:  # type: ignore[attr-defined]
        for p in s.problems:  # type: ignore[attr-defined]
            console.print(f"[red]problem:[/red] {p}")
    else:
        console.print("[green]audit: every chunk in order under one generation; every session "
                      "released on close[/green]")


def main() -> None:
    try:
        code = app(standalone_mode=False, prog_name="chunkserve")  # click's own errors below, in one line
    except ConfigError as exc:  # the operator's to fix: exit code 2, as for bad options
        _stderr.print(f"[red]configuration error:[/red] {exc}", soft_wrap=True)
        sys.exit(2)
    except ChunkserveError as exc:
        _stderr.print(f"[red]error:[/red] {exc}", soft_wrap=True)
        sys.exit(1)
    except typer.Abort:  # end of input at a prompt
        sys.exit(1)
    except Exception as exc:
        sys.exit(_one_line(exc))
    if isinstance(code, int) and not isinstance(code, bool) and code:  # typer.Exit(code), or 130 for Ctrl-C
        sys.exit(code)


def _one_line(exc: Exception) -> int:
    """Print a command-line error or a broker's in one line; its exit code. Anything else
    is a bug and raises on."""
    if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):  # click's (typer's own copy of it)
        if type(exc).__name__ == "NoArgsIsHelpError":  # the help is printed already
            return exc.exit_code
        ctx = getattr(exc, "ctx", None)
        where = ctx.command_path if ctx is not None else "chunkserve"
        kind = "usage error" if exc.exit_code == 2 else "error"
        _stderr.print(f"[red]{kind}:[/red] {where}: {exc.format_message()} (see {where} --help)", highlight=False)
        return exc.exit_code
    from aiokafka.errors import KafkaError  # a broker that answers with an error or not in time

    if not isinstance(exc, KafkaError):
        raise exc
    from streams.kafka import broker_error_line

    _stderr.print(f"[red]error:[/red] the broker: {type(exc).__name__} ({broker_error_line(exc)})", soft_wrap=True)
    return 1


if __name__ == "__main__":
    main()
