"""Per-chunk latency l(n) of a GPU type as a function of coalesced sessions n.

A profile is a table (batch size -> seconds) per GPU type, linearly interpolated, with
l(0) = 0 and linear extrapolation past the last measured batch. Profiles are JSON files::

    {"format": "chunkserve.latency-profile", "version": 1, "name": "...", "source": "...",
     "gpu_types": {"<type>": {"capacity": K, "cost_per_hour": usd, "memory_gib": gib,
                              "latency_s": {"1": s, "2": s, ...}}}}

Built-in profiles live in ``processors/profiles/<name>.json``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Iterator, Mapping

from schemas.errors import ConfigError
from schemas.json_values import document, number, whole

__all__ = [
    "GpuProfile",
    "LatencyModel",
    "parse_profiles",
    "batch_key",
    "load_profiles",
    "builtin_profiles",
    "PROFILE_FORMAT",
]

PROFILE_FORMAT = "chunkserve.latency-profile"
_GIB = 1 << 30


# bounds on a profile (a GPU type holds at most this many sessions; the per-session curve
# is tabulated up to twice the capacity or the last point): past them a file is a typo or
# hostile, and tabulating it would not end
MAX_CAPACITY = 4096
MAX_BATCH = 2 * MAX_CAPACITY
MAX_POINTS = 64
MAX_TYPES = 64
MAX_SECONDS = 1e9  # a chunk's latency at most (as ``chunkserve place`` reads seconds)


def _memory_bytes(gib: float, key: str = "memory_gib", source: str = "profile") -> int:
    if not (0 < gib <= 1 << 20):
        raise ConfigError(key, f"must be above 0 and at most {1 << 20} (GiB), got {gib:g}", source)
    return int(gib * _GIB)


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
        if not 1 <= self.capacity <= MAX_CAPACITY:
            raise ConfigError("capacity", f"must be 1 to {MAX_CAPACITY}", src)
        if not (self.cost_per_hour >= 0 and math.isfinite(self.cost_per_hour)):
            raise ConfigError("cost_per_hour", "must be a finite number >= 0", src)
        if not 1 <= len(self.points) <= MAX_POINTS:
            raise ConfigError("latency_s", f"needs 1 to {MAX_POINTS} (batch, seconds) points", src)
        if self.points[-1][0] > MAX_BATCH:
            raise ConfigError("latency_s", f"batch sizes up to {MAX_BATCH}", src)
        prev_n, prev_l = 0, 0.0
        for n, lat in self.points:
            if n <= prev_n:
                raise ConfigError("latency_s", "batch sizes must be distinct integers >= 1", src)
            if not (math.isfinite(lat) and lat >= prev_l and 0 < lat <= MAX_SECONDS):
                raise ConfigError("latency_s", f"latencies must be positive, at most {MAX_SECONDS:g} s, and non-decreasing", src)
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

    def first_chunk_load(self, worst: float, most: int) -> float:
        """The sessions per GPU n (at least 1, at most ``most``; linear between whole counts)
        at which a first chunk, waiting out the running chunk of the n - 1 there and then
        running its own, l(n - 1) + l(n), takes ``worst`` seconds. Its floor is the most
        sessions whose first chunk ends within ``worst`` (the autoscaler's worst-chunk rule);
        the fraction aims the simulator's searches between pools."""
        n, lat = 1, self.latency
        while n < most and lat(n) + lat(n + 1) <= worst:
            n += 1
        lo, hi = lat(n - 1) + lat(n), lat(n) + lat(n + 1)
        if n >= most or worst <= lo or hi <= lo:
            return float(n)
        # as numpy.interp computes it, kept below n + 1 (worst < hi) so that the floor is n
        return min((1.0 / (hi - lo)) * (worst - lo) + n, math.nextafter(n + 1, n))


@dataclass(frozen=True)
class LatencyModel(Mapping[str, GpuProfile]):
    """GPU type -> profile; a pool may mix types (heterogeneous pools are first-class)."""

    profiles: Mapping[str, GpuProfile]
    name: str = "custom"

    def __getitem__(self, gpu_type: str) -> GpuProfile:
        try:
            return self.profiles[gpu_type]
        except KeyError:
            have = ", ".join(sorted(self.profiles))[:200]
            raise ConfigError("gpu_type", f"no latency profile for {gpu_type!r} (it has {have})", self.name) from None

    def __contains__(self, gpu_type: object) -> bool:  # the Mapping default would raise ConfigError
        return gpu_type in self.profiles

    def __iter__(self) -> Iterator[str]:
        return iter(self.profiles)

    def __len__(self) -> int:
        return len(self.profiles)

    def __hash__(self) -> int:
        return hash((self.name, tuple(sorted(self.profiles.items()))))


def batch_key(k: object) -> bool:
    """Whether ``k`` is a batch size as a profile's keys give one: plain digits, at most nine
    (a longer one is past every bound, and Python refuses to read a very long one)."""
    return isinstance(k, str) and k.isascii() and k.isdigit() and len(k) <= 9


def parse_profiles(doc: Mapping[str, Any], source: str = "profile") -> LatencyModel:
    """Validate a decoded profile document and build the model."""
    if not isinstance(doc, Mapping):
        raise ConfigError("profile", "must be a JSON object", source)
    if doc.get("format") != PROFILE_FORMAT:
        raise ConfigError("format", f"expected {PROFILE_FORMAT!r}", source)
    if doc.get("version") != 1:
        raise ConfigError("version", "only version 1 is understood", source)
    extra = sorted(set(doc) - _DOC_KEYS)
    if extra:  # a misspelt key would leave its setting at a default without a word
        raise ConfigError(str(extra[0])[:60], f"not a key of a profile (have {sorted(_DOC_KEYS)})", source)
    types = doc.get("gpu_types")
    if not isinstance(types, Mapping) or not types:
        raise ConfigError("gpu_types", "must be a non-empty object", source)
    if len(types) > MAX_TYPES:
        raise ConfigError("gpu_types", f"at most {MAX_TYPES} GPU types", source)
    profiles = {}
    for name, spec in types.items():
        where = f"gpu_types.{name}"
        if not isinstance(spec, Mapping):
            raise ConfigError(where, "must be an object", source)
        extra = sorted(set(spec) - _TYPE_KEYS)
        if extra:
            raise ConfigError(f"{where}.{str(extra[0])[:60]}", f"not a key of a GPU type (have {sorted(_TYPE_KEYS)})", source)
        table = spec.get("latency_s")
        if not isinstance(table, Mapping):
            raise ConfigError(f"{where}.latency_s", "must be an object of batch size -> seconds", source)
        for k in table:  # a batch size is a whole number: '1.5' or '1e1' is named, not a Python error
            if not batch_key(k):
                raise ConfigError(f"{where}.latency_s", f"key {str(k)[:20]!r} is not a batch size (a whole number "
                                  f"from 1 to {MAX_BATCH})", source)
        try:
            points = tuple(sorted((int(k), number(v, f"{where}.latency_s.{k}", source)) for k, v in table.items()))
            profiles[name] = GpuProfile(
                name=name,
                capacity=whole(spec.get("capacity"), f"{where}.capacity", source),
                cost_per_hour=number(spec.get("cost_per_hour"), f"{where}.cost_per_hour", source),
                memory_bytes=_memory_bytes(number(spec.get("memory_gib", 80), f"{where}.memory_gib", source),
                                           f"{where}.memory_gib", source),
                points=points,
            )
        except ConfigError as exc:
            if exc.source == f"profile {name}":  # the type's own check: named in the file
                raise ConfigError(f"{where}.{exc.key}", exc.reason, source) from None
            raise
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise ConfigError(where, f"malformed entry ({exc!r})", source) from None
    return LatencyModel(profiles, str(doc.get("name", source)))


_DOC_KEYS = frozenset({"format", "version", "name", "source", "gpu_types"})
_TYPE_KEYS = frozenset({"capacity", "cost_per_hour", "latency_s", "memory_gib"})


def load_profiles(spec: str | Path) -> LatencyModel:
    """Load a profile from a file path, or a built-in one by name (e.g. ``"paper"``)."""
    path = Path(spec)
    if path.suffix != ".json" and not path.exists():
        ref = resources.files("processors").joinpath("profiles", f"{spec}.json")
        if not ref.is_file():
            raise ConfigError("profile", f"no built-in profile {spec!r} (have {', '.join(builtin_profiles())})", str(spec))
        text, source = ref.read_text(encoding="utf-8"), f"builtin:{spec}"
    else:
        try:
            text, source = path.read_text(encoding="utf-8-sig"), str(path)  # a BOM, as some editors write, is no error
        except OSError as exc:
            raise ConfigError("profile", f"cannot read ({exc.strerror})", str(path)) from None
        except UnicodeDecodeError as exc:
            raise ConfigError("profile", f"not UTF-8 (byte {exc.start})", str(path)) from None
    return parse_profiles(document(text, "profile", source), source)


def builtin_profiles() -> list[str]:
    """Names of the profiles shipped in ``processors/profiles``."""
    root = resources.files("processors").joinpath("profiles")
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".json") and not p.name.startswith("volatility"))
