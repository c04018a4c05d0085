"""Field types and the per-field validators compiled once per record class.

A validator takes the decoded wire value and returns the Python value, or raises
``SchemaError`` naming the field. The same validators run when a record is built in code,
so an invalid record can neither be sent nor received.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Literal, Union

from .errors import SchemaError

__all__ = ["Id", "Count", "Seq", "Seconds", "Fraction", "Level", "Validator", "compile_validator", "json_schema", "ID_MAX_LEN",
           "FrozenMap"]

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_COLLECTION = 4096
ID_MAX_LEN = 256  # the most characters of an id (session, worker, command)


@dataclass(frozen=True, slots=True)
class NonEmpty:
    """The string may not be empty (ids)."""

    max_len: int = ID_MAX_LEN


@dataclass(frozen=True, slots=True)
class Min:
    """A number not below ``value`` (epochs, seqs, counts, durations)."""

    value: float


@dataclass(frozen=True, slots=True)
class Max:
    """A number not above ``value``."""

    value: float


Id = Annotated[str, NonEmpty()]
Count = Annotated[int, Min(0)]
# a producer's per-session input number, from 1: exact in every JSON number and in the store's Lua
MAX_SEQ = 2**53 - 1  # the largest every JSON number holds exactly
Seq = Annotated[int, Min(1), Max(MAX_SEQ)]
Seconds = Annotated[float, Min(0.0)]
Fraction = Annotated[float, Min(0.0), Max(1.0)]
Level = Annotated[int, Min(1), Max(10)]  # the detector's volatility level

Validator = Callable[[Any, str], Any]


def _fail(path: str, reason: str) -> typing.NoReturn:
    raise SchemaError(reason, field=path)


def _type_name(value: Any) -> str:
    return type(value).__name__


def _check_str(value: Any, path: str) -> str:
    if not isinstance(value, str):
        _fail(path, f"expected a string, got {_type_name(value)}")
    return value


def _check_int(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(path, f"expected an integer, got {_type_name(value)}")
    if not INT64_MIN <= value <= INT64_MAX:
        _fail(path, "integer out of 64-bit range")
    return value


def _check_float(value: Any, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail(path, f"expected a number, got {_type_name(value)}")
    value = float(value)
    if not math.isfinite(value):
        _fail(path, "number is not finite")
    return value


def _check_bool(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        _fail(path, f"expected a boolean, got {_type_name(value)}")
    return value


def _check_bytes(value: Any, path: str) -> bytes:
    if not isinstance(value, (bytes, bytearray)):
        _fail(path, f"expected bytes, got {_type_name(value)}")
    return bytes(value)


_SCALARS: dict[Any, Validator] = {
    str: _check_str, int: _check_int, float: _check_float, bool: _check_bool, bytes: _check_bytes,
}


def _bound(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _constrained(inner: Validator, constraints: tuple[Any, ...]) -> Validator:
    def check(value: Any, path: str) -> Any:
        value = inner(value, path)
        for c in constraints:
            if isinstance(c, NonEmpty):
                if not value:
                    _fail(path, "must not be empty")
                if len(value) > c.max_len:
                    _fail(path, f"longer than {c.max_len} characters")
            elif isinstance(c, Min) and value < c.value:
                _fail(path, f"must be >= {_bound(c.value)}, got {value!r}")
            elif isinstance(c, Max) and value > c.value:
                _fail(path, f"must be <= {_bound(c.value)}, got {value!r}")
        return value

    return check


def _optional(inner: Validator) -> Validator:
    def check(value: Any, path: str) -> Any:
        return None if value is None else inner(value, path)

    return check


def _tuple_of(inner: Validator) -> Validator:
    def check(value: Any, path: str) -> tuple[Any, ...]:
        if not isinstance(value, (list, tuple)):
            _fail(path, f"expected an array, got {_type_name(value)}")
        if len(value) > MAX_COLLECTION:
            _fail(path, f"more than {MAX_COLLECTION} items")
        return tuple(inner(item, f"{path}[{i}]") for i, item in enumerate(value))

    return check


class FrozenMap(dict[str, Any]):
    """The value of a record's ``dict[str, T]`` field: a plain map on the wire, to ``==`` and
    to ``repr``, but read-only, so a frozen record stays frozen (to change one, build a new
    map and a new record). Hashable, and pickled and copied as itself (a ``MappingProxyType``
    can be neither pickled nor deep-copied), so records still cross processes and ``replace()``."""

    __slots__ = ()

    def _read_only(self, *args: Any, **kwargs: Any) -> typing.NoReturn:
        raise TypeError("a record's map is read-only: build a new map (dict(m) copies it)")

    __setitem__ = __delitem__ = __ior__ = _read_only
    clear = pop = popitem = setdefault = update = _read_only

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (dict(self),)


def _dict_of(inner: Validator) -> Validator:
    def check(value: Any, path: str) -> FrozenMap:
        if not isinstance(value, dict):
            _fail(path, f"expected a map, got {_type_name(value)}")
        if len(value) > MAX_COLLECTION:
            _fail(path, f"more than {MAX_COLLECTION} entries")
        out = {}
        for k, v in value.items():
            if not isinstance(k, str) or not k:
                _fail(path, "map keys must be non-empty strings")
            out[k] = inner(v, f"{path}.{k}")
        return FrozenMap(out)

    return check


def _literal(options: tuple[Any, ...]) -> Validator:
    def check(value: Any, path: str) -> Any:
        if not isinstance(value, str) or value not in options:
            _fail(path, f"expected one of {list(options)}, got {value!r}")
        return value

    return check


def _nested(cls: type) -> Validator:
    def check(value: Any, path: str) -> Any:
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            _fail(path, f"expected a map for {cls.__name__}, got {_type_name(value)}")
        return from_fields(cls, value, path)

    return check


def compile_validator(tp: Any) -> Validator:
    """Build the validator for one resolved type annotation."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        base, *constraints = typing.get_args(tp)
        return _constrained(compile_validator(base), tuple(constraints))
    if tp in _SCALARS:
        return _SCALARS[tp]
    if origin is Literal:
        return _literal(typing.get_args(tp))
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"only Optional[T] unions are supported, got {tp}")
        return _optional(compile_validator(args[0]))
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) != 2 or args[1] is not Ellipsis:
            raise TypeError(f"only tuple[T, ...] is supported, got {tp}")
        return _tuple_of(compile_validator(args[0]))
    if origin is dict:
        key, val = typing.get_args(tp)
        if key is not str:
            raise TypeError(f"only dict[str, T] is supported, got {tp}")
        return _dict_of(compile_validator(val))
    if dataclasses.is_dataclass(tp):
        return _nested(tp)
    raise TypeError(f"unsupported field type {tp!r}")


def field_validators(cls: type) -> dict[str, Validator]:
    """Validators of a dataclass's fields, cached on the class."""
    cached = cls.__dict__.get("__cs_validators__")
    if cached is None:
        hints = typing.get_type_hints(cls, include_extras=True)
        cached = {f.name: compile_validator(hints[f.name]) for f in dataclasses.fields(cls)}
        type.__setattr__(cls, "__cs_validators__", cached)
    return cached


def _required(cls: type) -> frozenset[str]:
    return frozenset(
        f.name for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    )


def from_fields(cls: type, data: dict[str, Any], path: str = "") -> Any:
    """Build ``cls`` from a decoded map: exact field set, every value validated."""
    validators = field_validators(cls)
    prefix = f"{path}." if path else ""
    for name in data:
        if name not in validators:
            _fail(f"{prefix}{name}" if isinstance(name, str) else prefix + "?", "unexpected field")
    for name in _required(cls):
        if name not in data:
            _fail(prefix + name, "missing field")
    kwargs = {name: validators[name](value, prefix + name) for name, value in data.items()}
    obj = object.__new__(cls)
    for name, f in cls.__dataclass_fields__.items():
        if name in kwargs:
            value = kwargs[name]
        elif f.default is not dataclasses.MISSING:
            value = f.default
        else:
            value = f.default_factory()  # type: ignore[misc]
        object.__setattr__(obj, name, value)
    return obj


def validate_instance(obj: Any) -> None:
    """Check a record built in code against its own field types (used in __post_init__)."""
    for name, check in field_validators(type(obj)).items():
        value = check(getattr(obj, name), name)
        object.__setattr__(obj, name, value)


def to_fields(obj: Any) -> dict[str, Any]:
    """The wire map of a record or nested value (tuples become lists, nested become maps)."""
    out: dict[str, Any] = {}
    for name in obj.__dataclass_fields__:
        out[name] = _plain(getattr(obj, name))
    return out


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return to_fields(value)
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def json_schema(tp: Any, defs: dict[str, Any]) -> dict[str, Any]:
    """JSON Schema (as used by AsyncAPI) of one annotation; nested classes go to ``defs``."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        base, *constraints = typing.get_args(tp)
        schema = json_schema(base, defs)
        for c in constraints:
            if isinstance(c, NonEmpty):
                schema.update(minLength=1, maxLength=c.max_len)
            elif isinstance(c, Min):
                schema["minimum"] = c.value
            elif isinstance(c, Max):
                schema["maximum"] = c.value
        return schema
    simple = {str: "string", int: "integer", float: "number", bool: "boolean"}
    if tp in simple:
        return {"type": simple[tp]}
    if tp is bytes:
        return {"type": "string", "format": "binary", "contentEncoding": "msgpack-bin"}
    if origin is Literal:
        return {"type": "string", "enum": list(typing.get_args(tp))}
    if origin in (Union, types.UnionType):
        (arg,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return {"oneOf": [json_schema(arg, defs), {"type": "null"}]}
    if origin is tuple:
        return {"type": "array", "maxItems": MAX_COLLECTION,
                "items": json_schema(typing.get_args(tp)[0], defs)}
    if origin is dict:
        return {"type": "object", "additionalProperties": json_schema(typing.get_args(tp)[1], defs)}
    if dataclasses.is_dataclass(tp):
        name = tp.__name__
        if name not in defs:
            defs[name] = {}
            defs[name] = object_schema(tp, defs)
        return {"$ref": f"#/components/schemas/{name}"}
    raise TypeError(f"unsupported field type {tp!r}")


def object_schema(cls: type, defs: dict[str, Any]) -> dict[str, Any]:
    hints = typing.get_type_hints(cls, include_extras=True)
    props = {f.name: json_schema(hints[f.name], defs) for f in dataclasses.fields(cls)}
    return {"type": "object", "additionalProperties": False,
            "required": sorted(_required(cls)), "properties": props}
