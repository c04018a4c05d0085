"""Per-chunk latency l(n) of a GPU type as a function of coalesced sessions n.

A profile is a table (batch size -> seconds) per GPU type, linearly interpolated, with
l(0) = 0 and linear extrapolation past the last measured batch. Profiles are JSON files::

    {"format": "chunkserve.latency-profile", "version": 1, "name": "...", "source": "...",
     "gpu_types": {"<type>": {"capacity": K, "cost_per_hour": usd, "memory_gib": gib,
                              "latency_s": {"1": s, "2": s, ...}}}}

Built-in profiles live in ``processors/profiles/<name>.json``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Iterator, Mapping

from schemas.errors import ConfigError

__all__ = [
    "GpuProfile",
    "LatencyModel",
    "parse_profiles",
    "load_profiles",
    "builtin_profiles",
    "PROFILE_FORMAT",
]

PROFILE_FORMAT = "chunkserve.latency-profile"
_GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class GpuProfile:
    """Latency curve, session capacity K, hourly price and memory of one GPU type."""

    name: str
    capacity: int
    cost_per_hour: float
    points: tuple[tuple[int, float], ...]
    memory_bytes: int = 80 * _GIB
    curve: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        src = f"profile {self.name}"
        if self.capacity < 1:
            raise ConfigError("capacity", "must be >= 1", src)
        if self.cost_per_hour < 0:
            raise ConfigError("cost_per_hour", "must be >= 0", src)
        if not self.points:
            raise ConfigError("latency_s", "needs at least one (batch, seconds) point", src)
        prev_n, prev_l = 0, 0.0
        for n, lat in self.points:
            if n <= prev_n:
                raise ConfigError("latency_s", "batch sizes must be distinct integers >= 1", src)
            if not (math.isfinite(lat) and lat >= prev_l and lat > 0):
                raise ConfigError("latency_s", "latencies must be positive and non-decreasing", src)
            prev_n, prev_l = n, lat
        top = max(2 * self.capacity, self.points[-1][0]) + 1
        object.__setattr__(self, "curve", tuple(self._interp(n) for n in range(top)))

    def _interp(self, n: int) -> float:
        pts = ((0, 0.0),) + self.points
        for (n0, l0), (n1, l1) in zip(pts, pts[1:]):
            if n <= n1:
                return l0 + (l1 - l0) * (n - n0) / (n1 - n0)
        (n0, l0), (n1, l1) = pts[-2], pts[-1]
        return l1 + (l1 - l0) * (n - n1) / (n1 - n0)

    def latency(self, n: int) -> float:
        """Per-chunk seconds with ``n`` sessions coalesced (0 for an idle GPU)."""
        curve = self.curve
        return curve[n] if n < len(curve) else self._interp(n)


@dataclass(frozen=True)
class LatencyModel(Mapping[str, GpuProfile]):
    """GPU type -> profile; a pool may mix types (heterogeneous pools are first-class)."""

    profiles: Mapping[str, GpuProfile]
    name: str = "custom"

    def __getitem__(self, gpu_type: str) -> GpuProfile:
        try:
            return self.profiles[gpu_type]
        except KeyError:
            raise ConfigError("gpu_type", f"no latency profile for {gpu_type!r}", self.name) from None

    def __contains__(self, gpu_type: object) -> bool:  # the Mapping default would raise ConfigError
        return gpu_type in self.profiles

    def __iter__(self) -> Iterator[str]:
        return iter(self.profiles)

    def __len__(self) -> int:
        return len(self.profiles)

    def __hash__(self) -> int:
        return hash((self.name, tuple(sorted(self.profiles.items()))))


def parse_profiles(doc: Mapping[str, Any], source: str = "profile") -> LatencyModel:
    """Validate a decoded profile document and build the model."""
    if not isinstance(doc, Mapping):
        raise ConfigError("profile", "must be a JSON object", source)
    if doc.get("format") != PROFILE_FORMAT:
        raise ConfigError("format", f"expected {PROFILE_FORMAT!r}", source)
    if doc.get("version") != 1:
        raise ConfigError("version", "only version 1 is understood", source)
    types = doc.get("gpu_types")
    if not isinstance(types, Mapping) or not types:
        raise ConfigError("gpu_types", "must be a non-empty object", source)
    profiles = {}
    for name, spec in types.items():
        try:
            table = spec["latency_s"]
            points = tuple(sorted((int(k), float(v)) for k, v in table.items()))
            profiles[name] = GpuProfile(
                name=name,
                capacity=int(spec["capacity"]),
                cost_per_hour=float(spec["cost_per_hour"]),
                memory_bytes=int(float(spec.get("memory_gib", 80)) * _GIB),
                points=points,
            )
        except ConfigError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"gpu_types.{name}", f"malformed entry ({exc!r})", source) from None
    return LatencyModel(profiles, str(doc.get("name", source)))


def load_profiles(spec: str | Path) -> LatencyModel:
    """Load a profile from a file path, or a built-in one by name (e.g. ``"paper"``)."""
    path = Path(spec)
    if path.suffix != ".json" and not path.exists():
        ref = resources.files("processors").joinpath("profiles", f"{spec}.json")
        if not ref.is_file():
            raise ConfigError("profile", f"no built-in profile {spec!r} (have {builtin_profiles()})", str(spec))
        text, source = ref.read_text(encoding="utf-8"), f"builtin:{spec}"
    else:
        try:
            text, source = path.read_text(encoding="utf-8"), str(path)
        except OSError as exc:
            raise ConfigError("profile", f"cannot read ({exc.strerror})", str(path)) from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError("profile", f"not JSON ({exc})", source) from None
    return parse_profiles(doc, source)


def builtin_profiles() -> list[str]:
    """Names of the profiles shipped in ``processors/profiles``."""
    root = resources.files("processors").joinpath("profiles")
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".json") and not p.name.startswith("volatility"))
