"""hypothesis strategies for every wire record, built from the classes' own type hints."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Annotated, Any, Literal, Union

from hypothesis import strategies as st

from schemas._fields import Max, Min, NonEmpty
from schemas.records import Record, record_types


def for_type(tp: Any) -> st.SearchStrategy[Any]:
    origin = typing.get_origin(tp)
    if origin is Annotated:
        base, *cons = typing.get_args(tp)
        lo = next((c.value for c in cons if isinstance(c, Min)), None)
        hi = next((c.value for c in cons if isinstance(c, Max)), None)
        if base is str:
            ne = next((c for c in cons if isinstance(c, NonEmpty)), None)
            return st.text(min_size=1 if ne else 0, max_size=ne.max_len if ne else 64)
        if base is int:
            return st.integers(min_value=int(lo) if lo is not None else -(2**63),
                               max_value=int(hi) if hi is not None else 2**63 - 1)
        if base is float:
            return st.floats(min_value=lo, max_value=hi, allow_nan=False, allow_infinity=False)
    if tp is str:
        return st.text(max_size=64)
    if tp is int:
        return st.integers(min_value=-(2**63), max_value=2**63 - 1)
    if tp is float:
        return st.floats(allow_nan=False, allow_infinity=False)
    if tp is bool:
        return st.booleans()
    if tp is bytes:
        return st.binary(max_size=64)
    if origin is Literal:
        return st.sampled_from(typing.get_args(tp))
    if origin in (Union, types.UnionType):
        (arg,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return st.none() | for_type(arg)
    if origin is tuple:
        return st.lists(for_type(typing.get_args(tp)[0]), max_size=4).map(tuple)
    if origin is dict:
        return st.dictionaries(st.text(min_size=1, max_size=8), for_type(typing.get_args(tp)[1]),
                               max_size=4)
    if dataclasses.is_dataclass(tp):
        return for_class(tp)
    raise TypeError(tp)


def for_class(cls: type) -> st.SearchStrategy[Any]:
    hints = typing.get_type_hints(cls, include_extras=True)
    return st.builds(cls, **{f.name: for_type(hints[f.name]) for f in dataclasses.fields(cls)})


ALL_RECORDS: st.SearchStrategy[Record] = st.one_of(
    [for_class(cls) for cls in record_types().values()]
)
