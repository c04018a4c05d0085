import json
import math
from itertools import takewhile

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from processors.latency import GpuProfile, builtin_profiles, load_profiles, parse_profiles
from schemas.errors import ConfigError


def test_paper_profile_is_about_one_second_at_capacity():
    model = load_profiles("paper")
    assert "paper" in builtin_profiles()
    for profile in model.values():
        assert profile.latency(profile.capacity) == pytest.approx(1.0, abs=0.05)
        assert profile.latency(0) == 0.0
        curve = [profile.latency(n) for n in range(2 * profile.capacity + 5)]
        assert curve == sorted(curve)


def test_interpolates_and_extrapolates_linearly():
    p = GpuProfile("x", 4, 1.0, ((2, 0.5), (4, 0.9)))
    assert p.latency(1) == pytest.approx(0.25)
    assert p.latency(3) == pytest.approx(0.7)
    assert p.latency(6) == pytest.approx(1.3)
    assert p.latency(100) == pytest.approx(0.9 + 0.2 * 96)


def test_loads_a_file_and_rejects_bad_ones(tmp_path):
    doc = {"format": "chunkserve.latency-profile", "version": 1, "name": "m",
           "gpu_types": {"cpu": {"capacity": 2, "cost_per_hour": 0, "latency_s": {"1": 0.1, "2": 0.15}}}}
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc))
    assert load_profiles(path)["cpu"].latency(2) == pytest.approx(0.15)
    bad = dict(doc, gpu_types={"cpu": {"capacity": 2, "cost_per_hour": 0, "latency_s": {"1": 0.3, "2": 0.1}}})
    with pytest.raises(ConfigError):
        parse_profiles(bad)
    with pytest.raises(ConfigError):
        parse_profiles(dict(doc, format="nope"))
    # a memory of 0 and a latency past 1e9 s are named with their key, not a ValueError's repr
    for spec, why in (({"memory_gib": 0}, "gpu_types.cpu.memory_gib: must be above 0"),
                      ({"latency_s": {"1": 1e12}}, "gpu_types.cpu.latency_s: latencies must be positive, at most 1e+09 s")):
        with pytest.raises(ConfigError, match=why.replace("+", r"\+")):
            parse_profiles(dict(doc, gpu_types={"cpu": {**doc["gpu_types"]["cpu"], **spec}}))
    with pytest.raises(ConfigError):
        load_profiles("no-such-profile")
    for other in ("[]", "null", "3"):  # a document that is not an object: named, not a traceback
        path.write_text(other)
        with pytest.raises(ConfigError, match="must be a JSON object"):
            load_profiles(path)
    with pytest.raises(ConfigError):
        load_profiles("paper")["no-such-type"]


@pytest.mark.parametrize("change,key,said", [
    (lambda d, t: t.update(capacity=16.5), "gpu_types.cpu.capacity", "must be a whole number, got 16.5"),
    (lambda d, t: t.update(capacity="16"), "gpu_types.cpu.capacity", "must be a whole number, got '16'"),
    (lambda d, t: t.update(capacity=True), "gpu_types.cpu.capacity", "must be a whole number, got True"),
    (lambda d, t: t["latency_s"].update({"2": "0.15"}), "gpu_types.cpu.latency_s.2", "must be a number"),
    (lambda d, t: t.update(memory_gib="8"), "gpu_types.cpu.memory_gib", "must be a number"),
    (lambda d, t: t.update(capcity=2), "gpu_types.cpu.capcity", "not a key of a GPU type"),
    (lambda d, t: d.update(gpu_typez={}), "gpu_typez", "not a key of a profile"),
    (lambda d, t: d["gpu_types"].update(cpu2=[1]), "gpu_types.cpu2", "must be an object"),
    (lambda d, t: t.update(capacity=0), "gpu_types.cpu.capacity", "must be 1 to"),  # the type's own checks name the file too
    (lambda d, t: t["latency_s"].update({"2": 0.05}), "gpu_types.cpu.latency_s", "non-decreasing"),
])
def test_a_profile_is_read_as_strictly_as_a_placement_document(change, key, said):
    """A capacity of 16.5 or "16", a string for a number or a misspelt key were taken (16,
    the string's value, the key ignored): each is named instead, as `place` names them."""
    doc = {"format": "chunkserve.latency-profile", "version": 1, "name": "m",
           "gpu_types": {"cpu": {"capacity": 2, "cost_per_hour": 0, "latency_s": {"1": 0.1, "2": 0.15}}}}
    assert parse_profiles(json.loads(json.dumps(doc)))["cpu"].capacity == 2
    doc["gpu_types"]["cpu"]["capacity"] = 2.0  # a whole number written as a float is a whole number
    assert parse_profiles(doc)["cpu"].capacity == 2
    change(doc, doc["gpu_types"]["cpu"])
    with pytest.raises(ConfigError) as info:
        parse_profiles(doc, "m.json")
    assert info.value.key == key and info.value.source == "m.json" and said in str(info.value)


_curves = st.lists(st.tuples(st.integers(1, 6), st.floats(0.0, 0.4)), min_size=1, max_size=6).map(
    lambda steps: tuple((sum(d for d, _ in steps[: i + 1]), 0.05 + sum(x for _, x in steps[: i + 1])) for i in range(len(steps))))


def _fits(waits: list[float], worst: float) -> int:
    """1 plus how many first chunks from n = 2 on, in turn, end within ``worst`` (the sums
    rise with n, up to the rounding of a curve's interpolation, where the first that does
    not fit ends the count)."""
    return 1 + len(list(takewhile(lambda w: w <= worst, waits[1:])))


@settings(max_examples=300, deadline=None)
@given(_curves, st.integers(1, 12), st.floats(0.0, 6.0), st.integers(1, 40))
@example(((1, 0.44999999999999996), (4, 0.85), (5, 0.85)), 1, 0.0, 6)  # l(4) rounds 1 ulp above l(5)
def test_first_chunk_load_is_the_most_sessions_a_first_chunk_fits_and_between_them_numpys_interpolation(points, k, worst, most):
    """Flat steps (a batch bucket's padding) and rising runs alike: the floor is the most n
    (1 at least, ``most`` at most) with l(n - 1) + l(n) within ``worst``, what the
    autoscaler's worst-chunk rule reads; where the sums rise, the value is numpy.interp's,
    what the simulator's searches aimed by before."""
    p = GpuProfile("x", k, 1.0, points)
    waits = [p.latency(n - 1) + p.latency(n) for n in range(1, most + 1)]
    x = p.first_chunk_load(worst, most)
    assert 1 <= x <= most
    assert math.floor(x) == _fits(waits, worst)
    for w in waits:  # a worst chunk exactly at a first chunk's latency admits that n
        assert math.floor(p.first_chunk_load(w, most)) == _fits(waits, w)
        if all(b >= a for a, b in zip(waits, waits[1:])):
            assert _fits(waits, w) == max(n for n in range(1, most + 1) if waits[n - 1] <= w)
    if all(b > a for a, b in zip(waits, waits[1:])):
        assert x == pytest.approx(float(np.interp(worst, waits, np.arange(1, most + 1))), rel=1e-12, abs=1e-12)
