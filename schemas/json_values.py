"""JSON documents users write (a profile, a placement snapshot) and the numbers in them, checked.

JSON writers spell numbers loosely: ``16.0`` for a count, ``true`` where a number belongs,
``"16"`` in quotes. Each check takes the value, the key it sits under and the document it
came from, and returns the number or raises ``ConfigError`` naming all three, in one line.
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

from .errors import ConfigError

__all__ = ["number", "whole", "document", "not_json"]


def _span(lo: float | None, hi: float | None, above: bool = False) -> str:
    """`` from 0 to 10``, `` above 0, at most 10``, `` at most 10``, or nothing."""
    show = lambda x: str(x) if isinstance(x, int) else f"{x:g}"  # noqa: E731
    parts = [] if lo is None else [f"above {show(lo)}" if above else f"from {show(lo)}"]
    if hi is not None:
        parts.append(f"to {show(hi)}" if parts and not above else f"at most {show(hi)}")
    return " " + (", " if above else " ").join(parts) if parts else ""


def number(value: Any, key: str, source: str, lo: float | None = None, hi: float | None = None, *, above: bool = False) -> float:
    """A finite JSON number (not a string, not true/false) from ``lo`` (exclusive when
    ``above``) to ``hi``."""
    numeric = not isinstance(value, bool) and isinstance(value, (int, float))
    ok = numeric and math.isfinite(value)
    if ok and lo is not None:
        ok = value > lo if above else value >= lo
    if ok and hi is not None:
        ok = value <= hi
    if not ok:
        what = "a finite number" if numeric and not math.isfinite(value) else "a number"
        raise ConfigError(key, f"must be {what}{_span(lo, hi, above)}, got {value!r}"[:200], source)
    return float(value)


def whole(value: Any, key: str, source: str, lo: int | None = None, hi: int | None = None) -> int:
    """A JSON number with no fraction (``16`` or ``16.0``, as writers often spell it; not
    ``16.5`` nor ``"16"``) from ``lo`` to ``hi``."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and (isinstance(value, int) or value.is_integer())
    n = int(value) if ok else 0
    if not ok or (lo is not None and n < lo) or (hi is not None and n > hi):
        raise ConfigError(key, f"must be a whole number{_span(lo, hi)}, got {value!r}"[:200], source)
    return n


class _Twice(ValueError):
    pass


def _once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:  # given twice: the last would win without a word
            raise _Twice(k)
        out[k] = v
    return out


def document(text: str, key: str, source: str) -> Any:
    """``text`` decoded as JSON; a key given twice in one object is refused like bad JSON
    (the last would silently win), in one line naming ``source``."""
    try:
        return json.loads(text, object_pairs_hook=_once)
    except _Twice as exc:
        raise ConfigError(key, f"key {str(exc)[:60]!r} given twice in one object", source) from None
    except (ValueError, RecursionError) as exc:  # ValueError: bad JSON, or an integer past Python's digit limit
        raise ConfigError(key, not_json(exc), source) from None


def not_json(exc: BaseException) -> str:
    """Why a text is not JSON, in the writer's words (not the interpreter's advice)."""
    said = str(exc)
    if "integer string conversion" in said:  # Python's digit limit, with advice to raise it
        digits = re.search(r"value has (\d+) digits", said)
        return (f"not JSON (an integer of {digits.group(1) if digits else 'too many'} digits, "
                f"past the {sys.get_int_max_str_digits()} a number may have here)")
    return f"not JSON ({said or 'nested too deep'})"[:300]
