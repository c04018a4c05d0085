"""The policy protocol and ``load_policy``: built-in names or a third party's ``module:Name``.

A policy is anything with a ``name``, ``initial_state()`` and
``decide(snapshot, signal, state) -> Decision``. The simulator and the live pipeline hold
the state between rounds (in the log or Redis, never on the policy object) and carry out
the commands; they never look inside a policy, so any policy runs unchanged in both (but
one that keeps idle sessions resident, below). A
policy with ``keep_idle_resident = True`` keeps idle sessions' state on their GPU (it may
still offload one with ``Offload``); otherwise idle sessions are offloaded. Only the
simulator keeps them: live, dispatch offloads every idle session, and control refuses such
a policy at start.

Built-ins and plug-ins are offered the same options (:data:`OPTION_NAMES`); a factory
receives those its signature accepts (all of them with ``**kwargs``).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol, runtime_checkable

from processors.baselines import Base, Lag, Mag, PinnedLag, PinnedMag, RoundRobin
from processors.decisions import Decision
from processors.detector import Signal
from processors.oracles import OracleAutoscale
from processors.snapshot import Snapshot
from processors.turboserve import TurboServe
from schemas.errors import ChunkserveError, ConfigError, PolicyError
from streams.plugin import accepted as _accepted, resolve

__all__ = ["Policy", "BUILTIN_POLICIES", "FIXED_POOL", "OPTION_NAMES", "accepts", "load_policy", "keeps_idle_resident"]

#: what a policy may be offered: latency model, GPU type to scale, boot time, volatility
#: table, autoscaler config, the stated SLO (miss rate, worst chunk s; the simulator offers
#: it only to a run at that SLO)
OPTION_NAMES = ("model", "gpu_type", "boot_s", "table", "autoscaler", "slo")


@runtime_checkable
class Policy(Protocol):
    """One decision round: snapshot (with ``now``) and the detector's signal in, commands out."""

    name: str

    def initial_state(self) -> Any:
        """The state to pass to the first ``decide``."""
        ...

    def decide(self, snapshot: Snapshot, signal: Signal | None, state: Any) -> Decision:
        """Pure: the same (snapshot, signal, state) always gives the same Decision."""
        ...


def _oracle(**kw: Any) -> OracleAutoscale:
    if "future" not in kw:
        raise ConfigError("future", "oracle-autoscale needs future active counts per window (oracles.future_active)", "oracle-autoscale")
    kw["future"] = tuple(kw["future"])
    return OracleAutoscale(**kw)


def _turboserve_oracle(**kw: Any) -> TurboServe:
    if "future" not in kw:
        raise ConfigError("future", "oracle needs future active counts per window (oracles.future_active)", "oracle")
    kw["future"] = tuple(kw["future"])
    return TurboServe(name="oracle", **kw)


BUILTIN_POLICIES: dict[str, Callable[..., Any]] = {
    "rr": RoundRobin,
    "lag": PinnedLag,
    "mag": PinnedMag,
    "least-loaded-offload": Base,
    "lag-offload": Lag,
    "mag-offload": Mag,
    "base": lambda **kw: Base(name="base", **kw),  # least-loaded-offload, the live default's old name
    "turboserve": TurboServe,
    "turboserve-no-migration": lambda **kw: TurboServe(migrate=False, name="turboserve-no-migration", **kw),
    "turboserve-no-autoscale": lambda **kw: TurboServe(autoscale=False, name="turboserve-no-autoscale", **kw),
    "oracle": _turboserve_oracle,
    "oracle-autoscale": _oracle,
}
#: built-ins that run on a fixed pool (the others start elastic)
FIXED_POOL = ("rr", "lag", "mag", "least-loaded-offload", "lag-offload", "mag-offload", "base")


def keeps_idle_resident(policy: Any) -> bool:
    """Whether ``policy`` keeps idle sessions resident (default: offload them)."""
    return bool(getattr(policy, "keep_idle_resident", False))


def _factory(spec: str) -> Any:
    """The built-in's factory, or what ``module:Name`` names (imported)."""
    if spec in BUILTIN_POLICIES:
        return BUILTIN_POLICIES[spec]
    if ":" not in spec:
        raise ConfigError("policy", f"unknown policy (built-ins: {', '.join(BUILTIN_POLICIES)}; or module:Name)", spec)
    return resolve(spec, "policy")


def _called(factory: Any) -> bool:
    """Whether ``factory`` is called to build the policy (else it is the policy itself)."""
    return isinstance(factory, type) or (callable(factory) and not isinstance(factory, Policy))


def accepts(spec: str, option: str) -> bool:
    """Whether ``spec``'s factory takes ``option`` when it is offered (see :func:`load_policy`)."""
    factory = _factory(spec)
    return _called(factory) and option in _accepted(factory, {option: None})


def load_policy(spec: str, offer: Mapping[str, Any] | None = None, **options: Any) -> Policy:
    """Resolve a built-in name or ``module:Name`` (a class or factory is called with ``options``,
    plus those of ``offer`` its signature accepts)."""
    factory = _factory(spec)
    if isinstance(factory, type) and not all(callable(getattr(factory, m, None)) for m in ("initial_state", "decide")):
        raise ConfigError("policy", f"{factory.__name__} is not a policy: it needs name, initial_state() and "
                          "decide(snapshot, signal, state)", spec)  # (not "bad options" of its constructor)
    try:
        call = _called(factory)
        if call and offer:
            options = {**_accepted(factory, offer), **options}
        policy = factory(**options) if call else factory
    except TypeError as exc:
        raise ConfigError("policy", f"bad options ({exc}): a policy class, or a function that returns a policy, "
                          "is called with the options it names", spec) from None
    except ChunkserveError:
        raise
    except Exception as exc:  # the plug-in's own code
        raise PolicyError(f"policy {spec}: building it raised {type(exc).__name__}: {exc}"[:500]) from exc
    if isinstance(policy, type) or not isinstance(policy, Policy):
        raise ConfigError("policy", "needs name, initial_state() and decide(snapshot, signal, state)", spec)
    return policy
