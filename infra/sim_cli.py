"""CLI commands of the simulator: ``trace gen``, ``simulate``, ``evaluate`` and ``tune``.

``register(app)`` adds them to the main app. User errors (bad trace, bad option) print one
line and exit 2; never a traceback.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from infra.outputs import writable as _writable, write_output as _write_output
from processors.scaling_config import AutoscalerConfig, Slo
from schemas.errors import ChunkserveError, ConfigError

__all__ = ["register"]

# the options' defaults are the shipped configuration's own, not copies of it
_AUTO, _SLO = AutoscalerConfig(), Slo()

# piped or redirected, a table keeps each row on one line (at 80 columns it broke
# `least-loaded-offload` and a trace's path over several)
_console = Console(emoji=False, soft_wrap=True, width=None if sys.stdout.isatty() else 240)
_err = Console(stderr=True, emoji=False, soft_wrap=True)


def _pct(x: float | None) -> str:
    """A percentage of a table, or "-" where there is none (no bound, no pool: a trace that
    lasts no time crashed the table after every run, and its JSON was never written)."""
    return "-" if x is None else f"{x:.1f}"


HEARTBEAT_S = 30.0  # off a terminal, a long command says it is alive this often
# held while a beat prints: the runs' worker processes fork from this one, and a child must
# not inherit the output's locks in the middle of a line
_BEAT = threading.Lock()
os.register_at_fork(before=_BEAT.acquire, after_in_parent=_BEAT.release, after_in_child=_BEAT.release)


@contextmanager
def _progress(command: str, what: str, every_s: float = HEARTBEAT_S) -> Iterator[Callable[[str], None]]:
    """What runs now, told through the function this yields: on a terminal a transient bar;
    elsewhere (a CI log, a pipe) one line every ``every_s`` seconds (``simulate: 30 s,
    simulating turboserve``), so a log shows a long run alive, and a run that fails at once
    prints its error alone."""
    if _err.is_terminal:
        with Progress(console=_err, transient=True) as bar:
            task = bar.add_task(what, total=None)
            yield lambda s: bar.update(task, description=s)
        return
    now, start, stop = [what], time.monotonic(), threading.Event()

    def beat() -> None:
        while not stop.wait(every_s):
            with _BEAT:
                _err.print(f"{command}: {time.monotonic() - start:.0f} s, {now[0]}", highlight=False, soft_wrap=True)

    beating = threading.Thread(target=beat, name=f"{command}-progress", daemon=True)
    beating.start()
    try:
        yield lambda s: now.__setitem__(0, s)
    finally:
        stop.set()
        beating.join()


def _fail(exc: Exception, command: str) -> None:
    """One line, exit code 2, with the prefix ``chunkserve``'s own errors have: a bad option
    or pair of options as click's usage errors read (``chunkserve COMMAND``, then its help)."""
    if isinstance(exc, ConfigError) and exc.source == "command line":
        where = f"chunkserve {command}"
        _err.print(f"[red]usage error:[/red] {where}: {exc.key}: {exc.reason} (see {where} --help)",
                   highlight=False, soft_wrap=True)
        raise typer.Exit(2)
    kind = "configuration error" if isinstance(exc, ConfigError) else "error"
    _err.print(f"[red]{kind}:[/red] {exc}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _profiles(profile: str) -> Any:
    """The latency model ``--profile`` names: a built-in's name or a file (a name that is
    neither is the option's error, not a file's)."""
    from processors.latency import load_profiles

    try:
        return load_profiles(profile)
    except ConfigError as exc:
        if exc.key == "profile" and exc.source == profile and exc.reason.startswith("no built-in profile"):
            raise ConfigError("--profile", f"{exc.reason}, and no such file", "command line") from None
        raise


def trace_gen(
    ctx: typer.Context,
    output: Path = typer.Option(..., "-o", "--output", help="Trace CSV to write."),
    level: int = typer.Option(5, "--level", min=1, max=10, help="Volatility 1..10: share and size of arrival bursts and of synchronized idle->active wake-ups (1 calm, 10 bursty)."),
    duration: float = typer.Option(3600.0, "--duration", min=1.0, max=1e6, help="Trace length in seconds (at most 1,000,000, what a trace may give)."),
    seed: int = typer.Option(0, "--seed", min=0, help="Random seed; same seed, same trace."),
    sessions: int = typer.Option(5000, "--sessions", min=1, max=1_000_000, help="Expected arrivals over the trace (sets the mean arrival rate); a trace that starts mid-stream (this generator, the second and fourth models' mid-stream families) adds the sessions alive at its start. The fourth to eighth and the tenth models' families read it as a rate instead: their rates (and the eighth's populations, the tenth's classes and creators) are the reviewer's times --sessions / 1600, so at 1600 an hour holds about three times the sessions 1,200 s does (the line written says how many); the ninth model's are the reviewer's --sessions (1600 by default), expected arrivals as here."),
    swing: float = typer.Option(0.5, "--swing", min=0.0, max=0.99, help="Relative amplitude of the slow daily-like swing of the arrival rate."),
    period: float = typer.Option(0.0, "--period", min=0.0, help="Swing period in seconds (0: one period over the trace)."),
    life_median: float = typer.Option(120.0, "--life-median", min=1.0, help="Median session lifetime, s (log-normal; clipped to 2 s .. 40 min)."),
    life_sigma: float = typer.Option(1.3, "--life-sigma", min=0.0, help="Log-sigma of session lifetime (heavier tail when larger)."),
    active_mean: float = typer.Option(45.0, "--active-mean", min=0.1, help="Mean active spell, s (exponential)."),
    idle_scale: float = typer.Option(8.0, "--idle-scale", min=0.1, help="Idle gap Pareto scale, s (minimum gap)."),
    idle_shape: float = typer.Option(1.5, "--idle-shape", min=0.1, help="Idle gap Pareto shape (heavier tail when smaller)."),
    state_mb: float = typer.Option(2000.0, "--state-mb", min=50.0, max=20000.0, help="Median per-session state size, MB (log-normal; each session's clipped to 50 MB .. 20 GB)."),
    family: Optional[str] = typer.Option(None, "--family", help="A trace family of the second workload model instead: calm, flash, mass-idle, longtail, diurnal, scale4x; or of the third (launches: the trace starts empty): mmpp, avatar, flicker, ramp, bigstate, spiky, and its probes churn, periodic; or of the fourth (an outside reviewer's): hawkes, weekly, bimodal, recall, or of the fifth (a second reviewer's): office, viral, batchy, or of the sixth (a third reviewer's): failover, heavyvid, liveevent, or of the seventh (a fourth reviewer's): plateau, waves, pareto, mixed, or of the eighth (a fifth reviewer's): desk, lobby, outage, or of the ninth (a sixth reviewer's): turns, nightshift, heavystate, lurkers, or of the tenth (a seventh reviewer's): classes, creators, or of the eleventh (sessions in rounds): quiz, match, lesson; the fourth to eighth and the tenth models' rates and the eleventh's seats (600 at 1600) scale by --sessions / 1600, the ninth's arrivals are --sessions (a family uses --duration, --sessions, --seed only; nightshift also --crowds, classes also --offset)."),
    crowds: Optional[int] = typer.Option(None, "--crowds", min=0, max=1000, help="--family nightshift only: how many crowds of 40-90 sessions arrive within 12 s (default 2, the reviewer's)."),
    offset: Optional[float] = typer.Option(None, "--offset", min=0.0, help="--family classes only: the first class slot's start, s, in [0, 300) (default 0; above 0 a slot that started 300 s earlier is running at 0, as on the cohorts split's classes/s3 at 150)."),
) -> None:
    """Generate a synthetic session trace (CSV t_s,session_id,event,state_mb)."""
    from infra.sim.cohorts import COHORTS
    from infra.sim.evaluate import TraceSpec, make_trace
    from infra.sim.families import FAMILIES
    from infra.sim.launches import LAUNCHES, PROBES
    from infra.sim.outside import OUTSIDE
    from infra.sim.review import REVIEW
    from infra.sim.rounds import ROUNDS
    from infra.sim.steps import STEPS
    from infra.sim.surges import SURGES
    from infra.sim.tenants import TENANTS
    from infra.sim.trace import write_trace
    from infra.sim.tracegen import GenConfig, generate
    from infra.sim.wakes import WAKES

    try:
        _writable(output=output)
        known = FAMILIES + LAUNCHES + PROBES + OUTSIDE + REVIEW + SURGES + STEPS + TENANTS + WAKES + COHORTS + ROUNDS
        if family is not None and family not in known:
            raise ConfigError("--family", f"{family!r}: not a family (give one of {', '.join(known)})", "command line")
        own = [f"--{n.replace('_', '-')}" for n in _GENERATOR_ONLY if ctx.get_parameter_source(n).name == "COMMANDLINE"]
        if family is not None and own:  # a family has its own shape: said, not silently ignored
            raise ConfigError(own[0], f"shapes the project's generator only, not --family {family} "
                              "(a family takes --duration, --sessions and --seed)", "command line")
        if crowds is not None and family != "nightshift":
            raise ConfigError("--crowds", "sets the crowds of --family nightshift only", "command line")
        if offset is not None and family != "classes":
            raise ConfigError("--offset", "sets the first slot of --family classes only", "command line")
        if family is not None:  # the same generation evaluate runs, by the family's model
            events = list(make_trace(TraceSpec(family, seed, duration, sessions, crowds, offset or 0.0)).events)
        else:
            cfg = GenConfig(level, duration, sessions, seed, swing, period, life_median, life_sigma, active_mean, idle_scale, idle_shape, state_mb)
            events = generate(cfg)
        if not events:  # simulate refuses an empty trace: said here, not written
            raise ConfigError("--sessions", f"no session arrives in {duration:g} s at {sessions} expected arrivals "
                              "(raise --sessions or --duration); nothing written", "command line")
        try:
            write_trace(events, output)
        except OSError as exc:
            raise ConfigError("--output", f"cannot write ({exc.strerror or exc})", str(output)) from None
    except ChunkserveError as exc:
        _fail(exc, "trace gen")
    _console.print(f"wrote {output}: {len(events)} events, {sum(e.kind.value == 'open' for e in events)} sessions")


_GENERATOR_ONLY = ("level", "swing", "period", "life_median", "life_sigma", "active_mean", "idle_scale", "idle_shape", "state_mb")


def simulate_cmd(
    trace: Path = typer.Argument(..., help="Trace CSV (t_s,session_id,event[,state_mb])."),
    policy: list[str] = typer.Option(["all"], "--policy", "-p", help="rr, lag, mag, least-loaded-offload, lag-offload, mag-offload, turboserve, turboserve-no-migration, turboserve-no-autoscale, oracle, oracle-autoscale, telefuser (the peer, infra.sim.peers:TeleFuser), kubernetes-hpa, ray-serve, ray-serve-auto (peers not in all), module:Name, or all (repeatable or comma-separated; all plus module:Name runs both)."),
    subject: Optional[str] = typer.Option(None, "--subject", help="The policy the comparisons are about (a --policy spec or a policy's name, or a module:Name, which then runs beside the --policy ones; default: turboserve when it runs)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the results as JSON here."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write the timeline plot (PNG) here."),
    profile: str = typer.Option("paper", "--profile", help="Latency profile: built-in name or JSON file."),
    table: str = typer.Option("default", "--table", help="Volatility table JSON (from `chunkserve tune`) or 'default'."),
    gpu_type: Optional[str] = typer.Option(None, "--gpu-type", help="GPU type of fixed pools and of scale-out (default: b300, or a profile's only type)."),
    pool: Optional[int] = typer.Option(None, "--pool", min=1, max=4096, help="Pool size for fixed-pool policies when no subject runs (default: peak-provisioned; with a subject their rows are at the pool matching its cost), and the starting pool of module:Name policies (default: elastic, like turboserve)."),
    deadline: float = typer.Option(1.0, "--deadline", min=0.001, max=3600.0, help="Chunk deadline = media duration of a chunk, s."),
    boot: float = typer.Option(60.0, "--boot", min=0.0, max=86400.0, help="GPU boot time, s."),
    round_s: float = typer.Option(0.5, "--round", min=0.0, max=60.0, help="Decision round grid, s (events are quantized up to it; 0: exact)."),
    burst_memory: float = typer.Option(_AUTO.burst_memory_s, "--burst-memory", min=0.0, max=1e6, help="How long the autoscaler's burst reserve remembers a rise of executing sessions, s (0: no reserve)."),
    settle: float = typer.Option(_AUTO.settle_s, "--settle", min=0.0, max=1e6, help="Without an SLO, a rise of executing sessions counts toward the burst reserve only above the level held in these seconds before it, and a scale-in keeps their peak, s (0: every rise in full)."),
    min_gpus: int = typer.Option(_AUTO.min_gpus, "--min-gpus", min=0, max=1024, help="The fewest GPUs turboserve's autoscaler (and the oracles built on it) keeps, booting up to them at once (N + 1: one GPU lost leaves the sessions somewhere to go; 1 is the rule before)."),
    follow_worst: float = typer.Option(_AUTO.follow_worst or 0.0, "--follow-worst", min=0.0, max=1.0, help="Without an SLO, turboserve's u* rises to the sessions per GPU the worst chunk of the burst memory already allows, up to this share of K (0: off, the table's u* alone)."),
    slo_floor: float = typer.Option(_AUTO.slo_floor_share or 0.0, "--slo-floor", min=0.0, max=1.0, help="With an SLO, turboserve's u* is no lower than the sessions per GPU at which first chunks, at the mean minute's rate of the burst memory, would miss this share of the SLO's rate, after its first 300 s and while within its error budget (0: off, the feedback alone)."),
    slo_miss: float = typer.Option(_SLO.miss_rate, "--slo-miss-rate", min=0.0, max=0.999, help="SLO: largest share of chunks past their deadline."),
    slo_worst: float = typer.Option(_SLO.worst_s, "--slo-worst", min=0.001, max=86400.0, help="SLO: slowest chunk allowed, s."),
    cold_start: bool = typer.Option(False, "--cold-start", help="Elastic policies start with the first boot time's demand at full capacity and every scale-out boots; default: the pool their first decision asks for is ready at the trace's first instant (a trace starts mid-stream), and a launch (a first instant with fewer sessions than one GPU holds) opens with the GPUs its first two boot times' peak needs at full capacity."),
    jobs: int = typer.Option(0, "--jobs", "-j", min=0, help="Processes the comparisons' runs use (0: one per CPU core; same figures for any number)."),
) -> None:
    """Replay a trace through policies; print a table, write JSON and a timeline plot."""
    from processors.volatility import load_volatility_table
    from infra.sim.report import Runner, check_policies, compare, plot_timeline, resolve_subject, timelines
    from infra.sim.simulator import SimConfig

    start = time.perf_counter()
    try:
        _writable(reads=[trace], json=json_out, plot=plot)
        _plot_format(plot)
        names = _expand(policy)
        if subject is not None and ":" in subject and subject not in names:  # a plug-in subject runs beside them
            names.append(subject)
        check_policies(names)
        model, gpu_type = _priced_pool(profile, gpu_type)
        vt = load_volatility_table(table)
        slo = Slo(slo_miss, slo_worst)
        tr = _read_trace(trace, model, gpu_type)
        cfg = SimConfig(gpu_type=gpu_type, boot_s=boot, deadline_s=deadline, round_s=round_s, warm_start=not cold_start)
        auto = AutoscalerConfig(gpu_type=gpu_type, boot_s=boot, burst_memory_s=burst_memory, settle_s=settle,
                                follow_worst=follow_worst or None, min_gpus=min_gpus, slo_floor_share=slo_floor or None)
        options = _builtin_options(vt, auto)
        offer = {"table": vt, "autoscaler": auto}  # the SLO is offered only to the runs at it (compare)
        with _progress("simulate", "simulating") as tell:
            runner = Runner(tr, model, cfg, options, on_run=lambda s: tell(f"simulating {s}"),
                            offer=offer, plugin_pool=pool)
            _check_names(runner, names)
            subject_spec = resolve_subject(runner, names, subject)
            if pool is not None and subject_spec is None:
                runner.peak_pool = pool
            out = compare(runner, names, subject_spec or "turboserve", slo, jobs=_jobs(jobs))
    except ChunkserveError as exc:
        _fail(exc, "simulate")
    out["wall_s"] = time.perf_counter() - start
    # how long each policy's own code took per decision in its reported run (host time, like
    # wall_s: no figure depends on it)
    out["decide_s"] = {r.policy: {"calls": r.decide_calls, "mean": r.decide_s / r.decide_calls if r.decide_calls else 0.0,
                                  "max": r.decide_max_s} for r in runner.reported.values()}
    try:  # written before the table: a reader that stops reading (`| head`) leaves the results
        if json_out is not None:
            _write_output("json", json_out, json.dumps(out, indent=2, sort_keys=True) + "\n")
    except ChunkserveError as exc:
        _fail(exc, "simulate")
    _print_table(out)
    try:
        if plot is not None:
            try:
                plot_timeline(timelines(runner, names), cfg.window_s, str(plot))
            except OSError as exc:
                raise ConfigError("--plot", f"cannot write ({exc.strerror or exc})", str(plot)) from None
    except ChunkserveError as exc:
        _fail(exc, "simulate")


def _missed(slo: dict, name: str) -> str:
    """By how much ``name``'s run at the SLO misses it."""
    return f" (misses: {100 * slo['miss_rates'][name]:.3f}% late, worst {slo['worst_chunks_s'][name]:.2f} s)"


def _read_trace(path: Path, model: Any, gpu_type: str) -> Any:
    """A user's trace file, read and checked (an empty one refused); a note when its first
    row is 1% of its length or more past 0, since replay and billing start at 0, and one
    when its sessions would not fit in the pooled GPU's memory (:func:`_memory_note`)."""
    from infra.sim.trace import load_trace

    tr = load_trace(path)
    if not tr.events:
        raise ChunkserveError(f"{path}: the trace has no events")
    if tr.events[0].t > 0 and tr.events[0].t >= 0.01 * tr.events[-1].t:  # a launch's first session a moment after 0 is no news
        _err.print(f"note: {path}: the first row is at {tr.events[0].t:g} s; the trace is replayed, and fixed "
                   "pools billed, from 0, and a launch's opening pool is sized on its first two boot times "
                   "(shift the trace to start at 0 if the service goes live with its first session)",
                   soft_wrap=True, highlight=False, markup=False)
    _memory_note(tr, model, gpu_type, path)
    return tr


def _memory_note(tr: Any, model: Any, gpu_type: str, path: Path) -> None:
    """A note when this trace's sessions, K of them at its median state size, would not fit
    in the pooled GPU's memory: the simulator bounds a GPU by its K slots only."""
    import statistics

    sizes = [e.state_bytes for e in tr.events if e.state_bytes > 0]
    p, median = model[gpu_type], statistics.median(sizes) if sizes else 0
    held = p.capacity * median
    if held > p.memory_bytes:
        _err.print(f"note: {path}: {p.capacity} sessions of this trace's median state ({median / 1e9:.1f} GB) "
                   f"hold {held / 1e9:,.0f} GB, past a {gpu_type}'s {p.memory_bytes / 2**30:g} GiB; the simulator bounds a GPU "
                   f"by its {p.capacity} session slots, not by memory, so such a pool holds more than the GPU could",
                   soft_wrap=True, highlight=False, markup=False)


def _plot_format(plot: Path | None) -> None:
    """A plot file's suffix must name a format matplotlib writes (checked before the run)."""
    if plot is None:
        return
    from matplotlib.figure import Figure

    formats = Figure().canvas.get_supported_filetypes()
    if plot.suffix.lstrip(".").lower() not in formats:
        raise ConfigError("plot", f"the file name's suffix names no image format ({', '.join(sorted(formats))})", str(plot))


# why the simulator refuses a command of each kind (docs/scheduling.md's list, per kind)
_WHY = {
    "malformed": "a field of the wrong type, or an admission count that is not finite",
    "boot": "no whole count from 1, a GPU type the profile lacks, or past 4,096 GPUs",
    "admit": "an entry for a GPU the pool lacks or for no session",
    "retire": "a GPU unknown, or one a session still runs on, rests on or travels to",
    "discard": "sessions end with the trace's close",
    "offload": "the session not resident where it says",
}


def _priced_pool(profile: str, given: str | None) -> tuple[Any, str]:
    """The latency model ``profile`` names and the GPU type a run pools, which must have a
    price: the comparisons are of cost."""
    model = _profiles(profile)
    gpu_type = _pool_type(model, profile, given)
    if model[gpu_type].cost_per_hour <= 0:  # every cost, saving and matched pool would read 0
        raise ConfigError(f"gpu_types.{gpu_type}.cost_per_hour", "is 0: the comparisons are of cost, give the "
                          "GPU type a price above 0", profile)
    return model, gpu_type


def _pool_type(model: Any, profile: str, given: str | None) -> str:
    """The GPU type a run pools: ``--gpu-type`` when given (one the profile has), else b300
    (the built-in profiles'), or the type of a profile that has one only (a user's own)."""
    has = ", ".join(sorted(model))[:200]
    if given is not None and given not in model:
        raise ConfigError("--gpu-type", f"{given!r}: the profile {profile!r} has no such GPU type (it has {has})", "command line")
    if given is not None or "b300" in model:
        return given or "b300"
    if len(model) == 1:
        return next(iter(model))
    raise ConfigError("--gpu-type", f"the profile {profile!r} has several GPU types and no b300: name the one to pool "
                      f"(it has {has})", "command line")


def _jobs(jobs: int) -> int:
    import os

    return jobs or os.cpu_count() or 1


def _expand(policy: list[str]) -> list[str]:
    from infra.sim.report import ALL_POLICIES, PEER_NAMES

    out: list[str] = []
    for p in (q.strip() for spec in policy for q in spec.split(",")):  # repeated or comma-separated
        if p:
            out.extend(ALL_POLICIES if p == "all" else [PEER_NAMES.get(p, p)])
    return list(dict.fromkeys(out))


def _builtin_options(vt: object, auto: object) -> dict:
    """Per built-in: the table and autoscaler config the CLI was given."""
    ts = {"table": vt, "autoscaler": auto}
    options = {n: dict(ts) for n in ("turboserve", "turboserve-no-migration", "turboserve-no-autoscale", "oracle")}
    options["oracle-autoscale"] = {"autoscaler": auto}
    return options


def _check_names(runner: object, names: list[str]) -> None:
    """Results are keyed by the policy's name: a plug-in named as a built-in or as another
    plug-in is refused (it would replace that one's row)."""
    from processors.policy import BUILTIN_POLICIES

    seen = {n: n for n in names if ":" not in n}
    for spec in names:
        if ":" in spec:
            name = runner.name_of(spec)  # type: ignore[attr-defined]
            if not isinstance(name, str) or not name:
                raise ConfigError("policy", f"its name is {name!r}: results are keyed by name, give it a string", spec)
            if name != name.strip() or "," in name or ":" in name or not name.isprintable():  # "oracle " read as the oracle's row
                raise ConfigError("policy", f"its name {name!r} has spaces around it, a comma, a colon or a control "
                                  "character: results are keyed by name, give it one that reads as itself", spec)
            if name in BUILTIN_POLICIES or name == "all" or name in seen:
                owner = "a built-in policy's" if name in BUILTIN_POLICIES else "the word for every policy's" if name == "all" else f"{seen[name]}'s"
                raise ConfigError("policy", f"its name {name!r} is {owner} too (results are keyed by name): "
                                  "give it a name of its own", spec)
            alike = next((n for n in (*BUILTIN_POLICIES, *seen) if n.casefold() == name.casefold() and n != name), None)
            if alike is not None:  # two rows that read alike ("TurboServe" beside turboserve)
                owner = f"the built-in {alike!r}" if alike in BUILTIN_POLICIES else f"{alike!r} ({seen[alike]})"
                raise ConfigError("policy", f"its name {name!r} is {owner} but for its case: give it a name of its own", spec)
            seen[name] = spec


# a decision this long or longer is named under simulate's table: live, the control processor
# looks for a round every 0.5 s (ControlConfig.tick_s), so a longer one holds back the next
SLOW_DECISION_S = 0.5
_NO_ABLATIONS = "turboserve-no-autoscale ran at the peak-provisioned pool: the ablations are compared only when turboserve is the subject"


def _print_ablations(out: dict) -> None:
    """The ablations against turboserve (when it is the subject), or why their rows are not."""
    abl = out.get("ablation_cost_increase_pct")
    if abl:
        parts = [f"{a}: " + ("no fixed pool up to the search's cap is as fast" if v is None else f"{v:+.1f}%") for a, v in abl.items()]
        _console.print("ablations, cost over turboserve (no-autoscale: the fixed pool matching its worst chunk): " + "; ".join(parts))
    elif "turboserve-no-autoscale" in out["policies"] and out.get("subject") not in (None, "turboserve"):
        _console.print(f"[yellow]{_NO_ABLATIONS}[/yellow]")


def _print_table(out: dict) -> None:
    t = Table(title=f"{out['trace']['sessions']} sessions, {out['trace']['duration_s']:.0f} s")
    for col in ("policy", "worst s", "p99 s", "miss %", "GPU-h", "cost", "migr.", "scale"):
        t.add_column(col, justify="right" if col != "policy" else "left", overflow="fold")  # names wrap, not cut
    for name, m in out["policies"].items():
        t.add_row(name, f"{m['worst_chunk_latency_s']:.2f}", f"{m['p99_chunk_latency_s']:.2f}", f"{100 * m['deadline_miss_rate']:.2f}",
                  f"{m['gpu_seconds'] / 3600:.1f}", f"{m['cost']:.1f}", str(m["migrations"]), str(m["scale_events"]))
    _console.print(t)
    for name, m in out["policies"].items():
        if m["invalid_commands"]:
            why: dict[str, list[str]] = {}  # each reason once, after the kinds it explains
            for k, n in m.get("invalid_commands_by_kind", {}).items():
                why.setdefault(_WHY.get(k.split()[0], "a GPU not ready or unknown, a session not where it says"), []).append(f"{k} {n}")
            kinds = "; ".join(f"{', '.join(ks)}: {reason}" for reason, ks in why.items())
            _console.print(f"[yellow]{name}: {m['invalid_commands']} commands the simulator could not carry out ({kinds}; "
                           "`invalid_commands_by_kind` in the JSON)[/yellow]", highlight=False)
    sub = out["policies"].get(out.get("subject", ""))
    if sub is not None and out["subject_missed_half"]:
        _console.print(f"[yellow]{out['subject']} missed {100 * sub['deadline_miss_rate']:.0f}% of its chunks' deadlines: "
                       "the comparisons below set it against pools as slow as it is[/yellow]")
    if "matched_cost" in out:
        mc, ml = out["matched_cost"], out["matched_latency"]
        if not mc["pool_size"]:
            _console.print(f"{out['subject']}: no fixed-pool baseline ran, so no matched comparison (add them, e.g. "
                           "--policy all)", highlight=False)
        for b in mc["pool_size"]:
            matched = (f"matched latency (pool {ml['pool_size'][b]}) cost reduction {ml['cost_reduction_pct'][b]:.1f}%"
                       if ml["pool_size"][b] is not None else "matched latency: no pool up to the search's cap is as fast")
            _console.print(f"{out['subject']} vs {b}: matched cost (pool {mc['pool_size'][b]}) worst latency reduction "
                           f"{mc['worst_latency_reduction_pct'][b]:.1f}%; {matched}")
    if "oracle_gap_pct" in out.get("paper", {}):
        who = "the same controller" if out["subject"] == "turboserve" else "turboserve"
        _console.print(f"oracle gap (paper: {who} told the future, on cost) {out['paper']['oracle_gap_pct']:.1f}% "
                       f"(oracle worst chunk {out['paper']['oracle_worst_chunk_latency_s']:.2f} s)")
    _print_ablations(out)
    if "oracle_gap_pct" in out:
        o = out.get("oracle", {})
        note = f" (oracle at u*={o['u_target']:.2f}" + (")" if o.get("matched") else ", cannot match the subject's worst latency)") if o else ""
        _console.print(f"oracle gap at matched worst latency {out['oracle_gap_pct']:.1f}%{note}")
    slo = out.get("slo")
    if slo:
        fixed = slo["fixed_pool_cost"]
        ran = any(n != "turboserve-no-autoscale" for n in slo["pool_size"])
        _console.print(f"SLO (miss <= {100 * slo['miss_rate']:.2f}%, worst <= {slo['worst_s']:.2f} s): cheapest fixed pool "
                       + (f"{fixed:.1f} ({slo['fixed_pool_policy']}, pool {slo['pool_size'][slo['fixed_pool_policy']]})" if fixed is not None
                          else "none meets it" if ran else "not measured (no fixed-pool policy ran)")
                       + "; " + ", ".join(f"{n} no pool up to the search's cap meets it" if slo["pool_size"].get(n, 0) is None
                                          else f"{n} {c:.1f}{'' if slo['met'][n] else _missed(slo, n)}" for n, c in slo["cost"].items()))
        b = slo["elastic_bound"]
        if b["no_bound"]:  # a share of one GPU, or an SLO no pool meets: the percentage says nothing
            _console.print(f"SLO bound: {b['no_bound']}; no bound on what elasticity saves")
        else:
            _console.print(f"SLO bound: a perfectly elastic pool saves at most {b['saving_pct']:.1f}% against a fixed one here "
                           f"({b['elastic_gpus']:.1f} GPUs on average against {b['fixed_gpus']:.1f}, fluid model)")
    for name, d in out.get("decide_s", {}).items():
        if d["max"] >= SLOW_DECISION_S:
            _console.print(f"[yellow]{name}: decisions of up to {1000 * d['max']:.0f} ms ({1000 * d['mean']:.0f} ms on average, "
                           f"{d['calls']} calls; `decide_s` in the JSON): live, the control processor looks for a round "
                           f"every {SLOW_DECISION_S:g} s (CHUNKSERVE_CONTROL_TICK_S) and a longer decision holds back the "
                           "next[/yellow]", highlight=False)
    _console.print(f"wall {out['wall_s']:.1f} s")


def evaluate_cmd(
    split: Optional[str] = typer.Option(None, "--split", help="heldout (traces no setting was chosen on), launch (the third model's traces, which start empty; none chosen on either), outside (the fourth model's, an outside reviewer's; none chosen on either), probe (two launch families written later to probe the burst reserve: churn, periodic), review (the fifth model's, a second outside reviewer's: office, viral, batchy; none chosen on), surge (the sixth model's, a third outside reviewer's: failover, heavyvid, liveevent; none chosen on), steps (the seventh model's, a fourth outside reviewer's: plateau, waves, pareto, mixed, seeds 1 and 2; none chosen on), tenants (the eighth model's, a fifth outside reviewer's: desk, lobby, outage, seeds 1 and 2; none chosen on), wakes (the ninth model's, a sixth outside reviewer's: turns, nightshift, heavystate, lurkers, seeds 1 and 2; none chosen on), cohorts (the tenth model's, a seventh outside reviewer's: classes, creators; classes seeds 1, 2 and 3 (at --offset 150), creators seeds 1 and 4; none chosen on), rounds (the eleventh model's, the project's own, sessions in rounds: quiz, match, lesson, seeds 1 and 2; the SLO floor's reading of starts was chosen on a first version of it), tune (the five traces the settings were chosen on) or hour (13 one-hour traces from all six models, where every other split's are 20 minutes; none chosen on). Default: heldout, unless --trace is given."),
    trace: list[Path] = typer.Option([], "--trace", help="Your own trace CSV to evaluate instead of a split (repeatable): the same policies, comparisons and bars, named by its path."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write every comparison and its bars as JSON here."),
    only: Optional[str] = typer.Option(None, "--only", help="Comma-separated trace names of the split (e.g. flash/s0)."),
    slo_miss: float = typer.Option(_SLO.miss_rate, "--slo-miss-rate", min=0.0, max=0.999, help="SLO: largest share of chunks past their deadline."),
    slo_worst: float = typer.Option(_SLO.worst_s, "--slo-worst", min=0.001, max=86400.0, help="SLO: slowest chunk allowed, s."),
    jobs: int = typer.Option(0, "--jobs", "-j", min=0, help="Processes each comparison's runs use (0: one per CPU core)."),
    policy: list[str] = typer.Option([], "--policy", "-p", help="A plug-in (module:Name) to compare beside the split's policies, as TeleFuser is (repeatable or comma-separated)."),
    subject: Optional[str] = typer.Option(None, "--subject", help="The policy the bars and comparisons are about: a plug-in (module:Name, run beside the split's policies whether or not --policy gives it; or the name of one --policy gives) or a policy the split runs (default: turboserve; with another, turboserve is a peer and its ablations are not compared)."),
    profile: str = typer.Option("paper", "--profile", help="Latency profile: built-in name or JSON file."),
    gpu_type: Optional[str] = typer.Option(None, "--gpu-type", help="GPU type of fixed pools and of scale-out (default: b300, or a profile's only type)."),
    deadline: float = typer.Option(1.0, "--deadline", min=0.001, max=3600.0, help="Chunk deadline = media duration of a chunk, s."),
    boot: float = typer.Option(60.0, "--boot", min=0.0, max=86400.0, help="GPU boot time, s."),
) -> None:
    """Compare the policies on a split of trace families or on your own traces; print the quality bars per trace."""
    from processors.volatility import load_volatility_table
    from infra.sim.evaluate import (EVAL_POLICIES, HELDOUT, HOUR, LAUNCH, OUTSIDE_SPLIT, PROBE, REVIEW_SPLIT, STEPS_SPLIT,
                                     SURGE_SPLIT, TENANTS_SPLIT, TUNE, WAKES_SPLIT, COHORTS_SPLIT, ROUNDS_SPLIT, evaluate)
    from infra.sim.report import check_policies
    from infra.sim.simulator import SimConfig

    try:
        _writable(reads=trace, json=json_out)
        extra = [p for p in _expand(policy) if p not in EVAL_POLICIES]
        if subject is not None and ":" in subject and subject not in extra:  # a plug-in subject runs beside them
            extra.append(subject)
        if extra:
            check_policies(extra)
            if any(":" not in p for p in extra):
                raise ConfigError("--policy", f"{next(p for p in extra if ':' not in p)}: the split runs every built-in already; "
                                  "give a plug-in as module:Name", "command line")
        splits = {"heldout": HELDOUT, "launch": LAUNCH, "outside": OUTSIDE_SPLIT, "probe": PROBE, "review": REVIEW_SPLIT,
                  "surge": SURGE_SPLIT, "steps": STEPS_SPLIT, "tenants": TENANTS_SPLIT, "wakes": WAKES_SPLIT, "cohorts": COHORTS_SPLIT, "rounds": ROUNDS_SPLIT, "tune": TUNE, "hour": HOUR}
        if trace and split is not None:
            raise ConfigError("--trace", "give --split or --trace, not both", "command line")
        if trace and only is not None:
            raise ConfigError("--only", "picks traces of a split; with --trace, give only the files to evaluate", "command line")
        twice = next((str(p) for i, p in enumerate(trace) if str(p) in map(str, trace[:i])), None)
        if twice is not None:
            raise ConfigError("--trace", f"{twice} is given twice", "command line")
        split = split if split is not None or trace else "heldout"
        if split is not None and split not in splits:
            *names, last = splits
            raise ConfigError("--split", f"{split!r}: not a split (give {', '.join(names)} or {last})", "command line")
        model, gpu_type = _priced_pool(profile, gpu_type)
        specs = splits[split] if split is not None else tuple(_read_trace(p, model, gpu_type) for p in trace)
        if only is not None:
            want = {x.strip() for x in only.split(",")} - {""}
            if not want:  # an empty --only ran the whole split
                raise ConfigError("--only", "names no trace", "command line")
            unknown = sorted(want - {s.name for s in specs})
            if unknown:
                raise ConfigError("--only", f"not traces of the {split} split: {', '.join(unknown)} "
                                  f"(it has {', '.join(s.name for s in specs)})", "command line")
            specs = tuple(s for s in specs if s.name in want)
        vt, auto, slo = load_volatility_table(), AutoscalerConfig(gpu_type=gpu_type, boot_s=boot), Slo(slo_miss, slo_worst)
        cfg = SimConfig(gpu_type=gpu_type, boot_s=boot, deadline_s=deadline, warm_start=True)
        with _progress("evaluate", "evaluating") as tell:
            started = itertools.count(1)  # evaluate calls on_trace once per trace, in order

            def on_trace(name: str) -> None:  # a bar on a terminal; else a line as each trace starts, and the beat
                if _err.is_terminal:
                    tell(name)
                    return
                said = f"{name} ({next(started)} of {len(specs)})"
                _err.print(f"evaluate: {said}", highlight=False, soft_wrap=True)
                tell(said)

            out = evaluate(specs, model, cfg, _builtin_options(vt, auto),
                           {"table": vt, "autoscaler": auto}, slo, policies=(*EVAL_POLICIES, *extra),
                           on_trace=on_trace, jobs=_jobs(jobs),
                           on_runner=lambda r: _check_names(r, [*EVAL_POLICIES, *extra]), subject=subject)
    except ChunkserveError as exc:
        _fail(exc, "evaluate")
    try:  # the results first: nothing printed after them can lose them
        if json_out is not None:
            _write_output("json", json_out, json.dumps(out, indent=2, sort_keys=True) + "\n")
    except ChunkserveError as exc:
        _fail(exc, "evaluate")
    t = Table(title=f"{split} traces" if split is not None else "given traces")
    peers = list(dict.fromkeys(n for r in out.values() for n in r["bars"].get("peers", {})))
    who = next((r["comparison"]["subject"] for r in out.values()), "turboserve")  # the same on every trace
    for col in ("trace", "beats rr/lag/mag", "beats least-loaded-offload", "ablations cost more", "oracle gap %", "SLO saving %", "SLO saving bound %",
                f"{who} cost / worst chunk / worst resume s / deadline misses %", *(f"{n} cost / worst s" for n in peers)):
        t.add_column(col, overflow="fold")  # a long plug-in name wraps, not cut
    for name, r in out.items():
        b, p = r["bars"], r["comparison"]["paper"]
        abl = "-" if b["ablations_cost_more"] is None else str(b["ablations_cost_more"])  # none: turboserve is not the subject
        t.add_row(name, str(b["beats_paper_baselines"]), str(b["beats_least_loaded_offload"]), abl, _pct(p["oracle_gap_pct"]),
                  "misses SLO" if not b["slo_met"] else _pct(b["slo_saving_pct"]), _pct(b["slo_saving_bound_pct"]),
                  _cost_worst_resume(r["comparison"]["policies"].get(who), miss=True),
                  *(f"{x['cost']:.1f} / {x['worst_s']:.2f}" if (x := b.get("peers", {}).get(n)) else "-" for n in peers))
    _console.print(t)
    if who != "turboserve":
        _console.print(f"[yellow]{_NO_ABLATIONS}[/yellow]")
    if slow := [name for name, r in out.items() if r["comparison"].get("subject_missed_half")]:
        _console.print(f"[yellow]{who} missed half its chunks' deadlines or more on {len(slow)} trace(s) ({', '.join(slow)}): "
                       "the comparisons there set it against pools as slow as it is[/yellow]", highlight=False)
    for n in (who, *peers):  # a policy's commands the simulator could not carry out: its figures are of what it did carry out
        bad = {name: x["invalid_commands"] for name, r in out.items()
               if (x := r["comparison"]["policies"].get(n)) and x.get("invalid_commands")}
        if bad:
            _console.print(f"[yellow]{n}: commands the simulator could not carry out on {len(bad)} trace(s) "
                           f"({', '.join(f'{k} {v}' for k, v in bad.items())}; `invalid_commands_by_kind` in each "
                           "comparison's policies)[/yellow]", highlight=False)


def _cost_worst_resume(m: dict | None, miss: bool = False) -> str:
    """A policy's cost, worst chunk and worst resume (its restore included, which chunks leave
    out), and with ``miss`` the share of its chunks past their deadline, %."""
    if not m:
        return "-"
    resume = m.get("worst_resume_latency_s")  # None: no session resumed
    text = f"{m['cost']:.1f} / {m['worst_chunk_latency_s']:.2f} / {'-' if resume is None else f'{resume:.2f}'}"
    return f"{text} / {100.0 * m['deadline_miss_rate']:.2f}" if miss else text


def tune_cmd(
    output: Path = typer.Option(..., "-o", "--output", help="Volatility table JSON to write."),
    bound: float = typer.Option(2.5, "--bound", min=0.001, help="Latency bound on the worst chunk latency, s."),
    levels: str = typer.Option("1-10", "--levels", help="Levels to tune, e.g. 1-10 or 1,5,10 (every other level takes its nearest tuned neighbour's setting)."),
    seeds: int = typer.Option(1, "--seeds", min=1, help="Generated traces per level."),
    duration: float = typer.Option(900.0, "--duration", min=60.0, help="Length of each generated trace, s."),
    sessions: int = typer.Option(1200, "--sessions", min=1, help="Expected sessions per generated trace."),
    profile: str = typer.Option("paper", "--profile", help="Latency profile: built-in name or JSON file."),
    gpu_type: Optional[str] = typer.Option(None, "--gpu-type", help="GPU type of the pools tuned (default: b300, or a profile's only type)."),
) -> None:
    """Search u* and delta per volatility level by simulation; write the autoscaler's table."""
    from infra.sim.simulator import SimConfig
    from infra.sim.tracegen import GenConfig
    from infra.sim.tune import tune

    try:
        _writable(output=output)
        lv = _levels(levels)
        model = _profiles(profile)
        gpu_type = _pool_type(model, profile, gpu_type)
        with _progress("tune", "tuning") as tell:
            vt = tune(model, bound, lv, range(seeds), GenConfig(duration_s=duration, sessions=sessions),
                      SimConfig(warm_start=True, gpu_type=gpu_type), on_step=tell)
        _write_output("output", output, json.dumps(vt.to_json(), indent=2) + "\n")
    except ChunkserveError as exc:
        _fail(exc, "tune")
    for i in lv:
        u, d = vt.lookup(i)
        _console.print(f"level {i}: u*={u:.2f} delta={d:.2f}")
    _console.print(f"wrote {output}")


def _levels(spec: str) -> list[int]:

    try:
        if "-" in spec:
            a, b = spec.split("-", 1)
            out = list(range(int(a), int(b) + 1))
        else:
            out = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ConfigError("levels", "expected like 1-10 or 1,5,10", spec) from None
    if not out or any(not 1 <= x <= 10 for x in out):
        raise ConfigError("levels", "levels are 1..10", spec)
    return out


def register(app: typer.Typer) -> None:
    """Add ``trace gen``, ``simulate``, ``evaluate`` and ``tune`` to ``app``."""
    from infra.sim.trace import MAX_STATE_MB, MAX_T_S

    trace_app = typer.Typer(help="Session traces: CSV files with the header t_s,session_id,event[,state_mb] (events open, "
                            f"active, idle, close, sorted by t_s from 0; times up to {MAX_T_S:,.0f} s, states up to "
                            f"{MAX_STATE_MB:,} MB; docs/simulator.md gives every rule), replayed by "
                            "`chunkserve simulate` and `chunkserve evaluate --trace`.", no_args_is_help=True)
    trace_app.command("gen")(trace_gen)
    app.add_typer(trace_app, name="trace")
    app.command("simulate")(simulate_cmd)
    app.command("evaluate")(evaluate_cmd)
    app.command("tune")(tune_cmd)
