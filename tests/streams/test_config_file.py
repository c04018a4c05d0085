"""Settings from a TOML file with environment overrides; every bad file is a ConfigError."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from streams.config_file import load_settings
from schemas.errors import ConfigError

VALID = """\
topic_prefix = "prod."
namespace = "eu"
max_record_bytes = 2097152

[kafka]
bootstrap = "kafka-1:9093,kafka-2:9093"
security_protocol = "SASL_SSL"
sasl_mechanism = "SCRAM-SHA-512"
sasl_username = "chunkserve"
ssl_cafile = "ca.pem"

[redis]
url = "rediss://redis:6380/0"
username = "cs"
ssl_ca_certs = "ca.pem"

[partitions]
worker-commands = 64
session-events = 16
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "chunkserve.toml"
    path.write_text(text)
    return path


def test_file_values_and_defaults(tmp_path):
    s = load_settings(write(tmp_path, VALID), env={})
    assert s.topic_prefix == "prod." and s.namespace == "eu" and s.max_record_bytes == 2097152
    assert s.kafka.bootstrap == "kafka-1:9093,kafka-2:9093"
    assert s.kafka.sasl_mechanism == "SCRAM-SHA-512" and s.kafka.sasl_password is None
    assert s.redis.url == "rediss://redis:6380/0" and s.redis.password is None
    assert s.partitions["worker-commands"] == 64 and s.partitions["metrics"] == 1


def test_environment_overrides_file_and_supplies_secrets(tmp_path):
    env = {"CHUNKSERVE_KAFKA_BOOTSTRAP": "other:9092", "CHUNKSERVE_NAMESPACE": "us",
           "CHUNKSERVE_KAFKA_SASL_PASSWORD": "s3cret", "CHUNKSERVE_REDIS_PASSWORD": "r3dis",
           "CHUNKSERVE_MAX_RECORD_BYTES": "16384", "CHUNKSERVE_MAX_INPUT_BYTES": "1000"}
    s = load_settings(write(tmp_path, VALID), env=env)
    assert s.kafka.bootstrap == "other:9092" and s.namespace == "us"
    assert s.kafka.sasl_password == "s3cret" and s.redis.password == "r3dis"
    assert s.max_record_bytes == 16384 and s.max_input_bytes == 1000
    assert s.record_limit("metrics") == 16384  # every topic's bound is capped by max_record_bytes
    assert "s3cret" not in repr(s)


def test_a_producer_reading_the_environment_reads_the_file_it_names_too(tmp_path):
    """`SessionClient(settings_from_env())`, the README's producer: with the operator's
    `CHUNKSERVE_CONFIG` set it read the environment alone, and sent to the default prefix's
    topics, which no processor read."""
    from streams.config_file import settings_from_env

    path = write(tmp_path, VALID)
    s = settings_from_env({"CHUNKSERVE_CONFIG": str(path), "CHUNKSERVE_NAMESPACE": "us"})
    assert s.topic_prefix == "prod." and s.partitions["worker-commands"] == 64  # the file's
    assert s.namespace == "us"  # the environment over it, as for the CLI
    assert settings_from_env({}).topic_prefix == load_settings(None, env={}).topic_prefix

def test_no_file_means_environment_only():
    s = load_settings(None, env={"CHUNKSERVE_REDIS_URL": "redis://r:6379"})
    assert s.redis.url == "redis://r:6379" and s.kafka.bootstrap == ""


@pytest.mark.parametrize("section,key", [("kafka", "sasl_password"), ("redis", "password")])
def test_secret_in_file_is_an_error_naming_key_and_file(tmp_path, section, key):
    path = write(tmp_path, f'[{section}]\n{key} = "hunter2"\n')
    with pytest.raises(ConfigError) as info:
        load_settings(path, env={})
    assert info.value.key == f"{section}.{key}" and info.value.source == str(path)
    assert "hunter2" not in str(info.value)


def test_a_password_inside_the_redis_url_in_the_file_is_refused_like_other_secrets(tmp_path):
    path = write(tmp_path, '[redis]\nurl = "redis://app:hunter2@r:6379/0"\n')
    with pytest.raises(ConfigError) as info:
        load_settings(path, env={})
    assert info.value.key == "redis.url" and info.value.source == str(path)
    assert "CHUNKSERVE_REDIS_PASSWORD" in str(info.value) and "hunter2" not in str(info.value)
    # a user name alone is no secret, and the environment may carry the whole URL
    assert load_settings(write(tmp_path, '[redis]\nurl = "redis://app@r:6379/0"\n'), env={}).redis.url
    env = {"CHUNKSERVE_REDIS_URL": "redis://app:hunter2@r:6379/0"}
    assert load_settings(None, env=env).redis.url == env["CHUNKSERVE_REDIS_URL"]


@pytest.mark.parametrize("text,key", [
    ('[kafka]\nsecurity_protocol = "SMOKE"\n', "kafka.security_protocol"),
    ('[kafka]\nbootstrap = 9092\n', "kafka.bootstrap"),
    ('[kafka]\nboot = "x"\n', "kafka.boot"),
    ('[partitions]\nnope = 3\n', "partitions.nope"),
    ('[partitions]\nmetrics = 0\n', "partitions.metrics"),
    ('[partitions]\nmetrics = true\n', "partitions.metrics"),
    ('max_record_bytes = 12\n', "max_record_bytes"),
    ('colour = "blue"\n', "colour"),
    ('kafka = "x"\n', "kafka"),
])
def test_bad_value_names_key_and_file(tmp_path, text, key):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_settings(path, env={})
    assert info.value.key == key and info.value.source == str(path)


def test_bad_environment_value_names_the_variable(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, VALID), env={"CHUNKSERVE_MAX_RECORD_BYTES": "lots"})
    assert info.value.source == "env CHUNKSERVE_MAX_RECORD_BYTES"


def test_syntax_error_names_file_and_line(tmp_path):
    path = write(tmp_path, 'namespace = "a"\n\n[kafka\nbootstrap = "x"\n')
    with pytest.raises(ConfigError) as info:
        load_settings(path, env={})
    assert info.value.source == f"{path}:3"


def test_missing_and_binary_files(tmp_path):
    with pytest.raises(ConfigError):
        load_settings(tmp_path / "absent.toml", env={})
    bad = tmp_path / "bin.toml"
    bad.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError):
        load_settings(bad, env={})


def _load_or_config_error(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "fuzz.toml"
    path.write_bytes(data)
    try:
        load_settings(path, env={})
    except ConfigError:
        pass


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(st.text(alphabet=string.printable + "[]=\"'{}é\x00", max_size=300))
def test_random_text_raises_only_config_error(tmp_path, text):
    _load_or_config_error(tmp_path, text.encode("utf-8", "surrogatepass"))


@FUZZ
@given(st.data())
def test_mutated_valid_file_raises_only_config_error(tmp_path, data):
    raw = bytearray(VALID.encode())
    for _ in range(data.draw(st.integers(1, 6))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        op = data.draw(st.sampled_from(["flip", "delete", "insert"]))
        if op == "flip":
            raw[pos] = data.draw(st.integers(0, 255))
        elif op == "delete":
            del raw[pos]
        else:
            raw[pos:pos] = data.draw(st.sampled_from([b"=", b"[", b"]", b'"', b"\n", b"0", b"true", b"x"]))
    _load_or_config_error(tmp_path, bytes(raw))


def test_bounds_from_file_and_environment(tmp_path):
    path = write(tmp_path, "max_snapshot_bytes = 4096\n" + VALID + '\n[record_bytes]\n"session-events" = 2048\n')
    env = {"CHUNKSERVE_RECORD_BYTES_METRICS": "8192", "CHUNKSERVE_MAX_SESSIONS_PER_WORKER": "4",
           "CHUNKSERVE_PARTITIONS_SESSION_INPUTS": "32", "CHUNKSERVE_INPUT_RATE_PER_S": "2.5"}
    s = load_settings(path, env=env)
    assert s.record_limit("session-events") == 2048 and s.record_limit("metrics") == 8192
    assert s.record_limit("session-inputs") == 128 * 1024  # the topic table's default
    assert s.max_snapshot_bytes == 4096 and s.max_sessions_per_worker == 4
    assert s.partitions["session-inputs"] == 32 and s.input_rate_per_s == 2.5
    s.check_capacity(4)
    with pytest.raises(ConfigError, match="max_sessions_per_worker"):
        s.check_capacity(5)


@pytest.mark.parametrize("env,key", [
    ({"CHUNKSERVE_RECORD_BYTES_SESSION_INPUTS": "4096"}, "max_input_bytes"),  # inputs would not fit
    ({"CHUNKSERVE_RECORD_BYTES_METRICS": "100"}, "record_bytes.metrics"),
    ({"CHUNKSERVE_RECORD_BYTES_METRICS": "4194304"}, "record_bytes.metrics"),  # over max_record_bytes
    ({"CHUNKSERVE_MAX_SNAPSHOT_BYTES": "10"}, "max_snapshot_bytes"),
    ({"CHUNKSERVE_MAX_SESSIONS_PER_WORKER": "0"}, "max_sessions_per_worker"),
    ({"CHUNKSERVE_PARTITIONS_METRICS": "x"}, "partitions.metrics"),
    ({"CHUNKSERVE_KAFKA_BOOTSTRAP": "host:abc"}, "kafka.bootstrap"),  # an aiokafka traceback before
    ({"CHUNKSERVE_KAFKA_BOOTSTRAP": "127.0.0.1:99999"}, "kafka.bootstrap"),
    ({"CHUNKSERVE_KAFKA_BOOTSTRAP": "a:9092,garbage::"}, "kafka.bootstrap"),
    ({"CHUNKSERVE_KAFKA_BOOTSTRAP": "http://127.0.0.1:9092"}, "kafka.bootstrap"),  # was "no broker answers"
    ({"CHUNKSERVE_INPUT_BURST": "2.5"}, "input_burst"),  # a count of inputs
    ({"CHUNKSERVE_INPUT_BURST": "0.5"}, "input_burst"),  # was "config: inputs", naming no variable
])
def test_bad_bound_names_key_and_variable(env, key):
    with pytest.raises(ConfigError) as info:
        load_settings(None, env=env)
    assert info.value.key == key
    if key != "max_input_bytes":
        assert info.value.source == f"env {next(iter(env))}"


def test_unknown_topic_in_record_bytes_table(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, '[record_bytes]\nnope = 4096\n'), env={})
    assert info.value.key == "record_bytes.nope" and "unknown topic" in str(info.value)


@FUZZ
@given(st.integers(2048, 1 << 20), st.sampled_from(["SSL", "SASL_SSL", "PLAINTEXT"]),
       st.dictionaries(st.sampled_from(["metrics", "session-events", "dead-letters"]),
                       st.integers(9216, 1 << 20)),
       st.integers(1, 512), st.floats(0.5, 1000.0))
def test_child_env_gives_a_child_exactly_these_settings(tmp_path, snapshot, protocol, record_bytes,
                                                        capacity, rate):
    from streams.config import DEFAULT_PARTITIONS, KafkaSettings, RedisSettings, Settings
    from streams.config_file import child_env

    s = Settings(kafka=KafkaSettings(bootstrap="k:9093", security_protocol=protocol, ssl_cafile="ca.pem",
                                     sasl_username="u", sasl_password="pw"),
                 redis=RedisSettings(url="rediss://r:6380/1", ssl_ca_certs="ca.pem", password="rp"),
                 namespace="n1", record_bytes=record_bytes, max_snapshot_bytes=snapshot,
                 max_sessions_per_worker=capacity, input_rate_per_s=rate,
                 partitions={**DEFAULT_PARTITIONS, "session-events": 3, "metrics": 2})
    child = load_settings(None, env=child_env(s, base={}))
    assert child == s and child.kafka.sasl_password == "pw" and child.redis.password == "rp"


def test_child_env_drops_the_parents_variables_for_settings_left_unset():
    from streams.config import Settings
    from streams.config_file import child_env

    parent = {"CHUNKSERVE_KAFKA_SASL_MECHANISM": "PLAIN", "CHUNKSERVE_REDIS_SSL_CA_CERTS": "ca.pem",
              "CHUNKSERVE_RECORD_BYTES_METRICS": "4096", "PATH": "/bin"}
    env = child_env(Settings(), base=parent)
    assert not any(k in env for k in parent if k.startswith("CHUNKSERVE_")) and env["PATH"] == "/bin"
    assert load_settings(None, env=env) == Settings()


def test_dead_letters_bound_holds_a_dead_letter_and_cuts_the_copy_to_fit():
    from schemas.codec import encode
    from streams.config import DEAD_LETTER_ENVELOPE_BYTES, Settings
    from streams.kafka import dead_letter_record

    with pytest.raises(ConfigError) as info:
        Settings(record_bytes={"dead-letters": 4096})
    assert info.value.key == "record_bytes.dead-letters"
    for too_small in (100, 4096):  # one bound named, whichever way it is missed (it said 1024 for 100)
        with pytest.raises(ConfigError, match=f"from {DEAD_LETTER_ENVELOPE_BYTES + 1024} to"):
            Settings(record_bytes={"dead-letters": too_small})
    limit = DEAD_LETTER_ENVELOPE_BYTES + 2048
    letter = dead_letter_record("t", 0, 1, b"x" * 100_000, b"k" * 5000, "why " * 2000, "c", limit)
    assert len(letter.raw) == 2048 and letter.raw_size == 100_000
    assert len(encode(letter, limit)) <= limit


def test_isolated_settings_use_topics_and_keys_of_their_own():
    from streams.config import Settings

    s = Settings(topic_prefix="prod.", namespace="eu").isolated("demo-1a2b")
    assert (s.topic_prefix, s.namespace) == ("prod.demo-1a2b.", "eu-demo-1a2b")


@pytest.mark.parametrize("prefix,said", [
    ("bad prefix/!", "a Kafka topic name takes only ASCII letters, digits"),
    ("caf\u00e9.", "a Kafka topic name takes only ASCII letters, digits"),
    ("a" * 230, "at most 221"),  # its longest topic would pass Kafka's 249 characters
])
def test_a_topic_prefix_kafka_would_refuse_is_named_with_its_source(tmp_path, prefix, said):
    with pytest.raises(ConfigError) as info:
        load_settings(None, env={"CHUNKSERVE_TOPIC_PREFIX": prefix})
    assert (info.value.key, info.value.source) == ("topic_prefix", "env CHUNKSERVE_TOPIC_PREFIX")
    assert said in str(info.value)
    path = write(tmp_path, f'topic_prefix = "{prefix}"\n')
    with pytest.raises(ConfigError) as info:
        load_settings(path, env={})
    assert (info.value.key, info.value.source) == ("topic_prefix", str(path)) and said in str(info.value)


def test_the_longest_topic_prefix_kafka_takes_is_accepted():
    from streams.config import KAFKA_TOPIC_MAX, Settings

    for prefix in ("", "Prod_1.eu-west.", "a" * 221):
        s = load_settings(None, env={"CHUNKSERVE_TOPIC_PREFIX": prefix} if prefix else {})
        assert max(len(s.topic_prefix + t) for t in Settings().partitions) <= KAFKA_TOPIC_MAX
        assert len(s.topic_prefix + "dispatch-__assignor-__leader") <= KAFKA_TOPIC_MAX


@pytest.mark.parametrize("name,key", [
    ("CHUNKSERVE_RECORD_BYTES_BOGUS", "record_bytes.bogus"),
    ("CHUNKSERVE_PARTITIONS_SESSION_INPUT", "partitions.session-input"),  # a letter short
])
def test_a_per_topic_variable_naming_no_topic_is_refused_like_the_files_table(name, key):
    """A mistyped per-topic variable was ignored (its setting silently at the default)."""
    with pytest.raises(ConfigError) as info:
        load_settings(None, env={name: "abc"})
    assert (info.value.key, info.value.source) == (key, f"env {name}")
    assert "unknown topic (known: DEAD_LETTERS, METRICS," in str(info.value)
    assert load_settings(None, env={name: ""}) == load_settings(None, env={})  # empty: unset, as for any key


def test_the_shipped_example_file_loads_every_key_it_sets() -> None:
    """`examples/chunkserve.toml`, which the README points a deployment at, is a file the loader
    takes as written (a snippet in the docs once read `redis.cluster = on`, which TOML refuses)."""
    from streams.config_file import load_with_sources

    example = Path(__file__).resolve().parents[2] / "examples" / "chunkserve.toml"
    settings, sources = load_with_sources(example, {})
    assert set(sources.values()) == {str(example)} and len(sources) >= 15
    assert settings.kafka.security_protocol == "SASL_SSL" and settings.redis.url.startswith("rediss://")
    assert settings.partitions["session-events"] == 16 and settings.topic_prefix == "chunkserve."
    assert sources["redis.cluster"] == str(example)
