"""The control agent's settings (``CHUNKSERVE_*``, each error named with its variable) and
the policy and latency model they give it."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any, Mapping

from processors.autoscaler import AutoscalerConfig, Slo
from processors.cluster import ClusterView
from processors.latency import MAX_CAPACITY, GpuProfile, LatencyModel, load_profiles
from processors.policy import BUILTIN_POLICIES, Policy, accepts, keeps_idle_resident, load_policy
from schemas.errors import ConfigError
from streams.config_file import env_number

__all__ = ["ControlConfig", "fit_capacity", "make_policy", "takes_model", "profile_error", "MIN_HEARTBEAT_TIMEOUT_S"]

MIN_HEARTBEAT_TIMEOUT_S = 2.0  # two of a worker's heartbeats (one a second)
_AUTOSCALER = AutoscalerConfig()  # the live defaults the autoscaler shares with the simulator
_POSITIVE = {"tick_s", "period_s", "heartbeat_timeout_s", "boot_timeout_s", "max_gpus", "slo_worst_s"}  # 0 would never act


def fit_capacity(model: LatencyModel, view: ClusterView) -> LatencyModel:
    """The model with each GPU type's K set to what its live workers report.

    The admission limit is the workers' (Redis counts their slots), so the policy must plan
    with the same K; the latency curve and price stay the profile's. Workers of one type that
    report different K (one started by hand beside the provisioner's) each get a type of
    their own, ``TYPE@K`` (``processors.cluster.gpu_type_of``), the type itself keeping the K
    its provisioned workers agree on (else the one all agree on, else the profile's): before,
    such a pool was planned at the profile's K, and a hand worker of 4 slots beside the
    provisioner's of 8 read as 16 (``reference-cpu``), as the provisioner's did, so the
    autoscaler drained the provisioner's worker to fit three sessions onto the hand one, found
    it over the band and booted another, in a loop.
    """
    caps: dict[str, set[int]] = {}
    provisioned: dict[str, set[int]] = {}
    for w in view.workers.values():
        if w.alive and 0 < w.capacity <= MAX_CAPACITY:  # one past what a profile holds keeps the profile's
            caps.setdefault(w.gpu_type, set()).add(w.capacity)
            if w.provisioned:
                provisioned.setdefault(w.gpu_type, set()).add(w.capacity)
    profiles = dict(model.profiles)
    for gpu_type, ks in caps.items():
        p = profiles.get(gpu_type)
        if p is None:
            continue
        agreed = provisioned.get(gpu_type) if len(provisioned.get(gpu_type, ())) == 1 else ks
        base = next(iter(agreed)) if len(agreed) == 1 else p.capacity
        if p.capacity != base:
            profiles[gpu_type] = GpuProfile(p.name, base, p.cost_per_hour, p.points, p.memory_bytes)
        for k in sorted(ks - {base}):
            profiles[f"{gpu_type}@{k}"] = GpuProfile(f"{gpu_type}@{k}", k, p.cost_per_hour, p.points, p.memory_bytes)
    return model if profiles == dict(model.profiles) else LatencyModel(profiles, model.name)


def takes_model(spec: str) -> bool:
    """Whether the policy plans with the model control fits to its workers (a built-in, or a
    plug-in whose factory takes ``model``): only such a one is shown workers typed ``TYPE@K``
    (``fit_capacity``); another keeps its own model, which has no such types."""
    return spec in BUILTIN_POLICIES or accepts(spec, "model")


def make_policy(spec: str, model: LatencyModel, gpu_type: str, source: str = "env CHUNKSERVE_POLICY",
                **autoscaler: Any) -> Policy:
    """The policy ``spec`` on ``model``; built-in TurboServe variants scale out ``gpu_type``.
    Live, u* does not follow the worst chunk (``AutoscalerConfig.follow_worst``): a worker
    reports a chunk's compute time, not the wait a session's first chunk sees, which that
    rule reads."""
    config = AutoscalerConfig(gpu_type=gpu_type, **{"follow_worst": None, **autoscaler})
    opts: dict[str, Any] = {"model": model}
    if spec.startswith("turboserve"):
        opts["autoscaler"] = config
    # a plug-in is offered what the simulator offers it (those its signature takes)
    offer = {"model": model, "gpu_type": gpu_type, "boot_s": config.boot_s, "autoscaler": config,
             **({"slo": config.slo} if config.slo is not None else {})}
    try:
        policy = load_policy(spec, **opts) if spec in BUILTIN_POLICIES else load_policy(spec, offer)
    except ConfigError as exc:  # named as the setting it came from
        if exc.source != spec:
            raise
        raise ConfigError(exc.key, f"{spec[:80]!r}: {exc.reason}", source) from None
    if keeps_idle_resident(policy):  # dispatch suspends every idle session: live it would be another policy
        raise ConfigError("policy", f"{spec[:80]!r} keeps idle sessions resident on their GPU, which only the "
                          "simulator models (live, dispatch offloads every idle session): use it with `chunkserve "
                          "simulate`; live, use one that offloads them (turboserve, least-loaded-offload, "
                          "lag-offload, mag-offload)", source)
    return policy


@dataclass(frozen=True)
class ControlConfig:
    """Policy and pacing; ``from_env`` reads ``CHUNKSERVE_POLICY``, ``CHUNKSERVE_PROFILE`` etc."""

    policy: str = "turboserve"
    profile: str = "reference-cpu"
    gpu_type: str = "cpu"
    pool: str = "default"
    tick_s: float = 0.5  # how often the leader looks for a pending round
    period_s: float = 5.0  # a round at least this often, even without events
    heartbeat_timeout_s: float = 10.0  # then a worker is declared down
    boot_s: float = 10.0  # expected worker boot time (the autoscaler's; also its scale-in delay)
    boot_timeout_s: float = 120.0  # a scale-out not answered by WorkerUp by then is forgotten
    dwell_s: float = 30.0
    min_gpus: int = _AUTOSCALER.min_gpus  # two: N + 1
    max_gpus: int = 64
    burst_memory_s: float = 900.0  # how long the autoscaler's burst reserve remembers a rise
    settle_s: float = _AUTOSCALER.settle_s  # a rise counts toward it only above the level held this long before (0: in full)
    # an SLO the autoscaler meets on the measured chunks (either set: on, the other Slo's default)
    slo_miss_rate: float | None = None
    slo_worst_s: float | None = None

    @property
    def slo(self) -> Slo | None:
        if self.slo_miss_rate is None and self.slo_worst_s is None:
            return None
        base = Slo()
        return Slo(base.miss_rate if self.slo_miss_rate is None else self.slo_miss_rate,
                   base.worst_s if self.slo_worst_s is None else self.slo_worst_s)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "ControlConfig":
        env = os.environ if env is None else env
        base = cls()
        names = {"tick_s": "CHUNKSERVE_CONTROL_TICK_S", "period_s": "CHUNKSERVE_CONTROL_PERIOD_S",
                 "heartbeat_timeout_s": "CHUNKSERVE_HEARTBEAT_TIMEOUT_S", "boot_s": "CHUNKSERVE_BOOT_S",
                 "boot_timeout_s": "CHUNKSERVE_BOOT_TIMEOUT_S", "dwell_s": "CHUNKSERVE_SCALE_DWELL_S",
                 "min_gpus": "CHUNKSERVE_MIN_WORKERS", "max_gpus": "CHUNKSERVE_MAX_WORKERS",
                 "burst_memory_s": "CHUNKSERVE_BURST_MEMORY_S", "settle_s": "CHUNKSERVE_SETTLE_S", "policy": "CHUNKSERVE_POLICY",
                 "profile": "CHUNKSERVE_PROFILE", "gpu_type": "CHUNKSERVE_GPU_TYPE",
                 "pool": "CHUNKSERVE_POOL", "slo_miss_rate": "CHUNKSERVE_SLO_MISS_RATE",
                 "slo_worst_s": "CHUNKSERVE_SLO_WORST_S"}  # spelt out: the README's table is checked against the code
        kw: dict[str, Any] = {k: env[v] if isinstance(getattr(base, k), str)
                              else env_number(env, v, getattr(base, k), positive=k in _POSITIVE)
                              for k, v in names.items() if env.get(v)}
        cfg = replace(base, **kw)
        if cfg.heartbeat_timeout_s < MIN_HEARTBEAT_TIMEOUT_S:
            raise ConfigError("CHUNKSERVE_HEARTBEAT_TIMEOUT_S", f"must be at least {MIN_HEARTBEAT_TIMEOUT_S:g} s "
                              "(a worker beats every second: a shorter wait declares live workers down), got "
                              f"{env['CHUNKSERVE_HEARTBEAT_TIMEOUT_S'][:40]!r}", "environment")
        if cfg.slo_miss_rate is not None and cfg.slo_miss_rate >= 1:
            raise ConfigError("CHUNKSERVE_SLO_MISS_RATE", f"must be below 1 (a share of chunks), got "
                              f"{env['CHUNKSERVE_SLO_MISS_RATE'][:40]!r}", "environment")
        if cfg.max_gpus < max(1, cfg.min_gpus):
            raise ConfigError("CHUNKSERVE_MAX_WORKERS", f"must be at least 1 and CHUNKSERVE_MIN_WORKERS "
                              f"({cfg.min_gpus}), got {cfg.max_gpus}", "environment")
        if env.get("CHUNKSERVE_POLICY") and cfg.policy not in BUILTIN_POLICIES and ":" not in cfg.policy:
            raise ConfigError("policy", f"unknown policy {cfg.policy[:80]!r} (built-ins: {', '.join(BUILTIN_POLICIES)}; "
                              "or module:Name)", "env CHUNKSERVE_POLICY")
        if env.get("CHUNKSERVE_PROFILE") or env.get("CHUNKSERVE_GPU_TYPE"):  # named as the variables they came from
            try:
                model = load_profiles(cfg.profile)
            except ConfigError as exc:
                raise profile_error(exc, cfg.profile) from None
            if cfg.gpu_type not in model:
                raise ConfigError("gpu_type", f"no latency profile for {cfg.gpu_type[:80]!r} in profile "
                                  f"{cfg.profile[:80]!r} (it has {', '.join(sorted(model.profiles))})",
                                  "env CHUNKSERVE_GPU_TYPE" if env.get("CHUNKSERVE_GPU_TYPE") else "env CHUNKSERVE_PROFILE")
        return cfg


def profile_error(exc: ConfigError, spec: str) -> ConfigError:
    """``load_profiles``'s error for ``spec``, named as ``CHUNKSERVE_PROFILE`` (where it came from)."""
    reason = str(exc).split("profile: ", 1)[-1]
    if spec not in reason:
        reason = f"{spec[:200]}: {reason}"
    return ConfigError("profile", reason, "env CHUNKSERVE_PROFILE")
