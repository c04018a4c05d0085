"""The policy protocol and ``load_policy``: built-in names or a third party's ``module:Name``.

A policy is anything with a ``name``, ``initial_state()`` and
``decide(snapshot, signal, state) -> Decision``. The simulator and the live pipeline hold
the state between epochs (in the log or Redis, never on the policy object) and carry out
the commands; they never look inside a policy, so any policy runs unchanged in both.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Protocol, runtime_checkable

from processors.baselines import Base, Lag, Mag
from processors.decisions import Decision
from processors.detector import WorkloadSignal
from processors.oracles import OracleAutoscale
from processors.snapshot import Snapshot
from processors.turboserve import TurboServe
from schemas.errors import ConfigError

__all__ = ["Policy", "BUILTIN_POLICIES", "load_policy"]


@runtime_checkable
class Policy(Protocol):
    """One decision epoch: snapshot (with ``now``) and the detector's signal in, commands out."""

    name: str

    def initial_state(self) -> Any:
        """The state to pass to the first ``decide``."""
        ...

    def decide(self, snapshot: Snapshot, signal: WorkloadSignal | None, state: Any) -> Decision:
        """Pure: the same (snapshot, signal, state) always gives the same Decision."""
        ...


def _oracle(**kw: Any) -> OracleAutoscale:
    if "future" not in kw:
        raise ConfigError("future", "oracle-autoscale needs future active counts per window (oracles.future_active)", "oracle-autoscale")
    kw["future"] = tuple(kw["future"])
    return OracleAutoscale(**kw)


BUILTIN_POLICIES: dict[str, Callable[..., Any]] = {
    "base": Base,
    "lag": Lag,
    "mag": Mag,
    "turboserve": TurboServe,
    "turboserve-no-migration": lambda **kw: TurboServe(migrate=False, name="turboserve-no-migration", **kw),
    "turboserve-no-autoscale": lambda **kw: TurboServe(autoscale=False, name="turboserve-no-autoscale", **kw),
    "oracle-autoscale": _oracle,
}


def load_policy(spec: str, **options: Any) -> Policy:
    """Resolve a built-in name or ``module:Name`` (a class or factory is called with ``options``)."""
    if spec in BUILTIN_POLICIES:
        factory: Any = BUILTIN_POLICIES[spec]
    elif ":" in spec:
        module, _, attr = spec.partition(":")
        try:
            factory = importlib.import_module(module)
            for part in attr.split("."):
                factory = getattr(factory, part)
        except ImportError as exc:
            raise ConfigError("policy", f"cannot import {module!r} ({exc})", spec) from None
        except AttributeError:
            raise ConfigError("policy", f"{module!r} has no {attr!r}", spec) from None
    else:
        raise ConfigError("policy", f"unknown policy (built-ins: {', '.join(BUILTIN_POLICIES)}; or module:Name)", spec)
    try:
        call = isinstance(factory, type) or (callable(factory) and not isinstance(factory, Policy))
        policy = factory(**options) if call else factory
    except TypeError as exc:
        raise ConfigError("policy", f"bad options ({exc})", spec) from None
    if isinstance(policy, type) or not isinstance(policy, Policy):
        raise ConfigError("policy", "needs name, initial_state() and decide(snapshot, signal, state)", spec)
    return policy
