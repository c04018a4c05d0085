"""Values from outside that once drove a loop, an allocation or a conversion without a bound
(a latency profile of capacity 1e8, a detector slot of 1e-8 s, a trace a million seconds
long, a JSON nested 200,000 deep, a batch key "²") are refused in one line, naming where."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from infra.cli import app
from processors.agents.detector import detector_settings
from processors.latency import MAX_CAPACITY, MAX_POINTS, MAX_TYPES, parse_profiles
from schemas.errors import ConfigError

TRACE = "t_s,session_id,event\n0,a,open\n20,a,close\n"


def _profile(**spec: object) -> dict:
    gpu = {"capacity": 8, "cost_per_hour": 1.0, "latency_s": {"1": 0.3, "8": 1.0}, **spec}
    return {"format": "chunkserve.latency-profile", "version": 1, "gpu_types": {"x": gpu}}


@pytest.mark.parametrize("spec, said", [
    ({"capacity": 10**8}, f"capacity: must be 1 to {MAX_CAPACITY}"),
    ({"latency_s": {str(k): 0.1 * k for k in range(1, MAX_POINTS + 2)}}, f"needs 1 to {MAX_POINTS}"),
    ({"latency_s": {"1": 0.3, "100000000": 9.0}}, "batch sizes up to"),
    ({"memory_gib": float("inf")}, "memory_gib: must be a finite number, got inf"),
    ({"cost_per_hour": float("inf")}, "must be a finite number"),
])
def test_a_profile_past_its_bounds_is_refused_at_once(spec: dict, said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        parse_profiles(_profile(**spec), "test")


def test_a_profile_with_too_many_types_is_refused() -> None:
    doc = _profile()
    doc["gpu_types"] = {f"t{i}": doc["gpu_types"]["x"] for i in range(MAX_TYPES + 1)}
    with pytest.raises(ConfigError, match=f"at most {MAX_TYPES} GPU types"):
        parse_profiles(doc, "test")


def test_a_detector_window_of_too_many_slots_is_refused_naming_both_variables() -> None:
    for env in ({"CHUNKSERVE_DETECTOR_SLOT_S": "1e-8"}, {"CHUNKSERVE_DETECTOR_WINDOW_S": "1e9"}):
        with pytest.raises(ConfigError, match="CHUNKSERVE_DETECTOR_WINDOW_S / CHUNKSERVE_DETECTOR_SLOT_S"):
            detector_settings(env)


def _one_line(args: list[str], said: str) -> None:
    res = CliRunner().invoke(app, args)
    assert res.exit_code != 0 and said in res.output and "Traceback" not in res.output, res.output


def test_files_past_the_bounds_are_one_line(tmp_path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000)
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"x": "\xe9"}')
    long_trace = tmp_path / "long.csv"
    long_trace.write_text("t_s,session_id,event\n0,a,open\n2000000,a,close\n")
    wide = tmp_path / "wide.csv"
    wide.write_text("t_s,session_id,event\n0," + "a" * 200_000 + ",open\n")
    _one_line(["place", str(deep)], "not JSON")
    _one_line(["simulate", str(trace), "-p", "rr", "-j", "1", "--table", str(deep)], "volatility_table: not JSON")
    _one_line(["simulate", str(trace), "-p", "rr", "-j", "1", "--profile", str(latin)], "not UTF-8")
    _one_line(["simulate", str(trace), "-p", "rr", "-j", "1", "--table", str(latin)], "not UTF-8")
    _one_line(["simulate", str(long_trace), "-p", "rr", "-j", "1"], "over the 1,000,000 a trace may give")
    _one_line(["simulate", str(wide), "-p", "rr", "-j", "1"], "not a CSV file")


def test_place_refuses_a_key_that_is_not_an_ascii_batch_size_and_a_number_past_the_digit_limit(tmp_path) -> None:
    doc = {"eta": 1.0, "alpha_s": 0.1, "beta_s_per_byte": 0.0,
           "gpu_types": {"x": {"capacity": 4, "latency": {"\u00b2": 0.5}}},
           "gpus": [{"id": "g", "type": "x"}], "sessions": [{"id": "s", "gpu": None, "state_bytes": 1}]}
    src = tmp_path / "in.json"
    src.write_text(json.dumps(doc))
    _one_line(["place", str(src)], "is not a batch size from 1 to")
    src.write_text(json.dumps(doc).replace('"state_bytes": 1', '"state_bytes": ' + "9" * 5000))
    _one_line(["place", str(src)], "not JSON (an integer of 5000 digits, past the 4300 a number may have here)")


def test_options_past_their_ranges_are_refused(tmp_path) -> None:
    _one_line(["trace", "gen", str(tmp_path / "t.csv"), "--seed", "-1"], "--seed")
    _one_line(["trace", "gen", str(tmp_path / "t.csv"), "--sessions", "2000000"], "--sessions")
    _one_line(["worker", "--metrics-port", "70000"], "--metrics-port")
