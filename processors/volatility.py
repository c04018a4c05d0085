"""The autoscaler's volatility table: (u*, delta) per workload volatility level 1..10, and
its file form (``chunkserve tune`` writes it, ``--table`` and the control processor read it)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from schemas.errors import ConfigError
from schemas.json_values import not_json

__all__ = ["VolatilityTable", "DEFAULT_VOLATILITY_TABLE", "PAPER_VOLATILITY_TABLE", "load_volatility_table", "TABLE_FORMAT"]

TABLE_FORMAT = "chunkserve.volatility-table"


@dataclass(frozen=True, slots=True)
class VolatilityTable:
    """Level 1..10 -> (u_target, delta); ``entries[level - 1]``."""

    entries: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        if len(self.entries) != 10:
            raise ConfigError("levels", "need exactly ten levels (1..10)", "volatility table")
        for lvl, (u, d) in enumerate(self.entries, 1):
            if not (0 < u <= 1 and 0 <= d < u):
                raise ConfigError(f"levels.{lvl}", "need 0 < u_target <= 1 and 0 <= delta < u_target", "volatility table")

    def lookup(self, level: int) -> tuple[float, float]:
        """(u_target, delta) for ``level`` (clamped to 1..10)."""
        return self.entries[min(10, max(1, level)) - 1]

    def to_json(self) -> dict[str, Any]:
        """The file form :func:`load_volatility_table` reads."""
        return {
            "format": TABLE_FORMAT,
            "version": 1,
            "levels": {str(i): {"u_target": u, "delta": d} for i, (u, d) in enumerate(self.entries, 1)},
        }


def _parse_table(doc: Mapping[str, Any], source: str) -> VolatilityTable:
    if not isinstance(doc, Mapping):
        raise ConfigError("volatility_table", "must be a JSON object", source)
    if doc.get("format") != TABLE_FORMAT or doc.get("version") != 1:
        raise ConfigError("format", f"expected {TABLE_FORMAT!r} version 1", source)
    try:
        levels = doc["levels"]
        entries = tuple((float(levels[str(i)]["u_target"]), float(levels[str(i)]["delta"])) for i in range(1, 11))
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError("levels", f"need levels 1..10 with u_target and delta ({exc!r})", source) from None
    try:
        return VolatilityTable(entries)
    except ConfigError as exc:
        raise ConfigError(exc.key, str(exc).split(": ", 2)[-1], source) from None


def load_volatility_table(spec: str | Path = "default") -> VolatilityTable:
    """Read a table file (or the built-in ``"default"``) in the form of ``to_json``."""
    if str(spec) == "default":
        ref = resources.files("processors").joinpath("profiles", "volatility-default.json")
        return _parse_table(json.loads(ref.read_text(encoding="utf-8")), "builtin:volatility-default")
    path = Path(spec)
    try:
        doc = json.loads(path.read_text(encoding="utf-8-sig"))
    except OSError as exc:
        raise ConfigError("volatility_table", f"cannot read ({exc.strerror})", str(path)) from None
    except UnicodeDecodeError as exc:
        raise ConfigError("volatility_table", f"not UTF-8 (byte {exc.start})", str(path)) from None
    except (ValueError, RecursionError) as exc:  # ValueError: bad JSON, or an integer past Python's digit limit
        raise ConfigError("volatility_table", not_json(exc), str(path)) from None
    return _parse_table(doc, str(path))


# The paper's table (0.80 at level 1 down to 0.25 at level 10), kept for reference.
PAPER_VOLATILITY_TABLE = VolatilityTable(
    ((0.80, 0.08), (0.75, 0.08), (0.70, 0.08), (0.65, 0.07), (0.60, 0.07),
     (0.53, 0.06), (0.47, 0.06), (0.40, 0.05), (0.33, 0.05), (0.25, 0.04))
)
# The built-in table: ``chunkserve tune`` output on generated traces (profiles/volatility-default.json).
DEFAULT_VOLATILITY_TABLE = load_volatility_table()
