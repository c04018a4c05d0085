import json

import pytest
from typer.testing import CliRunner

from infra.cli import app

GOOD = {
    "eta": 1.0,
    "alpha_s": 0.02,
    "beta_s_per_byte": 4e-11,
    "gpu_types": {"h20": {"capacity": 4, "latency": {"1": 0.3, "2": 0.5, "4": 1.0}}},
    "gpus": [{"id": "g0", "type": "h20"}, {"id": "g1", "type": "h20"}],
    "sessions": [
        {"id": "a", "gpu": "g0", "state_bytes": 0},
        {"id": "b", "gpu": "g0", "state_bytes": 10**9},
        {"id": "c", "gpu": "g0", "state_bytes": 10**9},
        {"id": "d", "gpu": "g0", "state_bytes": 10**9},
        {"id": "e", "gpu": None, "state_bytes": 5},
    ],
}
# g0 holds 4 (1.0 s) and e waits: moving the free-to-move a (0.02 s) leaves 3 + 2 (0.75 s)
EXPECTED = {"placement": {"a": "g1", "b": "g0", "c": "g0", "d": "g0", "e": "g1"}, "moved": ["a"],
            "worst_latency_s": 0.75, "objective": 0.77}


def _run(tmp_path, doc, text=None):
    src = tmp_path / "in.json"
    src.write_text(text if text is not None else json.dumps(doc))
    out = tmp_path / "out.json"
    result = CliRunner().invoke(app, ["place", str(src), "--json", str(out)])
    return result, (json.loads(out.read_text()) if out.exists() else None)


def test_one_instance(tmp_path):
    result, out = _run(tmp_path, GOOD)
    assert result.exit_code == 0, result.output
    assert out["placement"] == EXPECTED["placement"] and out["moved"] == EXPECTED["moved"]
    assert out["worst_latency_s"] == pytest.approx(0.75) and out["objective"] == pytest.approx(0.77)


def test_batch_and_settings(tmp_path):
    frozen = dict(GOOD, max_moves=0)  # no move allowed: e joins g1, g0 stays at 1.0 s
    limited = dict(GOOD, max_transient_s=0.2)  # landing on g1 costs 0.02 + 0 + 0.3 s: too slow
    result, out = _run(tmp_path, {"instances": [GOOD, frozen, limited]})
    assert result.exit_code == 0, result.output
    first, second, third = out["results"]
    assert first["moved"] == ["a"]
    for r in (second, third):
        assert r["moved"] == [] and r["placement"]["e"] == "g1" and r["worst_latency_s"] == pytest.approx(1.0)


def test_no_limit_unless_the_document_names_one(tmp_path):
    """The document's problem is min L + eta * sum(kappa) with every move allowed; the live
    controller's move budget and transient limit apply only when the document gives them."""
    doc = {"eta": 0.1, "alpha_s": 0.02, "beta_s_per_byte": 0.0,
           "gpu_types": {"t": {"capacity": 4, "latency": {"1": 0.8, "2": 1.0, "4": 1.3}}},
           "gpus": [{"id": "g0", "type": "t"}, {"id": "g1", "type": "t"}],
           "sessions": [{"id": f"s{i}", "gpu": "g0", "state_bytes": 0} for i in range(4)]}
    shipped = dict(doc, max_moves=512, max_transient_s=1.4)  # a second move lands at 0.02 + 0.8 + 1.0 s
    result, out = _run(tmp_path, {"instances": [doc, shipped]})
    assert result.exit_code == 0, result.output
    free, limited = out["results"]
    assert len(free["moved"]) == 2 and free["worst_latency_s"] == pytest.approx(1.0)
    assert free["objective"] == pytest.approx(1.004)
    assert len(limited["moved"]) == 1 and limited["worst_latency_s"] == pytest.approx(1.15)
    assert limited["objective"] == pytest.approx(1.152)


def _bad(**change):
    doc = json.loads(json.dumps(GOOD))
    for path, value in change.items():
        *head, last = path.split("__")
        node = doc
        for key in head:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if value is KeyError:
            del node[last]
        elif isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return doc


@pytest.mark.parametrize(
    "doc, text, where",
    [
        (None, "{not json", "not JSON"),
        (None, '{"eta": 0.1, "eta": 100}', "file: key 'eta' given twice in one object"),
        (_bad(eta=KeyError), None, "eta: is required"),
        (_bad(alpha_s=-1), None, "alpha_s: must be"),
        (_bad(gpus__0__type="a100"), None, "gpus[0].type: no GPU type 'a100'"),
        (_bad(sessions__1__gpu="g9"), None, "sessions[1].gpu: no GPU 'g9'"),
        (_bad(sessions__2__state_bytes=True), None, "sessions[2].state_bytes"),
        (_bad(sessions__3__id="a"), None, "sessions[3].id: duplicate"),
        (_bad(gpu_types__h20__latency={"1": 0.5, "2": 0.4}), None, "gpu_types.h20.latency"),
        (_bad(gpu_types__h20__latency={"one": 0.5}), None, "gpu_types.h20.latency"),
        (_bad(gpu_types__h20__capacity=0), None, "gpu_types.h20.capacity"),
        (_bad(gpu_types__h20__capacity=3), None, "sessions: 4 on GPU 'g0', over its type's capacity 3"),
        ({"instances": [GOOD, _bad(gpus="g0")]}, None, "instances[1].gpus: must be a list"),
        ({"instances": {}}, None, "instances: must be a list"),
        ([1, 2], None, "document: must be an object"),
        (_bad(max_move=1), None, "max_move: not a key of this format"),  # a typo of max_moves
        (_bad(sessions__0__bytes=1), None, "sessions[0].bytes: not a key"),
        (_bad(sessions__0__state_bytes=KeyError), None, "sessions[0].state_bytes: is required"),
        (_bad(sessions__4__gpu=KeyError), None, "sessions[4].gpu: is required (a GPU id, or null"),  # was an arrival
        (_bad(gpus=KeyError), None, "gpus: is required (a list)"),
        (_bad(gpu_types__h20__latency=KeyError), None, "gpu_types.h20.latency: is required (an object)"),
        ({"instances": [GOOD] * 10_001}, None, "instances: at most 10,000 in one batch"),
        (_bad(sessions__0__state_bytes=2**63), None, "sessions[0].state_bytes: must be a whole number from 0"),
        (_bad(beta_s_per_byte=1e308), None, "beta_s_per_byte: must be a number from 0 to 1e+09"),
        (_bad(gpu_types__h20__latency={"1": 1e308}), None, "gpu_types.h20.latency.1: must be"),
        ({"instances": [GOOD], "eta": 1}, None, "eta: a batch holds only"),
        (_bad(sessions__0__gpu=["g0"]), None, "sessions[0].gpu: must be a GPU id (a string) or null"),
        (_bad(sessions__0__gpu={"id": "g0"}), None, "sessions[0].gpu: must be a GPU id"),
        (_bad(gpu_types__h20__latency={"9" * 5000: 0.5}), None, "gpu_types.h20.latency: key '99999999999999999999' is not"),
    ],
)
def test_bad_files_fail_in_one_line(tmp_path, doc, text, where):
    result, out = _run(tmp_path, doc, text)
    assert result.exit_code == 2 and out is None
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert str(tmp_path / "in.json") in lines[0] and where in lines[0], lines[0]


def test_a_byte_order_mark_is_no_error(tmp_path):
    result, out = _run(tmp_path, None, "\ufeff" + json.dumps(GOOD))
    assert result.exit_code == 0, result.output
    assert out["moved"] == EXPECTED["moved"]


def test_a_whole_number_written_as_a_float_is_taken(tmp_path):
    result, out = _run(tmp_path, _bad(sessions__1__state_bytes=1e9, sessions__2__state_bytes=1000000000.0))
    assert result.exit_code == 0 and out == EXPECTED, result.output


def test_a_file_past_the_size_bound_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "big.json"
    with big.open("wb") as f:
        f.truncate((64 << 20) + 1)  # sparse: nothing is written
    result = CliRunner().invoke(app, ["place", str(big)])
    assert result.exit_code == 2 and "file: larger than 64 MiB" in result.output and "Traceback" not in result.output


def test_missing_file(tmp_path):
    result = CliRunner().invoke(app, ["place", str(tmp_path / "nope.json")])
    assert result.exit_code == 2 and "nope.json" in result.output and "cannot read" in result.output


def test_a_file_not_utf8_and_sessions_with_no_room(tmp_path):
    src = tmp_path / "in.json"
    src.write_bytes(b"\xff\xfe{}")
    result = CliRunner().invoke(app, ["place", str(src)])
    assert result.exit_code == 2 and "not a UTF-8 text file" in result.output and "Traceback" not in result.output
    crowded = dict(GOOD, sessions=GOOD["sessions"] + [{"id": f"n{i}", "gpu": None, "state_bytes": 1} for i in range(4)])
    result, out = _run(tmp_path, crowded)  # 9 sessions for 8 slots: one has none, and the command says so
    assert result.exit_code == 0 and sum(g is None for g in out["placement"].values()) == 1
    assert "1 session(s) found no room" in result.output
    result, out = _run(tmp_path, {"instances": [GOOD, crowded, crowded]})  # a batch's note names the instance
    assert result.exit_code == 0 and [sum(g is None for g in r["placement"].values()) for r in out["results"]] == [0, 1, 1]
    lines = [x for x in result.output.splitlines() if "found no room" in x]
    assert [x.split(": ", 1)[1].split(" session")[0] for x in lines] == ["instances[1] (0-based): 1", "instances[2] (0-based): 1"]



def test_moved_is_in_the_plans_order_largest_kappa_first(tmp_path):
    """Not sorted by id: the order the plan issues the moves, the one the transient limit assumes."""
    sizes = (0, 2**28, 2**29, 2**30, 3 * 2**28, 2**31)  # a flat curve: 5 or more on a GPU cost 2 s, 4 or fewer 1 s
    doc = {"eta": 1.0, "alpha_s": 0.25, "beta_s_per_byte": 2**-30,
           "gpu_types": {"flat": {"capacity": 8, "latency": {"1": 1, "4": 1, "5": 2, "8": 2}}},
           "gpus": [{"id": "a", "type": "flat"}, {"id": "b", "type": "flat"}],
           "sessions": [{"id": f"s{i + 1}", "gpu": "a", "state_bytes": b} for i, b in enumerate(sizes)]
           + [{"id": f"t{i}", "gpu": "b", "state_bytes": 0} for i in (1, 2)]}
    result, out = _run(tmp_path, doc)
    assert result.exit_code == 0, result.output
    assert out["moved"] == ["s2", "s1"] and out["worst_latency_s"] == pytest.approx(1.0)


def test_a_move_exactly_at_the_transient_limit_lands(tmp_path):
    """0.5 + 0.0 + 0.1 == 0.6 in floats while 0.6 - 0.1 < 0.5: the limit holds as written,
    however the sum is grouped."""
    doc = {"max_transient_s": 0.6, "eta": 0.0, "alpha_s": 0.5, "beta_s_per_byte": 0,
           "gpu_types": {"t0": {"capacity": 3, "latency": {"1": 0.1, "3": 0.15}}, "t1": {"capacity": 2, "latency": {"1": 0.2, "2": 0.4}}},
           "gpus": [{"id": "g0", "type": "t1"}, {"id": "g1", "type": "t0"}, {"id": "g2", "type": "t1"}],
           "sessions": [{"id": "s0", "gpu": "g2", "state_bytes": 0}, {"id": "s1", "gpu": None, "state_bytes": 1}]}
    result, out = _run(tmp_path, doc)
    assert result.exit_code == 0 and out["moved"] == ["s0"] and out["objective"] == pytest.approx(0.125), result.output
