"""The settings users get wrong fail in one line naming where they came from, exit code 2.

A wrong SASL password is checked on the secured Apache Kafka (tests/infra/test_kafka_security.py).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from infra.embedded import free_port

pytestmark = pytest.mark.integration


def _run(args: list[str], env: dict[str, str], cwd=None) -> tuple[int, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CHUNKSERVE_")}
    proc = subprocess.run([sys.executable, "-m", "infra", *args], env={**base, **env}, cwd=cwd,
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


def _one_line(out: str) -> str:
    assert "Traceback" not in out and "Unclosed" not in out, out
    (line,) = [x for x in out.splitlines() if x.strip() and "command signing is off" not in x
               and "and scaling commands" not in x]
    return line


def test_an_unreachable_broker_from_the_environment(redis_url):
    rc, out = _run(["topics"], {"CHUNKSERVE_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}",
                                "CHUNKSERVE_REDIS_URL": redis_url})
    assert rc == 2
    line = _one_line(out)
    assert "env CHUNKSERVE_KAFKA_BOOTSTRAP" in line and "no broker answers" in line


def test_an_unreachable_broker_from_the_file_names_the_file_and_key(redis_url, tmp_path):
    conf = tmp_path / "chunkserve.toml"
    conf.write_text(f'[kafka]\nbootstrap = "127.0.0.1:{free_port()}"\n[redis]\nurl = "{redis_url}"\n')
    for command in (["topics"], ["up"], ["processor", "control"]):
        rc, out = _run(["--config", str(conf), *command], {})
        assert rc == 2, command
        line = _one_line(out)
        assert f"{conf}: kafka.bootstrap: no broker answers" in line, command


def test_a_missing_bootstrap_is_named_in_the_file_too(tmp_path):
    conf = tmp_path / "chunkserve.toml"
    conf.write_text('[redis]\nurl = "redis://127.0.0.1:6379"\n')
    rc, out = _run(["--config", str(conf), "topics"], {})
    assert rc == 2
    line = _one_line(out)
    assert f"kafka.bootstrap in {conf}" in line and "CHUNKSERVE_KAFKA_BOOTSTRAP" in line


def test_an_unreachable_redis(kafka_bootstrap):
    rc, out = _run(["topics"], {"CHUNKSERVE_KAFKA_BOOTSTRAP": kafka_bootstrap,
                                "CHUNKSERVE_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"})
    assert rc == 2
    line = _one_line(out)
    assert "env CHUNKSERVE_REDIS_URL: redis.url: no Redis answers" in line


def test_a_missing_tls_file(kafka_bootstrap, redis_url, tmp_path):
    missing = tmp_path / "nope" / "ca.pem"
    rc, out = _run(["topics"], {"CHUNKSERVE_KAFKA_BOOTSTRAP": kafka_bootstrap, "CHUNKSERVE_REDIS_URL": redis_url,
                                "CHUNKSERVE_KAFKA_SECURITY_PROTOCOL": "SSL",
                                "CHUNKSERVE_KAFKA_SSL_CAFILE": str(missing)})
    assert rc == 2
    line = _one_line(out)
    assert "env CHUNKSERVE_KAFKA_SSL_CAFILE: kafka.ssl_cafile: cannot read" in line and str(missing) in line


def test_a_file_that_is_no_certificate(kafka_bootstrap, redis_url, tmp_path):
    bogus = tmp_path / "ca.pem"
    bogus.write_text("not a certificate\n")
    conf = tmp_path / "chunkserve.toml"
    conf.write_text(f'[kafka]\nbootstrap = "{kafka_bootstrap}"\nsecurity_protocol = "SSL"\n'
                    f'ssl_cafile = "{bogus}"\n[redis]\nurl = "{redis_url}"\n')
    rc, out = _run(["--config", str(conf), "topics"], {})
    assert rc == 2
    assert f"{conf}: kafka.ssl_cafile:" in _one_line(out)


def test_the_demo_refuses_an_unknown_policy_from_the_environment_before_starting(tmp_path):
    """The demo runs the policy CHUNKSERVE_POLICY names (it used to run turboserve whatever
    was set); an unknown one is named in one line before any broker starts, and the log and
    report folders it was given are not made (they were, as the command line was read)."""
    logs, report = tmp_path / "a" / "logs", tmp_path / "report"
    rc, out = _run(["demo", "--log-dir", str(logs), "--report-dir", str(report)], {"CHUNKSERVE_POLICY": "nope"})
    assert rc == 2
    assert "--policy or env CHUNKSERVE_POLICY: policy: 'nope': unknown policy" in _one_line(out)
    assert list(tmp_path.iterdir()) == []


def test_a_setting_only_a_child_reads_is_refused_before_up_starts_any(kafka_bootstrap, redis_url, tmp_path):
    """`up` checks what its children read from the environment alone; a processor started by
    hand says the same in one line; so does a worker given a bad id or device."""
    endpoints = {"CHUNKSERVE_KAFKA_BOOTSTRAP": kafka_bootstrap, "CHUNKSERVE_REDIS_URL": redis_url}
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    cases = [(["up"], {"CHUNKSERVE_POLICY": "nosuch"}, "env CHUNKSERVE_POLICY: policy: unknown policy"),
             (["up"], {"CHUNKSERVE_MAX_WORKERS": "abc"}, "CHUNKSERVE_MAX_WORKERS: not an integer: 'abc'"),
             (["up"], {"CHUNKSERVE_HEARTBEAT_TIMEOUT_S": "-1"}, "CHUNKSERVE_HEARTBEAT_TIMEOUT_S: must be above 0"),
             (["up"], {"CHUNKSERVE_HEARTBEAT_TIMEOUT_S": "0.001"}, "CHUNKSERVE_HEARTBEAT_TIMEOUT_S: must be at least 2 s"),
             (["up"], {"CHUNKSERVE_COST_INTERVAL_S": "nan"}, "CHUNKSERVE_COST_INTERVAL_S: must be above 0"),
             # each worker would refuse it: `up` ran on with none
             (["up"], {"CHUNKSERVE_WORKER_CAPACITY": "1000"},
              "env CHUNKSERVE_WORKER_CAPACITY: worker.capacity: 1000 sessions: must be from 1 to max_sessions_per_worker (64)"),
             # every provisioned worker would exit on it, and be started again
             (["up"], {"CHUNKSERVE_WORKER_MODEL": "nosuch_models:Model"},
              "env CHUNKSERVE_WORKER_MODEL: model: nosuch_models:Model: cannot import 'nosuch_models'"),
             # the paper's pinned baseline: live, dispatch offloads every idle session, so it
             # ran as lag-offload under lag's name
             (["up"], {"CHUNKSERVE_POLICY": "lag"}, "env CHUNKSERVE_POLICY: policy: 'lag' keeps idle sessions resident"),
             # the provisioner logs its workers there: it crash-looped on a file
             (["up"], {"CHUNKSERVE_LOG_DIR": str(a_file)},
              f"environment: CHUNKSERVE_LOG_DIR: {a_file} is a file, not a folder"),
             (["up"], {"CHUNKSERVE_LOG_DIR": str(a_file / "logs")},
              f"environment: CHUNKSERVE_LOG_DIR: cannot make the folder {a_file / 'logs'}"),
             (["provisioner"], {"CHUNKSERVE_LOG_DIR": str(a_file)}, "CHUNKSERVE_LOG_DIR: "),
             (["processor", "control"], {"CHUNKSERVE_POLICY": "nosuch"}, "policy: unknown policy"),
             (["processor", "detector"], {"CHUNKSERVE_DETECTOR_TICK_S": "x"}, "CHUNKSERVE_DETECTOR_TICK_S: not a number"),
             (["worker", "--worker-id", " "], {}, "--worker-id: must be a non-empty id"),
             # refused only once its first record was: after it had joined the broker, exit code 1
             (["worker", "--worker-id", "w" * 257], {}, "--worker-id: 257 characters: at most 256"),
             (["worker", "--worker-id", "w", "--device", "tpu"], {}, "--device: not a torch device: 'tpu'")]
    for args, env, said in cases:
        rc, out = _run(args, {**endpoints, **env})
        assert rc == 2, (args, env, out)
        assert said in _one_line(out), (args, env)


def test_a_topic_prefix_kafka_refuses_is_named_at_once_by_every_command(kafka_bootstrap, redis_url, tmp_path):
    """It used to reach the broker, which refused each topic: a traceback after 30 s. And a
    namespace Redis Cluster cannot hash-tag."""
    env = {"CHUNKSERVE_KAFKA_BOOTSTRAP": kafka_bootstrap, "CHUNKSERVE_REDIS_URL": redis_url,
           "CHUNKSERVE_TOPIC_PREFIX": "bad prefix/!"}
    for command in (["topics"], ["up"], ["watch", "--duration", "2"], ["processor", "control"]):
        rc, out = _run(command, env)
        assert rc == 2, (command, out)
        assert "env CHUNKSERVE_TOPIC_PREFIX: topic_prefix: 'bad prefix/!': a Kafka topic name" in _one_line(out)
    # the Redis keys' hash tag: the processors looped on tracebacks, `up` started its children
    env = {**env, "CHUNKSERVE_TOPIC_PREFIX": "ok.", "CHUNKSERVE_NAMESPACE": "a}b"}
    for command in (["topics"], ["up"], ["processor", "dispatch"]):
        rc, out = _run(command, env)
        assert rc == 2, (command, out)
        assert "env CHUNKSERVE_NAMESPACE: namespace: 'a}b': must be non-empty, without braces" in _one_line(out)
    env = {k: v for k, v in env.items() if k != "CHUNKSERVE_NAMESPACE"}
    conf = tmp_path / "chunkserve.toml"
    conf.write_text('topic_prefix = "' + 'x' * 240 + '"\n')
    rc, out = _run(["--config", str(conf), "topics"], env={k: v for k, v in env.items() if "PREFIX" not in k})
    assert rc == 2 and f"{conf}: topic_prefix: 240 characters" in _one_line(out)


def test_a_topic_prefix_with_no_topics_is_named_by_the_commands_that_read_them(kafka_bootstrap, redis_url):
    """A reader pointed at a prefix no deployment uses waited out 30 s for the first topic and
    exited with `topic ... is not in the cluster's metadata`, naming no setting."""
    env = {"CHUNKSERVE_KAFKA_BOOTSTRAP": kafka_bootstrap, "CHUNKSERVE_REDIS_URL": redis_url,
           "CHUNKSERVE_TOPIC_PREFIX": "nothere."}
    for command in (["story", "s-1"], ["replay", "detector"], ["watch", "--duration", "60", "--no-render"]):
        rc, out = _run(command, env)
        assert rc == 1 and "Traceback" not in out, (command, out)
        line = out.strip().splitlines()[-1]  # watch says first what it follows
        assert "no topic of prefix 'nothere.' in the cluster (CHUNKSERVE_TOPIC_PREFIX" in line, (command, line)


def test_the_readers_of_the_topics_need_no_redis(kafka_bootstrap, namespace):
    """`story`, `replay` and `watch` read the topics alone; they refused to run without a
    Redis that answers (`redis.url: not set`), which after an incident may be the part away
    (an outside run's operator met it)."""
    import asyncio

    from streams.config import Settings
    from streams.topics import ensure_topics

    asyncio.run(ensure_topics(Settings(topic_prefix=f"{namespace}.").with_endpoints(kafka_bootstrap, "")))
    env = {"CHUNKSERVE_KAFKA_BOOTSTRAP": kafka_bootstrap, "CHUNKSERVE_TOPIC_PREFIX": f"{namespace}."}
    for redis in ({}, {"CHUNKSERVE_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}):  # none, or none answering
        rc, out = _run(["replay", "detector"], {**env, **redis})
        assert rc == 0 and "redis" not in out.lower(), out
        rc, out = _run(["story", "s-1"], {**env, **redis})
        assert rc == 1 and "s-1: no record of this session in the topics" in _one_line(out), out
    rc, out = _run(["watch", "--duration", "1", "--no-render"], env)
    assert rc == 0 and '"sessions"' in out, out
    rc, out = _run(["topics"], env)  # a command that uses the store still needs it
    assert rc == 2 and "redis.url: not set" in _one_line(out), out


def test_a_json_output_it_cannot_write_is_named_before_the_work(kafka_bootstrap, redis_url, tmp_path):
    """A folder, or a path under a file, was a traceback after the work (watch: the summary lost)."""
    env = {"CHUNKSERVE_KAFKA_BOOTSTRAP": kafka_bootstrap, "CHUNKSERVE_REDIS_URL": redis_url}
    a_file = tmp_path / "x.csv"
    a_file.write_text("")
    snapshot = tmp_path / "snap.json"
    snapshot.write_text('{"eta": 1}')
    for command in (["replay", "detector"], ["watch", "--duration", "6", "--no-render"],
                    ["bench", "scheduler", "--gpus", "8", "--instances", "1"], ["place", str(snapshot)],
                    ["ownership-check", "--runs", "4", "--redis-sample", "0"]):
        for target, said in ((a_file / "x.json", f"{a_file / 'x.json'}: --json: cannot make its folder: "
                                                 f"{a_file} is a file, not a folder"),
                             (tmp_path, f"{tmp_path}: --json: is a folder; give a file name")):
            rc, out = _run([*command, "--json", str(target)], env)
            assert rc == 2, (command, out)
            assert said in _one_line(out), command


def test_a_log_or_report_folder_it_cannot_make_is_named_before_anything_starts(tmp_path):
    """A --log-dir or --report-dir under a file was a traceback: at once for the logs (the
    broker's folder), after the whole run for the demo's report."""
    a_file = tmp_path / "x.csv"
    a_file.write_text("")
    for command in (["demo", "--log-dir"], ["demo", "--report-dir"], ["smoke", "--log-dir"],
                    ["chaos", "--log-dir"], ["up", "--log-dir"], ["broker", "start", "--data"]):
        rc, out = _run([*command, str(a_file / "d")], {})
        assert rc == 2, (command, out)
        assert f"{a_file / 'd'}: {command[-1]}: cannot make the folder" in _one_line(out), command
    # a folder no check foresees the system refusing (it was a 51-line traceback, exit 1)
    rc, out = _run(["broker", "start", "--data", "/proc/chunkserve"], {})
    assert rc == 2 and "/proc/chunkserve: --data: cannot make the folder" in _one_line(out), out



def test_other_outputs_it_cannot_write_are_named_before_the_work(tmp_path):
    """`schemas asyncapi -o`, `bench worker --profile-out` and `provisioner --targets` were a
    traceback: at once, after the benchmark, or when the provisioner stopped; `-o` did not
    make the folders missing on its path either."""
    a_file = tmp_path / "x.csv"
    a_file.write_text("")
    for command, option in ((["schemas", "asyncapi", "-o"], "--output"),
                            (["bench", "worker", "--profile-out"], "--profile-out"),
                            (["provisioner", "--worker-metrics-port", "9500", "--targets"], "--targets")):
        for target, said in ((a_file / "y.json", f"{a_file / 'y.json'}: {option}: cannot make its folder: "
                                                 f"{a_file} is a file, not a folder"),
                             (tmp_path, f"{tmp_path}: {option}: is a folder; give a file name")):
            rc, out = _run([*command, str(target)], {})
            assert rc == 2 and "Traceback" not in out, (command, out)
            assert said in _one_line(out), (command, out)
    made = tmp_path / "new" / "sub" / "asyncapi.json"
    rc, out = _run(["schemas", "asyncapi", "-o", str(made)], {})
    assert rc == 0 and made.read_text().startswith("{"), out



def test_a_bad_argument_is_named_before_any_setting_and_a_bad_trace_as_simulate_names_it(tmp_path):
    """`replay nope` without a broker configured answered with the missing broker's message;
    `demo --trace` on a missing file printed the reason without simulate's `error:`."""
    rc, out = _run(["replay", "nope"], {})
    assert rc == 2 and "unknown processor 'nope': choose control, dispatch or detector" in _one_line(out), out
    missing = tmp_path / "nothere.csv"
    for command in (["demo", "--trace", str(missing)], ["simulate", str(missing)]):
        rc, out = _run(command, {})
        assert rc == 2 and _one_line(out) == f"error: {missing}: cannot read (No such file or directory)", out



def test_topics_lists_the_partitions_the_broker_gives_not_the_configured_ones(kafka_bootstrap, redis_url, namespace):
    """A topic made before keeps its count: `topics` printed the configured one (8 for a topic
    of 4) and said nothing of the difference."""
    env = {"CHUNKSERVE_KAFKA_BOOTSTRAP": kafka_bootstrap, "CHUNKSERVE_REDIS_URL": redis_url,
           "CHUNKSERVE_TOPIC_PREFIX": f"{namespace}.", "CHUNKSERVE_PARTITIONS_SESSION_EVENTS": "2"}
    rc, out = _run(["topics"], env)
    assert rc == 0 and f"{namespace}.session-events  partitions=2\n" in out, out
    rc, out = _run(["topics"], {**env, "CHUNKSERVE_PARTITIONS_SESSION_EVENTS": "4"})
    assert rc == 0, out
    assert f"{namespace}.session-events  partitions=2  (configured 4: partitions are set when a topic is made)" in out, out
    assert f"{namespace}.session-inputs  partitions=8\n" in out, out  # as configured: no remark


def test_a_json_output_that_fails_at_the_end_still_gives_the_result(tmp_path, capsys):
    """Checked before the work, the file can still fail when written: the result goes to
    stdout, then one line (exit code 2 through ConfigError), no traceback."""
    from infra.cli_common import write_json as _write_json
    from schemas.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        _write_json({"sessions": 3}, tmp_path)  # a folder by the time the work is done
    assert info.value.key == "--json" and info.value.source == str(tmp_path)
    assert "cannot write" in str(info.value)
    assert '"sessions": 3' in capsys.readouterr().out


def test_a_broker_error_is_one_line_not_a_traceback(monkeypatch, capsys, kafka_bootstrap, redis_url):
    """`chunkserve topics` against a broker that does not answer in time (a damaged
    metadata quorum) printed 81 lines of chained tracebacks; any Kafka error that reaches the
    command line is one line, exit code 1."""
    import sys

    from aiokafka.errors import RequestTimedOutError

    import infra.cli as cli
    import streams.topics

    async def timed_out(settings):  # noqa: ARG001 - what the damaged broker answered
        raise RequestTimedOutError()

    monkeypatch.setattr(streams.topics, "ensure_topics", timed_out)
    monkeypatch.setenv("CHUNKSERVE_KAFKA_BOOTSTRAP", kafka_bootstrap)  # it answers; its metadata does not
    monkeypatch.setenv("CHUNKSERVE_REDIS_URL", redis_url)
    monkeypatch.setattr(sys, "argv", ["chunkserve", "topics"])
    with pytest.raises(SystemExit) as ended:
        cli.main()
    said = capsys.readouterr()
    assert ended.value.code == 1 and "Traceback" not in said.out + said.err and not said.out.strip()
    assert said.err.strip().splitlines() == ["error: the broker: RequestTimedOutError ([Error 7] RequestTimedOutError)"]


@pytest.mark.parametrize("given", ["CHUNKSERVE_KAFKA_SASL_USERNAME", "CHUNKSERVE_KAFKA_SASL_PASSWORD"])
def test_sasl_with_a_user_name_or_a_password_alone_is_named_in_one_line(given):
    """Either without the other failed inside the Kafka client with an 80-line traceback."""
    missing = ({"CHUNKSERVE_KAFKA_SASL_USERNAME", "CHUNKSERVE_KAFKA_SASL_PASSWORD"} - {given}).pop()
    rc, out = _run(["topics"], {"CHUNKSERVE_KAFKA_BOOTSTRAP": "127.0.0.1:9", "CHUNKSERVE_REDIS_URL": "redis://127.0.0.1:9",
                                "CHUNKSERVE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", given: "x"})
    line = _one_line(out)
    assert rc == 2 and line.startswith("configuration error: env CHUNKSERVE_KAFKA_SECURITY_PROTOCOL: "), line
    assert f"is not set ({missing})" in line, line


def test_a_role_principal_given_by_halves_or_without_sasl_is_refused_by_up(redis_url):
    base = {"CHUNKSERVE_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}", "CHUNKSERVE_REDIS_URL": redis_url}
    rc, out = _run(["up"], {**base, "CHUNKSERVE_DISPATCH_KAFKA_SASL_USERNAME": "dispatch"})
    assert rc == 2 and _one_line(out).endswith("environment: CHUNKSERVE_DISPATCH_KAFKA_SASL_USERNAME: set "
                                               "CHUNKSERVE_DISPATCH_KAFKA_SASL_PASSWORD with it (the dispatch "
                                               "role's own Kafka principal)"), out
    rc, out = _run(["up"], {**base, "CHUNKSERVE_CONTROL_KAFKA_SASL_USERNAME": "control",
                            "CHUNKSERVE_CONTROL_KAFKA_SASL_PASSWORD": "secret-pw"})
    line = _one_line(out)
    assert rc == 2 and "CHUNKSERVE_CONTROL_KAFKA_SASL_USERNAME: a principal of its own needs SASL" in line, out
    assert "PLAINTEXT" in line and "secret-pw" not in out


def test_an_output_that_is_the_input_is_refused_and_the_input_kept(tmp_path):
    """`simulate T --json T`, `evaluate --trace T --json T` and `place S --json S` replaced the
    trace or snapshot they read with their results, exit 0 (an outside run)."""
    trace = tmp_path / "t.csv"
    text = "t_s,session_id,event,state_mb\n0,u1,open,2000\n200,u1,close,\n"
    trace.write_text(text)
    snapshot = tmp_path / "snap.json"
    snapshot.write_text('{"eta": 1}')
    for command, read, written in ((["simulate", str(trace), "--policy", "rr"], trace, "--json"),
                                   (["simulate", str(trace), "--policy", "rr"], trace, "--plot"),
                                   (["evaluate", "--trace", str(trace)], trace, "--json"),
                                   (["place", str(snapshot)], snapshot, "--json")):
        before = read.read_text()
        rc, out = _run([*command, written, str(tmp_path / "." / read.name)], {})
        assert rc == 2 and f"{written}: is the input {read} itself" in _one_line(out), (command, out)
        assert read.read_text() == before
