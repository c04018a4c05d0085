"""The comparisons (the paper's, the stated SLO, ablations, oracles), JSON and plot.

The paper's evaluation: the subject (turboserve unless told otherwise) against ``rr``,
``lag`` and ``mag``, fixed pools whose sessions stay pinned open to close, at matched cost
(the fixed pool whose cost is closest to the subject's: worst-chunk-latency reduction) and
at matched latency (the smallest fixed pool whose worst chunk is no worse: cost
reduction); the oracle is the same controller told each coming 30 s window's demand,
compared on cost. The offload baselines (``*-offload``) are stronger references, compared
the same way. Stricter, the latency-matched oracle (``oracle-autoscale``, run at falling
u* until its worst chunk is no worse than the subject's) gives ``oracle_gap_pct``.

At a stated SLO (:class:`processors.autoscaler.Slo`), each fixed-pool policy is sized with
hindsight (the smallest pool that meets it); turboserve and the oracle run configured with
the SLO (their knob is that configuration, nothing per trace); plug-ins are offered it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from processors.autoscaler import Slo
from processors.latency import LatencyModel
from processors.lifecycle import EventKind
from processors.oracles import future_active
from processors.policy import BUILTIN_POLICIES, FIXED_POOL, load_policy
from schemas.errors import ConfigError

from infra.sim.simulator import SimConfig, SimResult, Signals, signals_for, simulate
from infra.sim.trace import Trace

__all__ = ["Runner", "ALL_POLICIES", "PAPER_BASELINES", "OFFLOAD_BASELINES", "PEERS", "compare", "plot_timeline", "check_policies"]

PAPER_BASELINES = ("rr", "lag", "mag")
OFFLOAD_BASELINES = ("least-loaded-offload", "lag-offload", "mag-offload")
ABLATIONS = ("turboserve-no-migration", "turboserve-no-autoscale")
PEERS = ("infra.sim.peers:TeleFuser",)
ALL_POLICIES = (*PAPER_BASELINES, *OFFLOAD_BASELINES, "turboserve", *ABLATIONS, "oracle", "oracle-autoscale", *PEERS)
ORACLE_WINDOW_S = 30.0
SLO_CONFIGURED = ("turboserve", "turboserve-no-migration", "oracle")  # take the SLO as configuration
ORACLE_TARGETS = (1.0, 0.9, 0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5, 0.45, 0.4, 0.35, 0.3, 0.25, 0.2)


def _pct(worse: float, better: float) -> float:
    return 100.0 * (worse - better) / worse if worse > 0 else 0.0


def _peak_open(trace: Trace) -> int:
    """Most sessions open at once (what a pinned pool must hold)."""
    n = peak = 0
    for e in trace.events:
        if e.kind is EventKind.OPEN:
            n += 1
            peak = max(peak, n)
        elif e.kind is EventKind.CLOSE:
            n -= 1
    return peak


@dataclass
class Runner:
    """Runs policies on one trace with a cache keyed by (policy, pool size, options).

    ``options`` are per built-in name; ``offer`` is what every policy is offered (model,
    GPU type, boot time, table, autoscaler config, SLO): plug-ins take what they accept.
    """

    trace: Trace
    model: LatencyModel
    config: SimConfig = SimConfig()
    options: dict[str, Any] = field(default_factory=dict)
    on_run: Callable[[str], None] | None = None
    signals: Signals | None = None
    offer: dict[str, Any] = field(default_factory=dict)
    plugin_pool: int | None = None
    cache: dict[tuple[Any, ...], SimResult] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.signals is None:
            self.signals = signals_for(self.trace.events, self.config.tick_s, self.config.detector)
        self.future = future_active(self.trace.events, ORACLE_WINDOW_S)
        k = self.model[self.config.gpu_type].capacity
        first = max(self.future[: int(self.config.boot_s // ORACLE_WINDOW_S) + 1], default=0)
        # cold: elastic policies start with enough GPUs for the first boot time's demand;
        # warm: with none, and the pool their first decision asks for is ready at once
        self.elastic_start = 0 if self.config.warm_start else max(1, math.ceil(first / k))
        self.peak_pool = max(1, math.ceil(max(self.future, default=0) / k))
        self.pinned_pool = max(1, math.ceil(_peak_open(self.trace) / k))
        self.offer = {"model": self.model, "gpu_type": self.config.gpu_type, "boot_s": self.config.boot_s, **self.offer}

    def fixed(self, spec: str) -> bool:
        return spec in FIXED_POOL

    def run(self, spec: str, pool: int | None = None, **extra: Any) -> SimResult:
        """One run; fixed-pool policies default to the peak-provisioned pool, others start elastic."""
        if pool is None:
            if self.fixed(spec):
                pool = self.peak_pool
            elif spec in BUILTIN_POLICIES or self.plugin_pool is None:
                pool = self.elastic_start
            else:
                pool = self.plugin_pool
        key = (spec, pool, tuple(sorted(extra.items())))
        if key not in self.cache:
            opts: dict[str, Any] = {**extra}
            if spec in BUILTIN_POLICIES:
                opts = {"model": self.model, **self.options.get(spec, {}), **extra}
                if spec in ("oracle", "oracle-autoscale"):
                    opts.update(future=self.future)
                    opts["future_window_s" if spec == "oracle" else "window_s"] = ORACLE_WINDOW_S
                policy = load_policy(spec, **opts)
            else:
                policy = load_policy(spec, offer=self.offer, **{**self.options.get(spec, {}), **extra})
            if self.on_run is not None:
                self.on_run(f"{spec} (pool {pool})")
            self.cache[key] = simulate(policy, self.trace.events, self.model, replace(self.config, initial_gpus=pool), self.signals)
        return self.cache[key]

    @property
    def trace_end(self) -> float:
        q = self.config.epoch_s
        last = self.trace.duration_s
        return math.ceil(last / q - 1e-9) * q if q > 0 else last

    def cost_matched_pool(self, cost: float) -> int:
        """Fixed pool whose cost is closest to ``cost``."""
        p = self.model[self.config.gpu_type]
        per_gpu = p.cost_per_hour / 3600.0 * self.trace_end
        return max(1, round(cost / per_gpu)) if per_gpu > 0 else 1

    def smallest_pool(self, spec: str, ok: Callable[[SimResult], bool]) -> int | None:
        """Smallest fixed pool whose run satisfies ``ok`` (assumed monotone in the pool size);
        None when even 8x the peak pool does not. Starts from the runs already made, else
        from a guess (pinned pools need room for idle sessions), and gallops."""
        guess = self.pinned_pool if spec in PAPER_BASELINES else self.peak_pool
        cap = 8 * max(guess, self.peak_pool) + 8
        known = {k[1]: ok(r) for k, r in self.cache.items() if k[0] == spec and not k[2] and k[1] is not None}
        passing = [p for p, v in known.items() if v]
        hi = min(passing) if passing else None
        lo = max([p + 1 for p, v in known.items() if not v and (hi is None or p < hi)], default=1)
        step = 1
        if hi is None:  # gallop up to a passing pool: the answer is above the last failure
            hi = max(lo, guess)
            while not ok(self.run(spec, hi)):
                if hi >= cap:
                    return None
                lo, hi, step = hi + 1, min(cap, hi + step), step * 2
            step = 1 if lo == 1 else hi  # no failure seen below: gallop down first
        while lo < hi and step < hi:  # gallop down to a failing pool, then bisect
            probe = max(lo, hi - step)
            if not ok(self.run(spec, probe)):
                lo = probe + 1
                break
            hi, step = probe, step * 2
        while lo < hi:
            mid = (lo + hi) // 2
            if ok(self.run(spec, mid)):
                hi = mid
            else:
                lo = mid + 1
        return hi

    def latency_matched_pool(self, spec: str, worst: float) -> int:
        """Smallest fixed pool whose worst chunk latency is no worse than ``worst``."""
        pool = self.smallest_pool(spec, lambda r: r.worst_chunk_latency_s <= worst + 1e-9)
        return pool if pool is not None else 8 * max(self.pinned_pool, self.peak_pool) + 8


def compare(runner: Runner, policies: Sequence[str] = ALL_POLICIES, subject: str = "turboserve", slo: Slo = Slo()) -> dict[str, Any]:
    """Run ``policies``; when ``subject`` is among them, the comparisons against it."""
    tr = runner.trace
    fut = runner.future[:-1] or runner.future
    load = {"active_peak": max(fut, default=0), "active_mean": sum(fut) / len(fut) if fut else 0.0}  # per 30 s window
    out: dict[str, Any] = {"trace": {"sessions": tr.sessions, "events": len(tr.events), "duration_s": tr.duration_s, **load}, "policies": {}}
    fixed = [p for p in policies if runner.fixed(p)]
    pools: dict[str, int] = {}
    sub = runner.run(subject) if subject in policies else None
    if sub is not None:
        out["subject"] = sub.policy
        mc_pool = {b: runner.cost_matched_pool(sub.cost) for b in fixed}
        mc = {b: _pct(runner.run(b, p).worst_chunk_latency_s, sub.worst_chunk_latency_s) for b, p in mc_pool.items()}
        ml_pool = {b: runner.latency_matched_pool(b, sub.worst_chunk_latency_s) for b in fixed}
        ml = {b: _pct(runner.run(b, ml_pool[b]).cost, sub.cost) for b in fixed}
        out["matched_cost"] = {"pool_size": mc_pool, "worst_latency_reduction_pct": mc}
        out["matched_latency"] = {"pool_size": ml_pool, "cost_reduction_pct": ml}
        paper = [b for b in PAPER_BASELINES if b in fixed]
        out["paper"] = {
            "matched_cost": {"worst_latency_reduction_pct": {b: mc[b] for b in paper}, "pool_size": {b: mc_pool[b] for b in paper}},
            "matched_latency": {"cost_reduction_pct": {b: ml[b] for b in paper}, "pool_size": {b: ml_pool[b] for b in paper}},
        }
        pools = dict(mc_pool)
        if subject == "turboserve" and "turboserve-no-autoscale" in policies:
            pools["turboserve-no-autoscale"] = runner.latency_matched_pool("turboserve-no-autoscale", sub.worst_chunk_latency_s)
    for name in policies:
        if name == "oracle-autoscale" and sub is not None:
            u, res = _matched_oracle(runner, sub)
            out["oracle"] = {"u_target": u, "matched": res.worst_chunk_latency_s <= sub.worst_chunk_latency_s + 1e-9}
        else:
            res = runner.run(name, pools.get(name))
        out["policies"][res.policy] = {**res.metrics(), "chunks": res.chunks, "invalid_commands": res.invalid_commands}
    if sub is not None:
        pol = out["policies"]
        if "oracle" in policies:
            oc = runner.run("oracle")
            out["paper"]["oracle_gap_pct"] = 100.0 * (sub.cost - oc.cost) / oc.cost if oc.cost > 0 else 0.0
            out["paper"]["oracle_worst_chunk_latency_s"] = oc.worst_chunk_latency_s
        if "oracle-autoscale" in pol:
            oc2 = pol["oracle-autoscale"]["cost"]
            out["oracle_gap_pct"] = 100.0 * (sub.cost - oc2) / oc2 if oc2 > 0 else 0.0
        if subject == "turboserve":
            out["ablation_cost_increase_pct"] = {
                a: 100.0 * (pol[a]["cost"] - sub.cost) / sub.cost for a in ABLATIONS if a in pol and sub.cost > 0
            }
    out["slo"] = _slo(runner, policies, slo)
    return out


def _slo(runner: Runner, policies: Sequence[str], slo: Slo) -> dict[str, Any]:
    """Each policy's cost at the SLO: fixed pools sized with hindsight, elastic ones as run."""
    ok = lambda r: slo.met(r.deadline_miss_rate, r.worst_chunk_latency_s)  # noqa: E731
    met: dict[str, bool] = {}
    cost: dict[str, float] = {}
    pool_size: dict[str, int | None] = {}
    for name in policies:
        if name == "oracle-autoscale":
            continue  # reported at the subject's latency, not at the SLO
        if runner.fixed(name) or name == "turboserve-no-autoscale":
            pool = runner.smallest_pool(name, ok)
            res = runner.run(name, pool if pool is not None else 8 * max(runner.pinned_pool, runner.peak_pool) + 8)
            pool_size[res.policy] = pool
        elif name in SLO_CONFIGURED:
            res = runner.run(name, None, slo=slo)
        else:
            res = runner.run(name)
        met[res.policy] = ok(res)
        cost[res.policy] = res.cost
    fixed = {n: cost[n] for n in pool_size if met[n] and n != "turboserve-no-autoscale"}  # the baselines
    best = min(fixed, key=lambda n: fixed[n]) if fixed else None
    oracle = runner.run("oracle", None, slo=slo) if "oracle" in policies else None
    return {
        "miss_rate": slo.miss_rate,
        "worst_s": slo.worst_s,
        "met": met,
        "cost": cost,
        "pool_size": pool_size,
        "fixed_pool_cost": fixed[best] if best is not None else None,
        "fixed_pool_policy": best,
        "oracle_cost": oracle.cost if oracle is not None else None,
        "oracle_met": ok(oracle) if oracle is not None else False,
    }


def _matched_oracle(runner: Runner, ts: SimResult) -> tuple[float, SimResult]:
    """The offline oracle at the subject's latency: (u_target, run).

    ``oracle-autoscale`` knows the future executing count and boots ahead of it; its
    worst latency falls (and cost rises) as u_target falls. The highest u_target of the
    grid whose worst chunk is no worse than the subject's is found by bisection; when none
    matches, the one with the lowest worst latency tried is returned (marked unmatched).
    """
    ok = lambda u: runner.run("oracle-autoscale", None, u_target=u).worst_chunk_latency_s <= ts.worst_chunk_latency_s + 1e-9  # noqa: E731
    lo, hi = 0, len(ORACLE_TARGETS) - 1
    if not ok(ORACLE_TARGETS[hi]):
        tried = [r for k, r in runner.cache.items() if k[0] == "oracle-autoscale"]
        best = min(tried, key=lambda r: r.worst_chunk_latency_s)
        u = next(dict(k[2])["u_target"] for k, r in runner.cache.items() if r is best)
        return u, best
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(ORACLE_TARGETS[mid]):
            hi = mid
        else:
            lo = mid + 1
    u = ORACLE_TARGETS[lo]
    return u, runner.run("oracle-autoscale", None, u_target=u)


def timelines(runner: Runner, names: Sequence[str]) -> dict[str, dict[str, list[float]]]:
    """The timelines of the runs already made for ``names`` (their reported runs)."""
    out = {}
    for key, res in runner.cache.items():
        if key[0] in names and res.policy not in out:
            out[res.policy] = res.timeline
    return out


def plot_timeline(series: dict[str, dict[str, list[float]]], window_s: float, path: str) -> None:
    """Paper-style timeline: GPUs, active sessions, migrations per window, worst latency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("gpus", "GPUs"), ("active", "active sessions"), ("migrations", "migrations / window"), ("worst_latency_s", "worst chunk latency (s)"))
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 9), sharex=True)
    for ax, (key, label) in zip(axes, panels):
        for name, tl in series.items():
            xs = [i * window_s / 60.0 for i in range(len(tl[key]))]
            ax.step(xs, tl[key], where="post", label=name, linewidth=1)
        ax.set_ylabel(label)
    axes[-1].set_xlabel("time (min)")
    axes[0].legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def check_policies(specs: Sequence[str]) -> None:
    """Reject unknown names early (module:Name is resolved when run)."""
    for s in specs:
        if s not in BUILTIN_POLICIES and ":" not in s:
            raise ConfigError("policy", f"unknown policy (built-ins: {', '.join(BUILTIN_POLICIES)}, all, or module:Name)", s)
