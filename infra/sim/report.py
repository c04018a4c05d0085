"""The comparisons (the paper's, the stated SLO, ablations, oracles), JSON and plot.

The paper's evaluation: the subject (turboserve unless told otherwise) against ``rr``,
``lag`` and ``mag``, fixed pools whose sessions stay pinned open to close, at matched cost
(the fixed pool whose cost is closest to the subject's: worst-chunk-latency reduction) and
at matched latency (the smallest fixed pool whose worst chunk is no worse: cost
reduction); the oracle is the same controller told the coming boot time's peak demand (read in 30 s windows),
compared on cost. The offload baselines (``*-offload``) are stronger references, compared
the same way. Stricter, the latency-matched oracle (``oracle-autoscale``, run at falling
u* until its worst chunk is no worse than the subject's) gives ``oracle_gap_pct``.

At a stated SLO (:class:`processors.autoscaler.Slo`), each fixed-pool policy is sized with
hindsight (the smallest pool that meets it); turboserve and the oracle run configured with
the SLO (their knob is that configuration, nothing per trace); a plug-in's run at the SLO
is offered it (its ordinary run, like turboserve's, is not).
"""

from __future__ import annotations

import itertools
import math
from itertools import chain
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Sequence

from processors.autoscaler import Slo
from processors.latency import LatencyModel
from processors.lifecycle import SessionEvent, SessionState, moves
from processors.oracles import future_active
from processors.policy import BUILTIN_POLICIES, FIXED_POOL, accepts, load_policy
from schemas.errors import ConfigError

from infra.sim.guide import MissGuide, miss_guide
from infra.sim.simulator import SimConfig, SimResult, Signals, Stop, chunk_bound, signals_for, simulate
from infra.sim.trace import Trace

__all__ = ["Runner", "ALL_POLICIES", "PAPER_BASELINES", "OFFLOAD_BASELINES", "PEERS", "compare", "plot_timeline", "check_policies", "resolve_subject"]

PAPER_BASELINES = ("rr", "lag", "mag")
OFFLOAD_BASELINES = ("least-loaded-offload", "lag-offload", "mag-offload")
ABLATIONS = ("turboserve-no-migration", "turboserve-no-autoscale")
PEERS = ("infra.sim.peers:TeleFuser",)
# a peer asked for by the name its row has (only TeleFuser runs in `all`)
PEER_NAMES = {"telefuser": "infra.sim.peers:TeleFuser", "kubernetes-hpa": "infra.sim.peers:KubernetesHPA",
              "ray-serve": "infra.sim.peers:RayServe", "ray-serve-auto": "infra.sim.peers:RayServeAuto"}
ALL_POLICIES = (*PAPER_BASELINES, *OFFLOAD_BASELINES, "turboserve", *ABLATIONS, "oracle", "oracle-autoscale", *PEERS)
ORACLE_WINDOW_S = 30.0
SLO_CONFIGURED = ("turboserve", "turboserve-no-migration", "oracle")  # take the SLO as configuration
MISSED_HALF = 0.5  # a subject missing this share of its chunks' deadlines or more is flagged
ORACLE_TARGETS = (1.0, 0.9, 0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5, 0.45, 0.4, 0.35, 0.3, 0.25, 0.2)


@dataclass(frozen=True, slots=True)
class Bound:
    """What a run must meet: no chunk slower than ``worst_s`` and, when set, at most
    ``miss_rate`` of chunks past their deadline (:meth:`Slo.met`'s tolerances)."""

    worst_s: float
    miss_rate: float | None = None

    def ok(self, r: SimResult) -> bool:
        return r.worst_chunk_latency_s <= self.worst_s + 1e-9 and (self.miss_rate is None or r.deadline_miss_rate <= self.miss_rate + 1e-12)


def _pct(worse: float, better: float) -> float:
    return 100.0 * (worse - better) / worse if worse > 0 else 0.0


def _first_instant_executing(events: Sequence[SessionEvent]) -> int:
    """Sessions executing once the trace's first instant's events are in."""
    first = itertools.takewhile(lambda ev: ev.t <= events[0].t, events)
    states = {ev.session_id: now for ev, _, now in moves(first)}
    return sum(st is SessionState.EXECUTION for st in states.values())


def _peak_open(trace: Trace) -> int:
    """Most sessions open at once (what a pinned pool must hold), each session moved by the
    lifecycle table: open from its first event until its close."""
    n = peak = 0
    for _, was, now in moves(trace.events):
        n += (now is not SessionState.TERMINATED) - (was is not None and was is not SessionState.TERMINATED)
        peak = max(peak, n)
    return peak


@dataclass
class Runner:
    """Runs policies on one trace with a cache keyed by (policy, pool size, options).

    ``options`` are per built-in name; ``offer`` is what a plug-in is offered (model, GPU
    type, boot time, table, autoscaler config): it takes what it accepts. The SLO is never
    in it: a plug-in is offered the SLO only in its run at the SLO (``run(spec, slo=...)``),
    as turboserve is configured with it only there.
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
    partial: dict[tuple[Any, ...], SimResult] = field(default_factory=dict)  # runs a Stop ended
    _rising: bool | None = field(default=None, repr=False)  # the pool type's latency rises with every session
    _built: dict[str, Any] = field(default_factory=dict, repr=False)  # plug-ins built to read their name, kept for their run
    _takes_slo: dict[str, bool] = field(default_factory=dict, repr=False)
    found: dict[tuple[Any, ...], int | None] = field(default_factory=dict)  # the searches' answers
    reported: dict[str, SimResult] = field(default_factory=dict)  # per spec, its run in the table and JSON
    _guide: MissGuide | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.signals is None:
            self.signals = signals_for(self.trace.events, self.config.tick_s, self.config.detector, self.config.warm_start)
        self.future = future_active(self.trace.events, ORACLE_WINDOW_S)
        k = self.model[self.config.gpu_type].capacity
        # cold: elastic policies open with enough GPUs for the first boot time's demand at
        # full capacity; warm (a trace that starts mid-stream): with none, and the pool their
        # first decision asks for is ready at once; a launch (a warm trace whose first instant
        # holds fewer sessions than one GPU): with enough for the first two boot times' demand
        # at full capacity (a reactive policy's first boots, decided on what the first boot
        # time shows, land by then), as a fixed pool opens sized for the whole run
        warm = self.config.warm_start
        launch = warm and _first_instant_executing(self.trace.events) < k
        first = max(self.future[: int((2 if launch else 1) * self.config.boot_s // ORACLE_WINDOW_S) + 1], default=0)
        self.elastic_start = 0 if warm and not launch else max(1, math.ceil(first / k))
        self.peak_pool = max(1, math.ceil(max(self.future, default=0) / k))
        self.pinned_pool = max(1, math.ceil(_peak_open(self.trace) / k))
        self.chunk_bound = chunk_bound(self.trace.events, self.model, self.config.round_s)
        offer = {k: v for k, v in self.offer.items() if k != "slo"}  # offered per run, at the SLO only
        self.offer = {"model": self.model, "gpu_type": self.config.gpu_type, "boot_s": self.config.boot_s, **offer}

    @property
    def guide(self) -> MissGuide:
        """Where the SLO searches aim (built on first use)."""
        if self._guide is None:
            self._guide = miss_guide(self.trace.events, self.model[self.config.gpu_type], self.config.deadline_s)
        return self._guide

    def fixed(self, spec: str) -> bool:
        return spec in FIXED_POOL

    def twin(self, spec: str) -> str | None:
        """The fixed-pool policy whose runs are ``spec``'s, if any: on pools of one GPU type
        whose latency rises with every session, least predicted latency (``lag-offload``)
        and fewest sessions (``least-loaded-offload``) rank GPUs alike (ties by id), so they
        place every session alike."""
        other = {"lag-offload": "least-loaded-offload", "least-loaded-offload": "lag-offload"}.get(spec)
        if other is None:
            return None
        if self._rising is None:
            p = self.model[self.config.gpu_type]
            self._rising = all(p.latency(n) < p.latency(n + 1) for n in range(p.capacity))
        return other if self._rising else None

    def _alike(self, spec: str, key: tuple[Any, ...]) -> tuple[tuple[Any, ...], ...]:
        """``key`` and, when ``spec`` has a twin, the twin's key for the same run."""
        other = self.twin(spec)
        return (key,) if other is None else (key, (other, *key[1:]))

    def run(self, spec: str, pool: int | None = None, stop: Stop | None = None, **extra: Any) -> SimResult:
        """One run; fixed-pool policies default to the peak-provisioned pool, others start elastic.
        With ``stop`` the run may end early (``complete`` False; not cached as a result)."""
        key = self._key(spec, pool, extra)
        pool = key[1]
        made = next((k for k in self._alike(spec, key) if k in self.cache), None)
        if made is not None and made != key:
            self.cache[key] = replace(self.cache[made], policy=spec)  # the twin's run, under its own name
        if key not in self.cache:
            built = self._built.pop(spec, None) if not key[2] else None
            policy = built if built is not None else self._build(spec, dict(key[2]))
            if self.on_run is not None:
                self.on_run(f"{spec} (pool {pool})")
            res = simulate(policy, self.trace.events, self.model, replace(self.config, initial_gpus=pool), self.signals, stop=stop)
            if not res.complete:
                self.partial[key] = res
                return res
            self.partial.pop(key, None)
            self.cache[key] = res
        return self.cache[key]

    def _build(self, spec: str, extra: dict[str, Any]) -> Any:
        """``spec``'s policy for a run with ``extra``; a plug-in is offered ``slo`` (when in
        ``extra``) with the rest of :attr:`offer`, and takes it only if it accepts it."""
        if spec not in BUILTIN_POLICIES:
            offer = {**self.offer, "slo": extra["slo"]} if "slo" in extra else self.offer
            own = {k: v for k, v in extra.items() if k != "slo"}
            return load_policy(spec, offer=offer, **{**self.options.get(spec, {}), **own})
        opts = {"model": self.model, **self.options.get(spec, {}), **extra}
        if spec in ("oracle", "oracle-autoscale"):
            opts.update(future=self.future)
            opts["future_window_s" if spec == "oracle" else "window_s"] = ORACLE_WINDOW_S
        return load_policy(spec, **opts)

    def name_of(self, spec: str) -> Any:
        """A plug-in's ``name``, read from the instance built for its ordinary run (which
        that run then uses: a plug-in is not built once more just to be named)."""
        if spec not in self._built:
            self._built[spec] = self._build(spec, {})
        return getattr(self._built[spec], "name", None)

    def label(self, spec: str) -> str:
        """The name ``spec``'s results are keyed by, from any run of it already made."""
        made = chain(self.cache.items(), self.partial.items())
        return next((r.policy for k, r in made if k[0] == spec), None) or self.run(spec).policy

    @property
    def trace_end(self) -> float:
        q = self.config.round_s
        last = self.trace.duration_s
        return math.ceil(last / q - 1e-9) * q if q > 0 else last

    def cost_matched_pool(self, cost: float) -> int:
        """Fixed pool whose cost is closest to ``cost``."""
        p = self.model[self.config.gpu_type]
        per_gpu = p.cost_per_hour / 3600.0 * self.trace_end
        return max(1, round(cost / per_gpu)) if per_gpu > 0 else 1

    def _key(self, spec: str, pool: int | None, extra: dict[str, Any]) -> tuple[Any, ...]:
        if pool is None:
            if self.fixed(spec) or spec == "turboserve-no-autoscale":  # the ablation runs a fixed pool too
                pool = self.peak_pool
            elif spec in BUILTIN_POLICIES or spec in PEERS or self.plugin_pool is None:  # --pool is for the user's own
                pool = self.elastic_start
            else:
                pool = self.plugin_pool
        if spec not in BUILTIN_POLICIES and "slo" in extra and not self._takes(spec):
            extra = {k: v for k, v in extra.items() if k != "slo"}  # not offered what it does not take: the same run
        return (spec, pool, tuple(sorted(extra.items())))

    def _takes(self, spec: str) -> bool:
        """Whether the plug-in ``spec`` accepts the SLO it is offered in its run at the SLO."""
        if spec not in self._takes_slo:
            self._takes_slo[spec] = accepts(spec, "slo")
        return self._takes_slo[spec]

    def check(self, spec: str, pool: int | None, bound: Bound, **extra: Any) -> bool:
        """Whether the run meets ``bound``; a run that breaks it is stopped there (and a
        stopped run is remembered as failing the bounds it already breaks)."""
        key = self._key(spec, pool, extra)
        for k in self._alike(spec, key):
            full = self.cache.get(k)
            if full is not None:
                return bound.ok(full)
            part = self.partial.get(k)
            if part is not None and self._breaks(part, bound):
                return False
        res = self.run(spec, pool, stop=self._stop(bound), **extra)
        return res.complete and bound.ok(res)

    def _stop(self, bound: Bound) -> Stop:
        rate = bound.miss_rate + 1e-12 if bound.miss_rate is not None else math.inf
        return Stop(bound.worst_s + 1e-9, rate, self.chunk_bound if bound.miss_rate is not None else None)

    def _breaks(self, part: SimResult, bound: Bound) -> bool:
        """Whether a stopped run already breaks ``bound`` (its figures only grow)."""
        stop = self._stop(bound)
        return stop.broken(part.worst_chunk_latency_s, part.missed_chunks, part.chunks, part.stopped_at)

    def _guess(self, spec: str) -> int:
        """A first pool for ``spec``'s search: pinned pools need room for idle sessions."""
        return self.pinned_pool if spec in PAPER_BASELINES else self.peak_pool

    def search_cap(self, spec: str) -> int:
        """The largest pool a search for ``spec`` answers: 8x the peak pool (for the pinned
        paper baselines 8x the pool holding every open session, when larger), plus 8."""
        return 8 * max(self._guess(spec), self.peak_pool) + 8

    def _known(self, spec: str, bound: Bound) -> dict[int, bool]:
        """Pool sizes already run for ``spec`` (no options): whether each meets ``bound``."""
        known: dict[int, bool] = {}
        for key, r in self.cache.items():
            if key[0] == spec and not key[2] and key[1] is not None:
                known[key[1]] = bound.ok(r)
        for key, r in self.partial.items():
            if key[0] == spec and not key[2] and key[1] is not None and key[1] not in known and self._breaks(r, bound):
                known[key[1]] = False
        return known

    def smallest_pool(self, spec: str, bound: Bound, hint: int | None = None) -> int | None:
        """Smallest fixed pool whose run meets ``bound`` (bracketed as if monotone in the pool
        size, then every pool below the bracket's answer, from the floor, checked); None when
        no pool up to :meth:`search_cap` does (a passing pool past the cap, run for
        another comparison, is no answer). Starts from the runs already made and ``hint``
        (another policy's answer), then probes where the nearest full run aims
        (:meth:`_aim`; twice in a row at most, then it halves the bracket), galloping up
        from the largest failing pool while none passes (from a guess when nothing is
        known). Failing runs stop at their first breach. The answer is remembered (a
        search made in another process is not made again from runs another task may have
        stopped differently)."""
        key = ("pool", spec, bound, hint)
        if key not in self.found:
            self.found[key] = self._smallest(spec, bound, hint)
        return self.found[key]

    def _smallest(self, spec: str, bound: Bound, hint: int | None) -> int | None:
        """:meth:`_bracket`'s answer, then the first pool from the floor up that meets the
        bound too: the outcome is not monotone in the pool size (a pool whose worst chunk sits
        near the bound passes at one size and fails at a larger one; an outside run found
        ``lag`` matched at 69 GPUs where 26 met the bound), and the answer is the smallest pool
        that meets it. The floor is the pool that holds the peak's executing sessions (for the
        pinned baselines, every open session): below it, sessions wait for a slot at the peak.
        Failing runs stop at their first breach."""
        hi = self._bracket(spec, bound, hint)
        if hi is None:
            return None
        return next((p for p in range(self._guess(spec), hi) if self.check(spec, p, bound)), hi)

    def _bracket(self, spec: str, bound: Bound, hint: int | None) -> int | None:
        cap = self.search_cap(spec)
        known = self._known(spec, bound)
        if any(not ok for p, ok in known.items() if p >= cap):
            return None  # failing at or past the cap, it fails at the cap
        known = {p: ok for p, ok in known.items() if p <= cap}
        passing = [p for p, v in known.items() if v]
        hi = min(passing) if passing else None
        lo = max([p for p, v in known.items() if not v and (hi is None or p < hi)], default=0)  # 0: none fails yet
        if hint is not None and not (lo < hint <= cap and (hi is None or hint < hi)):
            hint = None
        up, aimed = 1, 0  # the gallop's next step; aimed probes in a row (every third halves instead)
        while hi is None or hi - lo > 1:
            if hint is not None:
                p, hint, aimed = hint, None, 0
            elif aimed < 2 and (aim := self._aim(spec, bound, hi)) is not None:
                # where the nearest full run says, within reach of the bracket
                p, aimed = max(lo + 1, min(aim, hi - 1 if hi is not None else min(cap, max(lo + up, lo * 3 // 2)))), aimed + 1
            elif hi is None:  # gallop up from the last failure (or the guess) to a passing pool
                p, aimed = min(cap, lo + up) if lo else self._guess(spec), 0
            else:
                p, aimed = (lo + hi) // 2, 0
            if self.check(spec, p, bound):
                hi = p
            elif p >= cap:
                return None
            else:
                lo, up = p, up * 2
        return hi

    def _aim(self, spec: str, bound: Bound, hi: int | None) -> int | None:
        """The pool a latency search aims at: a fixed pool's worst chunk is a first chunk
        waiting out a running chunk and then running its own at the most sessions per GPU
        it meets, l(n - 1) + l(n), and that most n falls about as 1 / pool (measured:
        n x pool within 2% over pools 21-45 for least-loaded-offload on a one-hour
        trace, within 13-18% for rr and mag-offload); so the full run nearest the answer (the
        smallest passing one, else the largest run) gives n x pool, and the aim is the pool
        where n is the bound's. None when no full run of ``spec`` is known."""
        full = {k[1]: r for k, r in self.cache.items() if k[0] == spec and not k[2] and k[1] is not None}
        if not full:
            return None
        ref = hi if hi in full else max(full)
        have, want = self._load_at(full[ref].worst_chunk_latency_s), self._load_at(bound.worst_s)
        return max(1, math.ceil(have * ref / want - 1e-9))

    def _load_at(self, worst: float) -> float:
        """n (interpolated, at least 1) where l(n - 1) + l(n) = ``worst`` on the pool's GPU type."""
        p = self.model[self.config.gpu_type]
        return p.first_chunk_load(worst, max(4 * p.capacity, len(p.curve), 64))

    def slo_pool(self, spec: str, bound: Bound, start: int | None = None) -> int | None:
        """Smallest fixed pool whose run meets ``bound`` (an SLO: a miss rate), searched
        from ``start`` (else where :class:`MissGuide` aims), each probe aiming where the
        guide calibrated on the run before it says (:meth:`_slo_aim`); None when no pool up
        to :meth:`search_cap` does. The probes depend only on ``spec``, ``bound``,
        ``start`` and their own runs, never on which runs other searches made (those only
        make probes free: a failing run is read where the bound's stop would have ended it),
        so the answer is the same in whatever process or order the searches run; as
        :meth:`smallest_pool`, it assumes the outcome monotone in the pool size. The answer
        is remembered."""
        key = ("slo", spec, bound, start)
        if key in self.found:
            return self.found[key]
        cap, target = self.search_cap(spec), bound.miss_rate if bound.miss_rate is not None else 1.0
        lo, hi, up, down, failed = 0, None, 1, 1, 0  # lo fails, hi passes (0 and None: not yet known)
        p = start if start is not None else self.guide.pool_for(target, cap)
        while True:
            p = max(lo + 1, min(p, cap if hi is None else hi - 1))
            if hi is not None and p >= hi:
                break
            if self.check(spec, p, bound):
                hi, failed = p, 0
                if p - 1 <= lo:
                    break
                aim = self._slo_aim(spec, p, bound, target, cap)
                if aim is not None and lo < aim < p:  # below it, where the guide says
                    p = aim
                else:  # else step down: 1, 2, 4 ...
                    p, down = p - down, down * 2
            else:
                lo, failed = p, failed + 1
                if p >= cap:
                    break
                aim = self._slo_aim(spec, p, bound, target, cap) if failed <= 2 else None
                if aim is not None and aim > p:  # above it, where the guide says
                    p = aim
                elif hi is None:  # gallop up: 1, 2, 4 ... past the last failure
                    p, up = p + up, up * 2
                else:  # the aims fell short: the next pool, then halve what is left
                    p = p + 1 if failed == 1 else (lo + hi) // 2
        self.found[key] = hi
        return hi

    def _slo_aim(self, spec: str, pool: int, bound: Bound, target: float, cap: int) -> int | None:
        """The pool the guide aims at after ``spec``'s run at ``pool``: calibrated on that
        run's miss rate (a passing run's, or a failing one's at its last window start before
        the bound's stop would have ended it), the guide's pool for that rate over ``pool``
        is the share of the pool the policy puts to use, and the aim is the guide's pool for
        the target over that share. None when the run missed nothing yet."""
        key = self._key(spec, pool, {})
        res = next((r for k in self._alike(spec, key) if (r := self.cache.get(k)) is not None), None)
        if res is None or not bound.ok(res):
            res = res or next((r for k in self._alike(spec, key) if (r := self.partial.get(k)) is not None), None)
            if res is None:
                return None
            stop = self._stop(bound)
            before = next((i for i, x in enumerate(res.samples) if stop.broken(*x[1:], x[0])), len(res.samples)) - 1
            missed, chunks = res.samples[before][2:] if before >= 0 else (0, 0)
        else:
            missed, chunks = res.missed_chunks, res.chunks
        if missed <= 0 or chunks <= 0:
            return None
        share = self.guide.pool_at(missed / chunks, cap) / pool
        return math.floor(self.guide.pool_at(target, cap) / share + 0.5)

    def latency_matched_pool(self, spec: str, worst: float, hint: int | None = None) -> int | None:
        """Smallest fixed pool whose worst chunk latency is no worse than ``worst``; None
        when no pool up to the search's cap (:meth:`search_cap`) is."""
        return self.smallest_pool(spec, Bound(worst), hint)


def compare(runner: Runner, policies: Sequence[str] = ALL_POLICIES, subject: str = "turboserve", slo: Slo = Slo(),
            jobs: int = 1, _slo_subject: bool = True, _slo_searches: bool = True) -> dict[str, Any]:
    """Run ``policies``; when ``subject`` is among them, the comparisons against it.
    ``jobs`` > 1 makes the runs in that many processes first (same runs, same figures)."""
    for name in policies:  # a plug-in's own run first: one that raises stops the run before the rest are made
        if name not in BUILTIN_POLICIES and name != subject:
            runner.run(name)
    if jobs > 1 and subject in policies:
        _prefetch(runner, policies, subject, slo, jobs)
    tr = runner.trace
    fut = runner.future[:-1] or runner.future
    load = {"active_peak": max(fut, default=0), "active_mean": sum(fut) / len(fut) if fut else 0.0}  # per 30 s window
    out: dict[str, Any] = {"trace": {"sessions": tr.sessions, "events": len(tr.events), "duration_s": tr.duration_s, **load,
                                     "opening_gpus": runner.elastic_start}, "policies": {}}
    fixed = [p for p in policies if runner.fixed(p) and p != subject]  # a fixed-pool subject is not its own baseline
    pools: dict[str, int] = {}
    sub = runner.run(subject) if subject in policies else None
    if sub is not None:
        out["subject"] = sub.policy
        # flagged: its matched-latency comparisons are against pools as slow as it is
        out["subject_missed_half"] = sub.deadline_miss_rate >= MISSED_HALF
        mc_pool = {b: runner.cost_matched_pool(sub.cost) for b in fixed}
        mc = {b: _pct(runner.run(b, p).worst_chunk_latency_s, sub.worst_chunk_latency_s) for b, p in mc_pool.items()}
        ml_pool: dict[str, int | None] = {}
        for b in fixed:
            ml_pool[b] = runner.latency_matched_pool(b, sub.worst_chunk_latency_s, _hint(b, ml_pool))
        # null: no pool up to the cap is as fast as the subject (no matched-latency cost to compare)
        ml = {b: _pct(runner.run(b, p).cost, sub.cost) if p is not None else None for b, p in ml_pool.items()}
        out["matched_cost"] = {"pool_size": mc_pool, "worst_latency_reduction_pct": mc}
        out["matched_latency"] = {"pool_size": ml_pool, "cost_reduction_pct": ml}
        paper = [b for b in PAPER_BASELINES if b in fixed]
        out["paper"] = {
            "matched_cost": {"worst_latency_reduction_pct": {b: mc[b] for b in paper}, "pool_size": {b: mc_pool[b] for b in paper}},
            "matched_latency": {"cost_reduction_pct": {b: ml[b] for b in paper}, "pool_size": {b: ml_pool[b] for b in paper}},
        }
        pools: dict[str, int | None] = dict(mc_pool)
        unmatched: set[str] = set()
        if subject == "turboserve" and "turboserve-no-autoscale" in policies:
            pools["turboserve-no-autoscale"] = runner.latency_matched_pool("turboserve-no-autoscale", sub.worst_chunk_latency_s,
                                                                           _hint("turboserve-no-autoscale", ml_pool))
            if pools["turboserve-no-autoscale"] is None:  # no fixed pool up to the cap is as fast: shown at its peak pool
                unmatched.add("turboserve-no-autoscale")
    for name in policies:
        if name == "oracle-autoscale" and sub is not None:
            u, res = _matched_oracle(runner, sub)
            out["oracle"] = {"u_target": u, "matched": res.worst_chunk_latency_s <= sub.worst_chunk_latency_s + 1e-9}
        else:
            res = runner.run(name, pools.get(name))
        runner.reported[name] = res  # by its spec, as the names asked for
        out["policies"][res.policy] = {**res.metrics(), "chunks": res.chunks, "invalid_commands": res.invalid_commands,
                                       "invalid_commands_by_kind": res.invalid_by_kind}
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
                a: None if a in unmatched else 100.0 * (pol[a]["cost"] - sub.cost) / sub.cost for a in ABLATIONS if a in pol and sub.cost > 0
            }
        else:  # the ablations are turboserve's: null, as evaluate's bar is (the key was left out)
            out["ablation_cost_increase_pct"] = None
    out["slo"] = _slo(runner, policies if _slo_subject else [p for p in policies if p != subject], slo, _slo_searches)
    return out


_SHARED: Runner | None = None  # the runner forked workers inherit
_BASE: tuple[dict[Any, SimResult], dict[Any, SimResult], dict[Any, int | None]] | None = None  # its runs at the fork


def _groups(runner: Runner, policies: Sequence[str], subject: str) -> list[tuple[str, list[str]]]:
    """Tasks whose runs do not depend on each other's, about biggest first (a process pool
    hands them out in this order, so the small ones fill in at the end): the SLO searches,
    two chains (``slo``: each search starts from the answer before it in its chain); the
    pinned fixed pools (their searches share hints) and the offload ones with the
    no-autoscale ablation (its latency search starts from their answers), each group's
    runs but the SLO searches (``compare``); the oracle, the no-migration ablation, ``[]``
    (the subject's run at the SLO), then each other policy."""
    fixed = [p for p in policies if (runner.fixed(p) or p == "turboserve-no-autoscale") and p != subject]
    pinned = [p for p in fixed if p in PAPER_BASELINES]
    offload = [p for p in fixed if p not in PAPER_BASELINES]
    big = ("oracle", "turboserve-no-migration")
    rest = [p for p in policies if p not in fixed and p != subject]
    at_slo = subject in SLO_CONFIGURED or subject not in BUILTIN_POLICIES
    return ([("slo", chain) for chain in _slo_chains(runner, policies)] + [("compare", g) for g in (pinned, offload) if g]
            + [("compare", [p]) for p in big if p in rest] + ([("compare", [])] if at_slo else [])
            + [("compare", [p]) for p in sorted(rest, key=lambda p: p != "oracle-autoscale") if p not in big])


_Made = tuple[dict[tuple[Any, ...], SimResult], dict[tuple[Any, ...], SimResult], dict[tuple[Any, ...], int | None]]


def _part(args: tuple[tuple[str, list[str]], str, Slo, _Made | None]) -> _Made:
    (task, names), subject, slo, since = args
    runner, base = _SHARED, _BASE
    assert runner is not None and base is not None
    runner.on_run = None
    # each task starts from the runs made before the fork (and the subject's, made after it:
    # ``since``), not from those of the tasks this process ran before it: a search starts
    # from the runs already made, and the one-process comparison makes the latency searches
    # before any SLO search
    runner.cache, runner.partial, runner.found = dict(base[0]), dict(base[1]), dict(base[2])
    if since is not None:
        runner.cache.update(since[0])
        runner.partial.update(since[1])
        runner.found.update(since[2])
    cache, partial, found = set(runner.cache), set(runner.partial), set(runner.found)
    if task == "slo":  # the fixed pools' SLO searches, as _slo makes them
        bound = Bound(slo.worst_s, slo.miss_rate)
        for name in names:
            runner.slo_pool(name, bound, _slo_start(runner, name, names, bound))
    elif names:  # the subject's own SLO run is the task of its own (no names)
        compare(runner, [subject, *names], subject, slo, _slo_subject=False, _slo_searches=False)
    else:
        compare(runner, [subject], subject, slo)
    return ({k: v for k, v in runner.cache.items() if k not in cache}, {k: v for k, v in runner.partial.items() if k not in partial},
            {k: v for k, v in runner.found.items() if k not in found})


def _prefetch(runner: Runner, policies: Sequence[str], subject: str, slo: Slo, jobs: int) -> None:
    """Make the runs ``compare`` needs in ``jobs`` forked processes, one group of policies
    per task (each task makes exactly the runs the sequential comparison makes for it). The
    SLO searches need nothing of the subject's run: they start at once, while this process
    makes the subject's run the other tasks start from."""
    global _SHARED, _BASE
    groups = _groups(runner, policies, subject)
    if runner.on_run is not None:
        runner.on_run(f"{len(groups)} groups of policies in {jobs} processes")
    _SHARED, _BASE = runner, (dict(runner.cache), dict(runner.partial), dict(runner.found))
    try:
        with ProcessPoolExecutor(min(jobs, len(groups)) or 1, mp_context=multiprocessing.get_context("fork")) as pool:
            early = [pool.submit(_part, (g, subject, slo, None)) for g in groups if g[0] == "slo"]
            runner.run(subject)  # the workers forked above: they have the runs from before it
            base = _BASE
            since = ({k: v for k, v in runner.cache.items() if k not in base[0]},
                     {k: v for k, v in runner.partial.items() if k not in base[1]},
                     {k: v for k, v in runner.found.items() if k not in base[2]})
            late = [pool.submit(_part, (g, subject, slo, since)) for g in groups if g[0] != "slo"]
            for done, job in enumerate(early + late):
                if runner.on_run is not None:  # what this process waits for, in the order it takes them
                    runner.on_run(f"the other policies: {done} of {len(groups)} groups in, {jobs} processes")
                cache, partial, found = job.result()
                runner.cache.update(cache)
                runner.partial.update(partial)
                runner.found.update(found)
        # a pool one task stopped early and another ran to the end is a full run (as one process keeps it)
        runner.partial = {k: v for k, v in runner.partial.items() if k not in runner.cache}
    finally:
        _SHARED = _BASE = None


def _hint(spec: str, found: dict[str, int | None]) -> int | None:
    """A first probe for ``spec``'s search: the answer of the last policy searched of its
    kind (pinned paper baselines alike, offload ones alike); for the no-autoscale ablation
    (turboserve's placement on a fixed pool, offloading) the smallest offload answer."""
    if spec == "turboserve-no-autoscale":
        return min((p for b, p in found.items() if p is not None and b in FIXED_POOL and b not in PAPER_BASELINES), default=None)
    pinned = spec in PAPER_BASELINES
    return next((p for b, p in reversed(found.items()) if p is not None and (b in PAPER_BASELINES) == pinned), None)


# the offload pools (with the no-autoscale ablation, which offloads too) and the pinned ones
SLO_CHAINS = (("least-loaded-offload", "lag-offload", "turboserve-no-autoscale", "mag-offload"), PAPER_BASELINES)


def _slo_chains(runner: Runner, policies: Sequence[str]) -> list[list[str]]:
    """The fixed-pool SLO searches as chains, each search starting from the answer of the
    one before it in its chain; the two chains share no start, so they run side by side."""
    chains = [[p for p in c if p in policies] for c in SLO_CHAINS]
    chains[0] += [p for p in policies if runner.fixed(p) and not any(p in c for c in SLO_CHAINS)]
    return [c for c in chains if c]


def _slo_start(runner: Runner, name: str, policies: Sequence[str], bound: Bound) -> int | None:
    """Where ``name``'s SLO search starts: the answer of the search before it in its chain
    (:func:`_slo_chains`: the pools meeting one SLO are near each other, whatever the
    placement), the first of a chain where the guide aims (None)."""
    chain = next(c for c in _slo_chains(runner, policies) if name in c)
    i = chain.index(name)
    return runner.slo_pool(chain[i - 1], bound, _slo_start(runner, chain[i - 1], policies, bound)) if i > 0 else None


def _slo(runner: Runner, policies: Sequence[str], slo: Slo, searches: bool = True) -> dict[str, Any]:
    """Each policy's cost at the SLO: fixed pools sized with hindsight (``searches`` False:
    left out, their searches made elsewhere), elastic ones as run."""
    bound = Bound(slo.worst_s, slo.miss_rate)
    ok = bound.ok
    met: dict[str, bool] = {}
    cost: dict[str, float | None] = {}
    pool_size: dict[str, int | None] = {}
    miss: dict[str, float | None] = {}  # each run's own figures at the SLO, to say by how much it meets or misses it
    worst: dict[str, float | None] = {}
    for name in policies:
        if name == "oracle-autoscale":
            continue  # reported at the subject's latency, not at the SLO
        if runner.fixed(name) or name == "turboserve-no-autoscale":
            if not searches:
                continue  # searched in a task of their own (_groups)
            pool = runner.slo_pool(name, bound, _slo_start(runner, name, policies, bound))
            if pool is None:  # no pool up to the search's cap meets it: no cost at the SLO
                label = runner.label(name)
                pool_size[label], met[label], cost[label], miss[label], worst[label] = None, False, None, None, None
                continue
            res = runner.run(name, pool)
            pool_size[res.policy] = pool
        elif name in SLO_CONFIGURED or name not in BUILTIN_POLICIES:  # a plug-in is offered the SLO here only
            res = runner.run(name, None, slo=slo)
        else:
            res = runner.run(name)
        met[res.policy] = ok(res)
        cost[res.policy] = res.cost
        miss[res.policy], worst[res.policy] = res.deadline_miss_rate, res.worst_chunk_latency_s
    fixed = {n: c for n in pool_size if met[n] and n != "turboserve-no-autoscale" and (c := cost[n]) is not None}  # the baselines
    best = min(fixed, key=lambda n: fixed[n]) if fixed else None
    oracle = runner.run("oracle", None, slo=slo) if "oracle" in policies else None
    return {
        "miss_rate": slo.miss_rate,
        "worst_s": slo.worst_s,
        "met": met,
        "cost": cost,
        "pool_size": pool_size,
        "miss_rates": miss,
        "worst_chunks_s": worst,
        "fixed_pool_cost": fixed[best] if best is not None else None,
        "fixed_pool_policy": best,
        "oracle_cost": oracle.cost if oracle is not None else None,
        "oracle_met": ok(oracle) if oracle is not None else None,
        "oracle_miss_rate": oracle.deadline_miss_rate if oracle is not None else None,
        "oracle_worst_s": oracle.worst_chunk_latency_s if oracle is not None else None,
        # what elasticity can buy here (made where the searches are: a forked task's figures are not kept)
        "elastic_bound": _bound(runner.guide.elastic_bound(slo.miss_rate, runner.model[runner.config.gpu_type].capacity,
                                                           runner.trace_end)) if searches else None,
    }


def _bound(b: Any) -> dict[str, Any]:
    """The elastic bound as reported: ``saving_pct`` null, and ``no_bound`` saying why, where
    the figure bounds nothing (a share of one GPU; an SLO no pool meets: it read 42.5% and
    97.5% on two such traces, copied into evaluate's bars)."""
    why = b.no_bound()
    return {**asdict(b), "saving_pct": None if why else b.saving_pct, "no_bound": why}


def _matched_oracle(runner: Runner, ts: SimResult) -> tuple[float, SimResult]:
    """The offline oracle at the subject's latency: (u_target, run).

    ``oracle-autoscale`` knows the future executing count and boots ahead of it; its
    worst latency falls (and cost rises) as u_target falls. It runs at falling u_target
    until its worst chunk is no worse than the subject's (the highest such u_target of the
    grid; a run too slow stops at its first chunk over, so those above cost little); when
    none matches, the one with the lowest worst latency run to the end is returned (marked
    unmatched).
    """
    bound = Bound(ts.worst_chunk_latency_s)
    ok = lambda u: runner.check("oracle-autoscale", None, bound, u_target=u)  # noqa: E731
    lo = next((i for i, u in enumerate(ORACLE_TARGETS) if ok(u)), len(ORACLE_TARGETS) - 1)
    if not ok(ORACLE_TARGETS[lo]):  # even the lowest target does not match: the best run tried
        runner.run("oracle-autoscale", None, u_target=ORACLE_TARGETS[-1])
        tried = [(k, r) for k, r in runner.cache.items() if k[0] == "oracle-autoscale"]
        key, best = min(tried, key=lambda kr: kr[1].worst_chunk_latency_s)
        return dict(key[2])["u_target"], best
    u = ORACLE_TARGETS[lo]
    return u, runner.run("oracle-autoscale", None, u_target=u)


def timelines(runner: Runner, names: Sequence[str]) -> dict[str, dict[str, list[float]]]:
    """The timelines of the runs the table and the JSON report for ``names`` (a fixed pool's
    at matched cost: before, whichever of its runs the cache held first, its SLO pool's say),
    each window within the trace: a run keeps a window for the trace's last instant when that
    falls on a window's edge, which the plot drew as one more window past the end; what it
    holds goes into the window before it (its worst chunk, its migrations)."""
    n = max(1, math.ceil(runner.trace_end / runner.config.window_s - 1e-9))
    return {res.policy: _within(res.timeline, n) for name, res in runner.reported.items() if name in names}


def _within(tl: dict[str, list[float]], n: int) -> dict[str, list[float]]:
    """``tl`` cut to its first ``n`` windows, the later ones' worst chunk and migrations folded in."""
    if all(len(v) <= n for v in tl.values()):
        return tl
    out = {k: list(v[:n]) for k, v in tl.items()}
    if "worst_latency_s" in tl:
        out["worst_latency_s"][-1] = max(tl["worst_latency_s"][n - 1:])
    if "migrations" in tl:
        out["migrations"][-1] = sum(tl["migrations"][n - 1:])
    return out


def plot_timeline(series: dict[str, dict[str, list[float]]], window_s: float, path: str) -> None:
    """Paper-style timeline: GPUs, active sessions, migrations per window, worst latency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("gpus", "GPUs"), ("active", "active sessions"), ("migrations", "migrations / window"), ("worst_latency_s", "worst chunk latency (s)"))
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 9), sharex=True)
    colours = plt.get_cmap("tab20").colors  # one colour per policy (the default cycle has ten)
    for ax, (key, label) in zip(axes, panels):
        for k, (name, tl) in enumerate(series.items()):
            ys = list(tl[key])
            if not ys:
                continue
            xs = [i * window_s / 60.0 for i in range(len(ys) + 1)]  # the last window drawn to its end too
            ax.step(xs, ys + ys[-1:], where="post", label=name, linewidth=1, color=colours[k % len(colours)])
        ax.set_ylabel(label)
    axes[-1].set_xlabel("time (min)")
    axes[0].legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def resolve_subject(runner: Runner, names: Sequence[str], subject: str | None) -> str | None:
    """The spec among ``names`` that ``subject`` names (a spec, or a policy's name); None
    when none is given and turboserve does not run (no comparisons)."""
    if subject is None:
        return "turboserve" if "turboserve" in names else None
    if subject in names:
        return subject
    for spec in names:
        if ":" in spec and runner.name_of(spec) == subject:
            return spec
    run = ", ".join(runner.name_of(spec) if ":" in spec else spec for spec in names)
    raise ConfigError("subject", f"not among the policies run ({run}; a plug-in is given with --policy)", subject)


def check_policies(specs: Sequence[str]) -> None:
    """Reject unknown names early (module:Name is resolved when run)."""
    if not specs:
        raise ConfigError("policy", "no policy given", "command line")
    for s in specs:
        if s not in BUILTIN_POLICIES and ":" not in s:
            raise ConfigError("policy", f"unknown policy (built-ins: {', '.join(BUILTIN_POLICIES)}, "
                              f"{', '.join(PEER_NAMES)} (peers), all, or module:Name)", s)
