"""The simulator on tiny traces with known answers, determinism, plug-ins and the CLI."""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from infra.sim.simulator import SimConfig, simulate
from infra import sim_cli
from infra.sim_cli import register
from processors.latency import GpuProfile, LatencyModel, load_profiles
from processors.lifecycle import EventKind, SessionEvent
from processors.policy import load_policy
from schemas.errors import PolicyError

MODEL = load_profiles("paper")  # b300: l(1) = 0.30 s, l(2) = 0.32 s, 6.50 per hour
O, C = EventKind.OPEN, EventKind.CLOSE


def _ev(*rows):
    return [SessionEvent(t, s, k, b) for t, s, k, b in rows]


def test_one_gpu_two_sessions():
    ev = _ev((0, "a", O, 0), (0, "b", O, 0), (10, "a", C, 0), (10, "b", C, 0))
    r = simulate(load_policy("least-loaded-offload", model=MODEL), ev, MODEL, SimConfig(initial_gpus=1, round_s=0))
    assert r.worst_chunk_latency_s == pytest.approx(0.32)
    assert r.chunks == 2 * 31 and r.deadline_miss_rate == 0
    assert r.gpu_seconds == pytest.approx(10) and r.cost == pytest.approx(10 * 6.5 / 3600)


def test_forced_migration_pauses_for_its_cost():
    ev = _ev((0, "a", O, 10**9), (0, "b", O, 10**9), (10, "a", C, 0), (10, "b", C, 0))
    pol = load_policy("tests.sim.plugin:PackThenMigrate")
    r = simulate(pol, ev, MODEL, SimConfig(initial_gpus=2, round_s=0))
    # b leaves at the chunk boundary 5.12, travels 0.02 + 1e9 / 25e9 = 0.06 s, runs alone 0.30 s
    assert r.migrations == 1 and r.invalid_commands == 0
    assert r.worst_chunk_latency_s == pytest.approx(5.12 + 0.06 + 0.30 - 5.12)


def test_a_gpu_that_holds_a_session_is_not_retired():
    ev = _ev((0, "a", O, 10**9), (10, "a", C, 0))
    r = simulate(load_policy("tests.sim.plugin:RetireBusy"), ev, MODEL, SimConfig(initial_gpus=2, round_s=0))
    # the Retire at 5.0 is refused (a holds the GPU); its Place of a, placed already, too
    assert r.invalid_commands == 2 and r.scale_events == 0
    assert r.worst_chunk_latency_s == pytest.approx(0.30) and r.gpu_seconds == pytest.approx(20)
    ev = _ev((0, "a", O, 10**9), (10, "a", C, 0))
    r = simulate(load_policy("tests.sim.plugin:RetireBusy", empty=True), ev, MODEL, SimConfig(initial_gpus=2, round_s=0))
    # the empty GPU is: a scale-in without a drain, billed until then
    assert r.invalid_commands == 0 and r.scale_events == 1 and r.gpu_seconds == pytest.approx(15)


@pytest.mark.parametrize("plugin", ["Malformed", "OffloadElsewhere"])
def test_a_malformed_or_misdirected_command_is_counted_not_carried_out(plugin):
    I, A = EventKind.IDLE, EventKind.ACTIVE
    ev = _ev((0, "a", O, 10**9), (0, "b", O, 0), (3, "a", I, 10**9), (6, "a", A, 10**9), (10, "a", C, 0), (10, "b", C, 0))
    r = simulate(load_policy(f"tests.sim.plugin:{plugin}"), ev, MODEL, SimConfig(initial_gpus=2, round_s=0))
    assert r.invalid_commands >= (10 if plugin == "Malformed" else 1) and r.chunks > 0
    assert sum(r.invalid_by_kind.values()) == r.invalid_commands  # said per kind
    if plugin == "Malformed":  # each named by its command's kind ("malformed": no command at all)
        assert r.invalid_by_kind.get("malformed retire", 0) >= 1 and r.invalid_by_kind.get("malformed admit", 0) >= 3
        assert r.invalid_by_kind.get("malformed", 0) >= 1 and sum(v for k, v in r.invalid_by_kind.items() if k.startswith("malformed")) >= 10
    else:
        assert r.invalid_by_kind.get("offload", 0) >= 1


def test_whole_boots_of_any_number_type_run_and_an_offload_with_nothing_to_do_is_no_error():
    """A plug-in's arithmetic may give 3.0 or numpy's int64 for a count: a whole number
    boots; offloading a session the simulator has offloaded already finds nothing to do."""
    I, A = EventKind.IDLE, EventKind.ACTIVE
    ev = _ev((0, "a", O, 10**9), (3, "a", I, 10**9), (70, "a", A, 10**9), (80, "a", C, 0))
    r = simulate(load_policy("tests.sim.plugin:WholeBoots"), ev, MODEL, SimConfig(initial_gpus=1, round_s=0))
    assert r.invalid_commands == 0 and r.scale_events == 2 and r.chunks > 0
    assert r.gpu_seconds == pytest.approx(3 * 80)  # the two booted at 0 billed from their boot request to the end


def test_a_resident_policy_sees_which_idle_sessions_it_offloaded():
    """An idle session whose state is off every GPU shows ``restore`` True (placing it
    would restore it); one that opened idle shows False and may rest on a GPU."""
    I, A = EventKind.IDLE, EventKind.ACTIVE
    ev = _ev((0, "a", O, 10**9), (0, "b", O, 0), (0, "b", I, 0), (3, "a", I, 10**9), (6, "a", A, 10**9),
             (9, "a", I, 10**9), (12, "b", A, 0), (20, "a", C, 0), (20, "b", C, 0))
    r = simulate(load_policy("tests.sim.plugin:OffloadThenSee"), ev, MODEL, SimConfig(initial_gpus=1, round_s=0))
    assert r.invalid_commands == 0 and r.chunks > 0


def test_commands_that_are_not_a_tuple_are_named_in_one_line():
    with pytest.raises(PolicyError, match="'not-a-tuple': decide at t=[0-9.]+ s returned commands as str, not a tuple or list of commands"):
        simulate(load_policy("tests.sim.plugin:NotATuple"), _ev((0, "a", O, 0), (10, "a", C, 0)), MODEL,
                 SimConfig(initial_gpus=1, round_s=0))


def test_a_reinstated_gpu_takes_sessions_again_and_one_not_draining_is_refused():
    """The second GPU, drained at 0 s, is taken back at 5 s: b, opening at 7 s, is placed on
    it at once; never taken back, every Place of b there is refused and b waits to the end."""
    ev = _ev((0, "a", O, 0), (7, "b", O, 0), (20, "a", C, 0), (20, "b", C, 0))
    r = simulate(load_policy("tests.sim.plugin:DrainThenReinstate"), ev, MODEL, SimConfig(initial_gpus=2, round_s=0))
    assert r.invalid_by_kind == {"reinstate": 1}  # the first GPU's: it was not draining
    assert r.scale_events == 2 and r.worst_chunk_latency_s < 1.0
    never = simulate(load_policy("tests.sim.plugin:DrainThenReinstate", at=100.0), ev, MODEL, SimConfig(initial_gpus=2, round_s=0))
    assert never.invalid_by_kind == {"place": 3} and never.worst_chunk_latency_s == pytest.approx(13.0)


def test_scale_out_waits_for_boot():
    ev = _ev((0, "a", O, 0), (100, "a", C, 0))
    r = simulate(load_policy("tests.sim.plugin:BootOne"), ev, MODEL, SimConfig(initial_gpus=0, boot_s=60, round_s=0))
    assert r.scale_events == 1
    assert r.worst_chunk_latency_s == pytest.approx(60.30)
    assert r.gpu_seconds == pytest.approx(100)  # billed from the boot request


def test_warm_start_readies_the_first_instants_scale_out_only():
    ev = _ev((0, "a", O, 0), (0, "b", O, 0), (100, "a", C, 0), (100, "b", C, 0))
    pol = load_policy("tests.sim.plugin:BootOne")
    r = simulate(pol, ev, MODEL, SimConfig(initial_gpus=0, boot_s=60, round_s=0, warm_start=True))
    assert r.scale_events == 1 and r.invalid_commands == 0
    assert r.worst_chunk_latency_s == pytest.approx(0.32)  # no boot wait
    assert r.gpu_seconds == pytest.approx(100)
    late = _ev((0, "a", O, 0), (100, "a", C, 0))
    again = simulate(load_policy("tests.sim.plugin:BootAt", at=10.0), late, MODEL, SimConfig(initial_gpus=0, boot_s=60, round_s=0, warm_start=True))
    assert again.worst_chunk_latency_s == pytest.approx(70.30)  # asked after the first instant: boots


def _app():
    app = typer.Typer()
    register(app)
    app.command("noop")(lambda: None)
    return app


def _generated(run: CliRunner, app: typer.Typer, trace: Path, **knobs: int) -> Path:
    """``chunkserve trace gen`` with ``knobs`` (level, duration, sessions, seed) into ``trace``."""
    args = [x for k, v in knobs.items() for x in (f"--{k}", str(v))]
    res = run.invoke(app, ["trace", "gen", *args, "-o", str(trace)])
    assert res.exit_code == 0, res.output
    return trace


def test_cli_is_deterministic_and_reports(tmp_path):
    run, app = CliRunner(), _app()
    trace = _generated(run, app, tmp_path / "t.csv", level=5, duration=240, sessions=150, seed=2)
    outs = []
    for i in range(2):
        out = tmp_path / f"o{i}.json"
        args = ["simulate", str(trace), "--json", str(out)] + (["--plot", str(tmp_path / "p.png")] if i == 0 else [])
        res = run.invoke(app, args)
        assert res.exit_code == 0, res.output
        doc = json.loads(out.read_text())
        doc.pop("wall_s")
        took = doc.pop("decide_s")  # host times: each reported policy's decisions, counted and timed
        assert set(took) == set(doc["policies"]) and all(d["calls"] > 0 and 0 < d["mean"] <= d["max"] for d in took.values())
        outs.append(doc)
    assert outs[0] == outs[1]
    doc = outs[0]
    assert set(doc["policies"]) == {"rr", "lag", "mag", "least-loaded-offload", "lag-offload", "mag-offload", "turboserve",
                                    "turboserve-no-migration", "turboserve-no-autoscale", "oracle", "oracle-autoscale", "telefuser"}
    assert set(doc["matched_cost"]["worst_latency_reduction_pct"]) == {"rr", "lag", "mag", "least-loaded-offload", "lag-offload", "mag-offload"}
    assert "oracle_gap_pct" in doc and (tmp_path / "p.png").stat().st_size > 0
    assert set(doc["oracle"]) == {"u_target", "matched"}
    paper = doc["paper"]
    assert set(paper["matched_cost"]["worst_latency_reduction_pct"]) == set(paper["matched_latency"]["cost_reduction_pct"]) == {"rr", "lag", "mag"}
    oracle = doc["policies"]["oracle"]["cost"]
    assert paper["oracle_gap_pct"] == pytest.approx(100 * (doc["policies"]["turboserve"]["cost"] - oracle) / oracle)
    slo = doc["slo"]
    assert slo["miss_rate"] == 0.001 and slo["worst_s"] == 3.0 and slo["oracle_cost"] > 0  # the oracle told the SLO
    for name, m in doc["policies"].items():
        if name in slo["met"] and name not in slo["pool_size"] and name not in ("turboserve", "turboserve-no-migration", "oracle"):
            # elastic and not configured by the SLO: judged on its own run
            assert slo["met"][name] == (m["deadline_miss_rate"] <= 0.001 and m["worst_chunk_latency_s"] <= 3.0)
            assert slo["cost"][name] == m["cost"]
    if slo["fixed_pool_policy"] is not None:
        assert slo["fixed_pool_cost"] == min(c for n, c in slo["cost"].items() if n in slo["pool_size"] and slo["met"][n] and n != "turboserve-no-autoscale")


def test_cli_user_errors_are_one_line(tmp_path):
    app = _app()
    bad = tmp_path / "bad.csv"
    bad.write_text("t_s,session_id,event\n0,a,open\n1,a,fly\n")
    for args in (["simulate", str(bad)], ["simulate", str(tmp_path / "none.csv")], ["simulate", str(bad), "-p", "nope"]):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2 and "Traceback" not in res.output
        assert len(res.output.strip().splitlines()) == 1, res.output
    ok = tmp_path / "ok.csv"
    ok.write_text("t_s,session_id,event\n0,a,open\n1,a,close\n")
    res = CliRunner().invoke(app, ["simulate", str(ok), "-p", "nosuchmod:X"])
    assert res.exit_code == 2 and "nosuchmod:X: policy: cannot import" in res.output, res.output  # no emoji
    # an output it cannot write is named before the run, not after it
    (tmp_path / "file").write_text("")
    for args, why in ((["--json", str(tmp_path)], "json: is a folder"), (["--plot", str(tmp_path / "file" / "p.png")], "plot: cannot make its folder")):
        res = CliRunner().invoke(app, ["simulate", str(ok), "-p", "rr", *args])
        assert res.exit_code == 2 and why in res.output and len(res.output.strip().splitlines()) == 1, res.output
    # a folder it may write in that still refuses the file (/proc) was a raw errno after the run
    res = CliRunner().invoke(app, ["simulate", str(ok), "-p", "rr", "--json", "/proc/chunkserve-o.json"])
    assert res.exit_code == 2 and "--json: cannot write" in res.output and len(res.output.strip().splitlines()) == 1, res.output
    res = CliRunner().invoke(app, ["simulate", str(ok), "-p", "rr", "--json", str(tmp_path / "new" / "o.json")])
    assert res.exit_code == 0 and json.loads((tmp_path / "new" / "o.json").read_text())["policies"]["rr"]
    assert "note:" not in res.output  # it starts at 0
    # a launch whose first session comes a moment after 0 is no news (it came at 0.144 s)
    soon = tmp_path / "soon.csv"
    soon.write_text("t_s,session_id,event\n0.5,a,open\n300,a,close\n")
    res = CliRunner().invoke(app, ["simulate", str(soon), "-p", "rr"])
    assert res.exit_code == 0 and "note:" not in res.output, res.output
    soon.write_text("t_s,session_id,event\n0,a,open\n0,a,close\n")  # all at 0: nothing starts late
    res = CliRunner().invoke(app, ["simulate", str(soon), "-p", "rr"])
    assert res.exit_code == 0 and "note:" not in res.output, res.output
    # memory is no bound in the simulator: a trace whose K sessions would not fit is told so
    heavy = tmp_path / "heavy.csv"
    heavy.write_text("t_s,session_id,event,state_mb\n0,a,open,20000\n0,b,open,9000\n300,a,close,\n300,b,close,\n")
    res = CliRunner().invoke(app, ["simulate", str(heavy), "-p", "rr"])
    assert res.exit_code == 0 and "not by memory" in res.output and "580 GB" in res.output, res.output
    # a trace that starts later is replayed from 0: said, since a launch's opening pool is sized from 0
    late = tmp_path / "late.csv"
    late.write_text("t_s,session_id,event\n200,a,open\n201,a,close\n")
    res = CliRunner().invoke(app, ["simulate", str(late), "-p", "rr"])
    assert res.exit_code == 0 and "the first row is at 200 s" in res.output, res.output
    # a GPU type without a price: every comparison would read 0, so it is refused in one line
    free = tmp_path / "free.json"
    free.write_text(json.dumps({"format": "chunkserve.latency-profile", "version": 1, "gpu_types": {
        "x": {"capacity": 4, "cost_per_hour": 0, "latency_s": {"1": 0.1}}}}))
    res = CliRunner().invoke(app, ["simulate", str(ok), "-p", "rr", "--profile", str(free), "--gpu-type", "x"])
    assert res.exit_code == 2 and "gpu_types.x.cost_per_hour: is 0" in res.output and len(res.output.strip().splitlines()) == 1
    # a profile's batch size that is no whole number, and one so fast a replay could not hold its chunks
    for lat, why in (({"1.5": 0.1, "4": 0.5}, "gpu_types.x.latency_s: key '1.5' is not a batch size"),
                     ({"1": 1e-9}, "gpu_types.x.latency_s: a one-session chunk of 1e-09 s")):
        prof = tmp_path / "prof.json"
        prof.write_text("\ufeff" + json.dumps({"format": "chunkserve.latency-profile", "version": 1, "gpu_types": {
            "x": {"capacity": 4, "cost_per_hour": 1, "latency_s": lat}}}))  # a BOM is no error
        res = CliRunner().invoke(app, ["simulate", str(ok), "-p", "rr", "--profile", str(prof), "--gpu-type", "x"])
        assert res.exit_code == 2 and why in res.output and len(res.output.strip().splitlines()) == 1, res.output
    # a generated trace with no session is refused, not written empty (simulate would refuse it)
    res = CliRunner().invoke(app, ["trace", "gen", "--family", "weekly", "--duration", "10", "--sessions", "5", "-o", str(tmp_path / "e.csv")])
    assert res.exit_code == 2 and "--sessions: no session arrives in 10 s" in res.output and not (tmp_path / "e.csv").exists()
    res = CliRunner().invoke(app, ["simulate", str(ok), "-p", "telefu"])  # the peers are among the names offered
    assert res.exit_code == 2 and "telefuser, kubernetes-hpa, ray-serve, ray-serve-auto (peers)" in res.output
    # a family has its own shape: the generator's options beside it are refused, not ignored
    res = CliRunner().invoke(app, ["trace", "gen", "--family", "flash", "--state-mb", "50", "-o", str(tmp_path / "f.csv")])
    assert res.exit_code == 2 and "--state-mb: shapes the project's generator only" in res.output and not (tmp_path / "f.csv").exists()


def test_a_bad_option_of_the_simulator_commands_reads_as_a_usage_error(tmp_path):
    """The options a command checks itself (a pair that does not go together, a profile that is
    neither a built-in nor a file) read as click's own usage errors do, as the README says, with
    the option named: an outside reader met `configuration error: command line: ...` and
    `configuration error: nosuch: profile: ...` (the value where the option belongs)."""
    app = _app()
    ok = tmp_path / "ok.csv"
    ok.write_text("t_s,session_id,event\n0,a,open\n30,a,close\n")
    for args, said in ((["simulate", str(ok), "--profile", "nosuch"],
                        "usage error: chunkserve simulate: --profile: no built-in profile 'nosuch' (have paper, "),
                       (["evaluate", "--trace", str(ok), "--split", "heldout"],
                        "usage error: chunkserve evaluate: --trace: give --split or --trace, not both "
                        "(see chunkserve evaluate --help)"),
                       (["tune", "-o", str(tmp_path / "t.json"), "--profile", "nosuch"],
                        "usage error: chunkserve tune: --profile: "),
                       (["trace", "gen", "--family", "creators", "--offset", "10", "-o", str(tmp_path / "g.csv")],
                        "usage error: chunkserve trace gen: --offset: sets the first slot of --family classes only"),
                       (["trace", "gen", "--family", "nope", "-o", str(tmp_path / "g.csv")],
                        "usage error: chunkserve trace gen: --family: 'nope': not a family (give one of calm, ")):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2 and res.output.startswith(said), res.output
        assert len(res.output.strip().splitlines()) == 1
    missing = tmp_path / "missing.json"  # a file named that cannot be read is the file's error
    res = CliRunner().invoke(app, ["simulate", str(ok), "--profile", str(missing)])
    assert res.exit_code == 2 and res.output.startswith(f"configuration error: {missing}: profile: cannot read")


def test_a_profile_of_one_gpu_type_pools_that_type_and_one_of_several_without_b300_asks(tmp_path):
    """A user's own profile names its own type: it was refused for lacking b300 unless
    --gpu-type named it."""
    app = _app()
    ok = tmp_path / "ok.csv"
    ok.write_text("t_s,session_id,event\n0,a,open\n30,a,close\n")
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    gpu = {"capacity": 4, "cost_per_hour": 1.0, "latency_s": {"1": 0.1, "4": 0.4}}
    one.write_text(json.dumps({"format": "chunkserve.latency-profile", "version": 1, "gpu_types": {"x": gpu}}))
    two.write_text(json.dumps({"format": "chunkserve.latency-profile", "version": 1, "gpu_types": {"x": gpu, "y": gpu}}))
    res = CliRunner().invoke(app, ["simulate", str(ok), "-p", "rr", "-j", "1", "--profile", str(one), "--json", str(tmp_path / "o.json")])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "o.json").read_text())["policies"]["rr"]["worst_chunk_latency_s"] == pytest.approx(0.1)
    res = CliRunner().invoke(app, ["simulate", str(ok), "-p", "rr", "-j", "1", "--profile", str(two)])
    assert res.exit_code == 2 and "several GPU types and no b300" in res.output and "x, y" in res.output
    assert len(res.output.strip().splitlines()) == 1
    res = CliRunner().invoke(app, ["tune", "-o", str(tmp_path / "t.json"), "--levels", "1", "--duration", "60",
                                   "--sessions", "5", "--profile", str(one)])  # tune too (it asked for b300)
    assert res.exit_code == 0 and len(json.loads((tmp_path / "t.json").read_text())["levels"]) == 10, res.output


def test_plugin_policy_by_path_runs_through_simulate(tmp_path):
    app = _app()
    trace = tmp_path / "t.csv"
    trace.write_text("t_s,session_id,event,state_mb\n0,a,open,10\n0,b,open,10\n8,a,close,\n")
    res = CliRunner().invoke(app, ["simulate", str(trace), "-p", "tests.sim.plugin:PackThenMigrate", "--pool", "2", "--json", str(tmp_path / "o.json")])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "o.json").read_text())["policies"]["pack-then-migrate"]["migrations"] == 1  # keyed by name


def test_cli_burst_memory_zero_turns_the_reserve_off(tmp_path):
    """100 sessions execute; 100 more open at 200 s and close at 320 s. The reserve holds
    GPUs for that rise after it has gone (for 900 s, fading); ``--burst-memory 0`` lets
    them go."""
    rows = ["t_s,session_id,event,state_mb"] + [f"0,s{i},open,500" for i in range(100)]
    rows += [f"200,c{i},open,500" for i in range(100)] + [f"320,c{i},close," for i in range(100)]
    trace = tmp_path / "crowd.csv"
    trace.write_text("\n".join(rows + [f"900,s{i},close," for i in range(100)]) + "\n")
    run, app = CliRunner(), _app()
    docs = _turboserve_at(run, app, trace, tmp_path, "--burst-memory", ("900", "0"))
    assert docs["0"]["gpu_seconds"] < docs["900"]["gpu_seconds"]


def _turboserve_at(run, app, trace, folder, option, values):
    """turboserve's figures from ``simulate TRACE -p turboserve OPTION VALUE`` at each value."""
    docs = {}
    for value in values:
        out = folder / f"{option.strip('-')}-{value}.json"
        res = run.invoke(app, ["simulate", str(trace), "-p", "turboserve", option, value, "--json", str(out), "-j", "1"])
        assert res.exit_code == 0, res.output
        docs[value] = json.loads(out.read_text())["policies"]["turboserve"]
    return docs


def test_cli_settle_zero_holds_a_reserve_for_sessions_that_come_back(tmp_path):
    """200 sessions execute; 100 go idle for 30 s and come back. By default the return is
    to a level the pool held moments before, no burst: ``--settle 0`` counts it in full and
    holds GPUs for it to the end of the trace."""
    rows = ["t_s,session_id,event,state_mb"] + [f"0,s{i},open,500" for i in range(200)]
    rows += [f"300,s{i},idle," for i in range(100)] + [f"330,s{i},active," for i in range(100)]
    trace = tmp_path / "dip.csv"
    trace.write_text("\n".join(rows + [f"900,s{i},close," for i in range(200)]) + "\n")
    run, app = CliRunner(), _app()
    docs = _turboserve_at(run, app, trace, tmp_path, "--settle", ("120", "0"))
    assert docs["120"]["gpu_seconds"] < docs["0"]["gpu_seconds"]
    assert docs["120"]["worst_chunk_latency_s"] == docs["0"]["worst_chunk_latency_s"]
    bad = run.invoke(app, ["simulate", str(trace), "-p", "turboserve", "--settle", "-1"])
    assert bad.exit_code != 0 and "--settle" in bad.output


def test_cli_min_gpus_one_leaves_a_quiet_pool_no_room_for_a_crowd(tmp_path):
    """Four sessions for five minutes, then 60 open at once: the default floor of two GPUs
    (N + 1) holds the crowd's first chunks at a lower worst chunk than ``--min-gpus 1``,
    for what the second GPU costs."""
    rows = ["t_s,session_id,event,state_mb"] + [f"0,q{i},open,500" for i in range(4)]
    rows += [f"300,c{i},open,500" for i in range(60)] + [f"600,{s},close," for s in [f"q{i}" for i in range(4)] + [f"c{i}" for i in range(60)]]
    trace = tmp_path / "crowd.csv"
    trace.write_text("\n".join(rows) + "\n")
    run, app = CliRunner(), _app()
    docs = _turboserve_at(run, app, trace, tmp_path, "--min-gpus", ("2", "1"))
    assert docs["2"]["worst_chunk_latency_s"] < docs["1"]["worst_chunk_latency_s"]
    assert docs["2"]["gpu_seconds"] > docs["1"]["gpu_seconds"]
    bad = run.invoke(app, ["simulate", str(trace), "-p", "turboserve", "--min-gpus", "-1"])
    assert bad.exit_code != 0 and "--min-gpus" in bad.output


def test_cli_follow_worst_zero_runs_the_table_u_star_alone(tmp_path):
    """Without an SLO turboserve runs hotter once a slow chunk has been measured (the worst
    chunk stays what it was); ``--follow-worst 0`` turns that off."""
    run, app = CliRunner(), _app()
    trace = _generated(run, app, tmp_path / "t.csv", level=10, duration=600, sessions=400, seed=1)
    docs = _turboserve_at(run, app, trace, tmp_path, "--follow-worst", ("0.75", "0"))
    assert docs["0.75"]["gpu_seconds"] < docs["0"]["gpu_seconds"]
    assert docs["0.75"]["worst_chunk_latency_s"] == docs["0"]["worst_chunk_latency_s"]
    bad = run.invoke(app, ["simulate", str(trace), "-p", "turboserve", "--follow-worst", "1.5"])
    assert bad.exit_code != 0 and "--follow-worst" in bad.output


def test_a_return_whose_restore_outlasts_its_spell_is_counted():
    """A restore that cannot land within the spell was counted nowhere (a policy too slow
    to restore looked perfect): the return's resume latency is its whole spell, and a wait
    for room before the restore began counts as a chunk that long."""
    I, A = EventKind.IDLE, EventKind.ACTIVE
    big = 250 * 10**9  # restored in 0.05 + 250e9 / 12e9 = 20.88 s
    ev = _ev((0, "a", O, big), (0, "b", O, 10**7), (5, "a", I, big), (10, "a", A, big), (20, "a", C, 0), (20, "b", C, 0))
    r = simulate(load_policy("least-loaded-offload", model=MODEL), ev, MODEL, SimConfig(initial_gpus=1, round_s=0))
    assert r.worst_resume_latency_s == pytest.approx(10.0)  # never served: the whole spell, 10 s
    assert r.worst_chunk_latency_s < 1.0  # the restore itself is left out of chunk latency
    # one GPU of K = 40, full when `a` comes back at 2: it waits for room until 5, then its
    # restore begins and it goes idle at 8, still on the way
    full = [(1, f"s{k}", O, 0) for k in range(40)]
    ev = _ev((0, "a", O, big), (0.5, "a", I, big), *full, (2, "a", A, big), (5, "s0", C, 0), (8, "a", I, big),
             *[(30, f"s{k}", C, 0) for k in range(1, 40)], (30, "a", C, 0))
    r = simulate(load_policy("least-loaded-offload", model=MODEL), ev, MODEL, SimConfig(initial_gpus=1, round_s=0))
    assert r.worst_chunk_latency_s == pytest.approx(3.0) and r.missed_chunks >= 1
    assert r.worst_resume_latency_s == pytest.approx(6.0)


@pytest.mark.parametrize("policy", ["least-loaded-offload", "rr", "turboserve"])
def test_a_spell_that_ends_inside_a_chunk_run_past_its_deadline_counts_that_chunk(policy):
    """A session whose spell ends before the chunk it waits for, having waited past its
    deadline, counted nowhere: with chunks slower than every spell a run read as perfect
    (0 chunks, worst 0, no miss). It counts once, as long as its wait; a spell that ends
    within its deadline owes nothing."""
    slow = LatencyModel({"b300": GpuProfile("b300", 4, 2.0, ((1, 20.0), (4, 20.0)))})
    cfg = SimConfig(initial_gpus=1, round_s=0)
    r = simulate(load_policy(policy, model=slow), _ev((0, "a", O, 0), (10, "a", C, 0)), slow, cfg)
    assert r.chunks == 1 and r.worst_chunk_latency_s == pytest.approx(10.0) and r.deadline_miss_rate == 1.0
    # the same for a session that goes idle (offloaded or resident) inside a chunk it needed 4 s ago
    I = EventKind.IDLE
    ev = _ev((0, "a", O, 0), (0, "b", O, 0), (4, "b", I, 0), (30, "a", C, 0), (30, "b", C, 0))
    r = simulate(load_policy(policy, model=slow), ev, slow, cfg)
    # b: 4 s; a: its chunk 0-20, then 10 s of the next when it closes
    assert r.worst_chunk_latency_s == pytest.approx(20.0) and r.missed_chunks == r.chunks == 3
    short = simulate(load_policy(policy, model=MODEL), _ev((0, "a", O, 0), (0.2, "a", C, 0)), MODEL, SimConfig(initial_gpus=1, round_s=0))
    assert short.chunks == 0 and short.missed_chunks == 0  # 0.2 s: within its deadline, no chunk owed


@pytest.mark.parametrize("policy", ["rr", "lag", "mag"])
def test_resident_sessions_woken_at_one_instant_share_the_chunk(policy):
    """Pinned sessions that wake at one instant on an idle GPU run in one chunk, as
    sessions admitted together do; the first woken used to start a chunk alone and the
    others waited it out (l(1) + l(4) instead of l(5))."""
    I, A = EventKind.IDLE, EventKind.ACTIVE
    ids = [f"s{k}" for k in range(5)]
    ev = _ev(*[(0, s, O, 0) for s in ids], *[(2, s, I, 0) for s in ids], *[(10, s, A, 0) for s in ids],
             *[(12, s, C, 0) for s in ids])
    r = simulate(load_policy(policy, model=MODEL), ev, MODEL, SimConfig(initial_gpus=1, round_s=0))
    assert r.worst_chunk_latency_s == pytest.approx(MODEL["b300"].latency(5))


def test_admission_entries_for_no_gpu_or_no_session_are_invalid_commands():
    ev = _ev((0, "a", O, 0), (1, "b", O, 0), (10, "a", C, 0), (10, "b", C, 0))
    r = simulate(load_policy("tests.sim.plugin:BadAdmit"), ev, MODEL, SimConfig(initial_gpus=1, round_s=0))
    assert r.invalid_commands == 2 and r.chunks > 0  # the good entry still admits


def test_an_offloaded_idle_session_is_not_rested_on_a_gpu_again_for_free():
    """Only a session never placed (one that opened idle) may be rested on a GPU while idle:
    one whose state was offloaded came back with its next activation running where it rested,
    with no restore paid."""
    I, A = EventKind.IDLE, EventKind.ACTIVE
    big = 100 * 10**9  # a restore of 0.05 + 100e9 / 12e9 = 8.38 s
    ev = _ev((0, "a", O, big), (2, "a", I, big), (10, "a", A, big), (30, "a", C, 0))
    r = simulate(load_policy("tests.sim.plugin:OffloadThenRest"), ev, MODEL, SimConfig(initial_gpus=1, round_s=1.0))
    assert r.invalid_commands >= 1  # the Place of the offloaded idle session
    assert r.worst_resume_latency_s > 8.0  # its return paid the restore


@pytest.mark.parametrize("policy", ["rr", "lag", "mag"])
def test_a_pinned_baseline_holds_a_slot_for_a_session_that_opens_idle(policy):
    """The paper's baselines place a session at its open and keep it there to its close, so
    one that opens idle holds one of its GPU's K slots too (before, only sessions seen
    executing were placed, and a pool full of idle-opened sessions looked empty)."""
    I = EventKind.IDLE
    idle = [row for k in range(40) for row in ((0, f"s{k}", O, 10**9), (0, f"s{k}", I, 10**9))]
    ev = _ev(*idle, (1, "late", O, 10**9), (20, "late", C, 0), *[(20, f"s{k}", C, 0) for k in range(40)])
    pinned = simulate(load_policy(policy, model=MODEL), ev, MODEL, SimConfig(initial_gpus=1, round_s=0))
    # K = 40 slots, all held by the sessions that opened idle: `late` waits its whole spell
    assert pinned.invalid_commands == 0 and pinned.worst_chunk_latency_s == pytest.approx(19.0)
    offload = simulate(load_policy("least-loaded-offload", model=MODEL), ev, MODEL, SimConfig(initial_gpus=1, round_s=0))
    assert offload.worst_chunk_latency_s == pytest.approx(0.30)  # idle sessions hold nothing there


def test_the_plot_draws_the_runs_the_table_reports(tmp_path):
    """A fixed pool's timeline is its run at matched cost, the one its row and JSON give (the
    plot drew whichever of its runs the cache held first: `rr` at its SLO pool of 29 GPUs
    beside a row for 12)."""
    from infra.sim.report import Runner, compare, timelines
    from infra.sim.trace import load_trace
    from processors.autoscaler import AutoscalerConfig
    from processors.volatility import load_volatility_table
    from infra.sim_cli import _builtin_options

    run, app = CliRunner(), _app()
    trace = _generated(run, app, tmp_path / "t.csv", level=5, duration=240, sessions=150, seed=2)
    vt, auto = load_volatility_table(), AutoscalerConfig()
    runner = Runner(load_trace(trace), load_profiles("paper"), SimConfig(), _builtin_options(vt, auto),
                    offer={"table": vt, "autoscaler": auto})
    names = ["rr", "least-loaded-offload", "turboserve"]
    doc = compare(runner, names, jobs=2)  # the runs made in a process pool, the SLO searches first
    lines = timelines(runner, names)
    for name in ("rr", "least-loaded-offload"):
        pool = doc["matched_cost"]["pool_size"][name]
        assert set(lines[name]["gpus"]) == {pool}, (name, pool)
        assert pool != doc["slo"]["pool_size"][name]  # the run the plot drew before
    # 240 s: four windows of 60 s, none past the end
    assert lines["turboserve"]["gpus"] == runner.reported["turboserve"].timeline["gpus"][:4]
    assert {len(v) for v in lines["turboserve"].values()} == {4}


def test_the_plot_draws_no_window_past_the_trace_end(tmp_path):
    """A trace whose last row falls on a window's edge (120 s, windows of 60 s) is drawn over
    two windows, not three (a third, at 0 sessions and a 0 s worst chunk, read as a minute the
    trace does not have); what the last instant held goes into the window before it."""
    from infra.sim.report import Runner, timelines
    from infra.sim.trace import load_trace

    trace = tmp_path / "t.csv"
    trace.write_text("t_s,session_id,event,state_mb\n0,a,open,100\n0,b,open,100\n50,b,close,\n120,a,close,\n")
    runner = Runner(load_trace(trace), load_profiles("paper"), SimConfig())
    run = runner.run("rr")
    runner.reported["rr"] = run
    (line,) = timelines(runner, ["rr"]).values()
    assert len(run.timeline["gpus"]) == 3 and {k: len(v) for k, v in line.items()} == dict.fromkeys(line, 2)
    assert line["worst_latency_s"][-1] == max(run.timeline["worst_latency_s"][1:])
    trace.write_text("t_s,session_id,event,state_mb\n0,a,open,100\n119.4,a,close,\n")
    runner = Runner(load_trace(trace), load_profiles("paper"), SimConfig())
    runner.reported["rr"] = runner.run("rr")
    assert {len(v) for v in timelines(runner, ["rr"])["rr"].values()} == {2}


def test_a_move_of_a_session_whose_restore_has_not_landed_starts_once_it_has():
    """A plug-in that restored a session and moved it in the same decision paid the move
    alone (0.80 s to its first chunk's end, against 1.58 s for the restore alone): the state
    now lands where it was restored (0.05 + 12e9 / 12e9 = 1.05 s), then moves (0.02 + 12e9 /
    25e9 = 0.50 s), then runs (0.30 s)."""
    ev = [SessionEvent(0, "a", O, 12 * 10**9), SessionEvent(5, "a", EventKind.IDLE, 0),
          SessionEvent(20, "a", EventKind.ACTIVE, 0), SessionEvent(30, "a", C, 0)]
    r = simulate(load_policy("tests.sim.plugin:RestoreThenMove"), ev, MODEL, SimConfig(initial_gpus=2, round_s=0))
    assert r.migrations == 1 and r.invalid_commands == 0
    assert r.worst_resume_latency_s == pytest.approx(1.05 + 0.50 + 0.30)


def test_an_admission_entry_for_a_draining_gpu_counts_as_invalid():
    """It admits nobody, as one for a GPU the pool lacks: counted (it was not)."""
    ev = _ev((0, "a", O, 0), (10, "a", C, 0))
    r = simulate(load_policy("tests.sim.plugin:AdmitDraining"), ev, MODEL, SimConfig(initial_gpus=2, round_s=0))
    assert r.invalid_commands >= 1 and r.invalid_by_kind.get("admit", 0) >= 1, r.invalid_by_kind


def test_a_run_in_which_no_session_resumed_has_no_resume_latency(tmp_path):
    """Sessions that only open and close: no resume latency (null in the JSON, "-" in the
    evaluate table), not 0 s, which read as instant resumes; one return gives a figure."""
    from infra.sim.trace import load_trace

    trace = tmp_path / "t.csv"
    trace.write_text("t_s,session_id,event,state_mb\n0,a,open,100\n60,a,close,\n")
    run = simulate(load_policy("rr", model=MODEL), load_trace(trace).events, MODEL, SimConfig(initial_gpus=1))
    assert run.worst_resume_latency_s is None and run.p99_resume_latency_s is None
    assert run.metrics()["worst_resume_latency_s"] is None
    trace.write_text("t_s,session_id,event,state_mb\n0,a,open,100\n10,a,idle,\n20,a,active,\n60,a,close,\n")
    run = simulate(load_policy("least-loaded-offload", model=MODEL), load_trace(trace).events, MODEL,
                   SimConfig(initial_gpus=1))
    assert run.worst_resume_latency_s is not None and run.worst_resume_latency_s > 0


def test_off_a_terminal_a_long_command_says_what_runs_every_so_often(monkeypatch):
    """A CI log showed nothing from ``simulate`` or ``tune`` for minutes: off a terminal a line
    now comes every ``HEARTBEAT_S`` seconds naming what runs, none after the command ends, and
    none from a command that ends first (a run that fails at once prints its error alone)."""
    out = io.StringIO()
    monkeypatch.setattr(sim_cli, "_err", Console(file=out, force_terminal=False, soft_wrap=True))
    with sim_cli._progress("simulate", "simulating", every_s=0.02) as tell:
        tell("simulating rr (pool 3)")
        give_up = time.monotonic() + 10.0
        while "rr (pool 3)" not in out.getvalue() and time.monotonic() < give_up:
            time.sleep(0.01)
    lines = out.getvalue().splitlines()
    assert lines and lines[-1].endswith("simulating rr (pool 3)"), lines
    assert all(re.fullmatch(r"simulate: \d+ s, simulating( rr \(pool 3\))?", line) for line in lines), lines
    time.sleep(0.1)
    assert out.getvalue().splitlines() == lines  # the beat stopped with the command
    quick = io.StringIO()
    monkeypatch.setattr(sim_cli, "_err", Console(file=quick, force_terminal=False, soft_wrap=True))
    with sim_cli._progress("tune", "tuning", every_s=60.0) as tell:
        tell("level 1")
    assert quick.getvalue() == ""


def test_cli_slo_floor_runs_a_load_that_seldom_starts_executing_hotter_within_the_slo(tmp_path):
    """1,200 sessions execute and never idle; two more open a second and live 10 minutes.
    At the SLO the feedback starts at u* 0.36 and climbs 3% a minute; few first chunks miss
    at far more sessions per GPU, and after 300 s the floor holds the pool there: cheaper,
    the SLO met either way. ``--slo-floor 0`` runs the feedback alone."""
    ev = [(0.0, f"w{i}", "open", "500") for i in range(1200)] + [(0.75 * i + 0.5, f"w{i}", "close", "") for i in range(1200)]
    ev += [(0.5 * k + 0.25, f"n{k}", "open", "500") for k in range(1800)]
    ev += [(0.5 * k + 600.25, f"n{k}", "close", "") for k in range(600)]
    trace = tmp_path / "steady.csv"
    trace.write_text("\n".join(["t_s,session_id,event,state_mb"] + [f"{t:g},{s},{e},{m}" for t, s, e, m in sorted(ev)]) + "\n")
    run, app = CliRunner(), _app()
    slo = {}
    for value in ("0.8", "0"):
        out = tmp_path / f"floor-{value}.json"
        res = run.invoke(app, ["simulate", str(trace), "-p", "turboserve", "--slo-floor", value, "--json", str(out), "-j", "1"])
        assert res.exit_code == 0, res.output
        slo[value] = json.loads(out.read_text())["slo"]
    assert slo["0.8"]["cost"]["turboserve"] < slo["0"]["cost"]["turboserve"]
    assert slo["0.8"]["met"]["turboserve"] and slo["0"]["met"]["turboserve"]
    assert slo["0"]["miss_rates"]["turboserve"] < slo["0.8"]["miss_rates"]["turboserve"] <= 0.001
    bad = run.invoke(app, ["simulate", str(trace), "-p", "turboserve", "--slo-floor", "1.5"])
    assert bad.exit_code != 0 and "--slo-floor" in bad.output
