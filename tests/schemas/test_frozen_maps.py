"""A record's ``dict[str, T]`` field is as frozen as the record: read-only once validated,
yet still a plain map on the wire, and the record still pickles, copies and ``replace()``s."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
import types
import typing
from typing import Annotated, Any, Union

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas._fields import FrozenMap, to_fields
from schemas.codec import decode, encode
from schemas.records import AdmissionPlan, PlacementReport, record_types
from schemas.topics import topic_of

from .strategies import for_class


def _is_map(tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return _is_map(typing.get_args(tp)[0])
    if origin in (Union, types.UnionType):
        return any(_is_map(a) for a in typing.get_args(tp) if a is not type(None))
    return origin is dict


MAP_FIELDS = [(cls, name) for cls in record_types().values()
              for name, tp in typing.get_type_hints(cls, include_extras=True).items()
              if name in cls.__dataclass_fields__ and _is_map(tp)]

MUTATIONS = {
    "setitem": lambda m: m.__setitem__("x-new", next(iter(m.values()))),
    "delitem": lambda m: m.__delitem__(next(iter(m))),
    "ior": lambda m: m.__ior__({"x-new": next(iter(m.values()))}),
    "clear": lambda m: m.clear(),
    "pop": lambda m: m.pop(next(iter(m))),
    "popitem": lambda m: m.popitem(),
    "setdefault": lambda m: m.setdefault("x-new", next(iter(m.values()))),
    "update": lambda m: m.update({"x-new": next(iter(m.values()))}),
}


def test_the_map_fields_are_found():
    assert {(cls.__name__, name) for cls, name in MAP_FIELDS} >= {("AdmissionPlan", "pinned"),
                                                                  ("PlacementReport", "loads")}


def test_a_plans_pins_cannot_change_in_place():
    plan = AdmissionPlan(pool="p", ts=1.0, policy="rr", pinned={"s1": "w1"})
    with pytest.raises(TypeError):
        plan.pinned["s2"] = "w2"  # type: ignore[index]
    with pytest.raises(TypeError):
        plan.pinned.update(s1="w9")  # type: ignore[union-attr]
    assert plan.pinned == {"s1": "w1"} and {"s1": "w1"} == plan.pinned
    assert repr(plan) == ("AdmissionPlan(pool='p', ts=1.0, policy='rr', order=(), pinned={'s1': 'w1'}, "
                          "fallback=True, decision_id='')")


def test_a_new_map_goes_in_a_new_record():
    report = PlacementReport(ts=1.0, workers=2, sessions=3, loads={"w1": 1, "w2": 2})
    moved = dataclasses.replace(report, loads={**report.loads, "w1": 2, "w2": 1})  # type: ignore[dict-item]
    assert report.loads == {"w1": 1, "w2": 2} and moved.loads == {"w1": 2, "w2": 1}
    assert isinstance(moved.loads, FrozenMap) and type(dict(moved.loads)) is dict


@pytest.mark.parametrize(("cls", "name"), MAP_FIELDS, ids=[f"{c.__name__}.{n}" for c, n in MAP_FIELDS])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_map_field_is_read_only_and_the_record_still_travels(cls, name, data):
    rec = data.draw(for_class(cls).filter(lambda r: bool(getattr(r, name))))
    held = getattr(rec, name)
    before = dict(held)
    assert isinstance(held, FrozenMap)
    for what, mutate in MUTATIONS.items():
        with pytest.raises(TypeError):
            mutate(held)
        assert held == before, what
    # the wire: a plain map, decoded equal (and frozen again)
    wire = to_fields(rec)
    assert type(wire[name]) is dict and wire[name] == before
    assert json.loads(json.dumps(wire[name])) == json.loads(json.dumps(before))
    back = decode(topic_of(rec), encode(rec))
    assert back == rec and isinstance(getattr(back, name), FrozenMap)
    # across processes and copies, as itself
    for other in (pickle.loads(pickle.dumps(rec)), copy.deepcopy(rec), copy.copy(rec),
                  dataclasses.replace(rec), dataclasses.replace(rec, **{name: held})):
        assert other == rec and isinstance(getattr(other, name), FrozenMap)
        assert hash(other) == hash(rec)
