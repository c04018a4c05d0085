"""What a ``module:Name`` setting names in your own code (a scheduling policy, a worker's
model): imported, with every failure one ``ConfigError`` naming the setting and the spec."""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Mapping

from schemas.errors import ConfigError

__all__ = ["resolve", "accepted"]


def resolve(spec: str, key: str) -> Any:
    """The object ``module:Name`` names (``Name`` may be dotted: ``module:Class.factory``)."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ConfigError(key, "expected module:Name", spec)
    try:
        found: Any = importlib.import_module(module)
        for part in attr.split("."):
            found = getattr(found, part)
    except ImportError as exc:
        raise ConfigError(key, f"cannot import {module!r} ({exc})", spec) from None
    except AttributeError:
        raise ConfigError(key, f"{module!r} has no {attr!r}", spec) from None
    except SystemExit as exc:  # not an Exception: it ended the command with no word
        raise ConfigError(key, f"cannot import {module!r} (it called sys.exit({exc.code!r}) on import)", spec) from None
    except Exception as exc:  # the module's own code: a syntax error, or what it runs on import
        raise ConfigError(key, f"cannot import {module!r} ({type(exc).__name__}: {exc})"[:300], spec) from None
    return found


def accepted(factory: Any, offer: Mapping[str, Any]) -> dict[str, Any]:
    """The options of ``offer`` that ``factory``'s signature takes (all of them for ``**kwargs``)."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return dict(offer)
    names = {p.name for p in params if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)}
    return {k: v for k, v in offer.items() if k in names}
