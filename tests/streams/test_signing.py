"""Command authenticity: HMAC headers on worker and scaling commands, with key rotation."""

from __future__ import annotations

import pytest

from schemas.errors import ConfigError
from streams.signing import CommandKeys, EventKeys, worker_env

A, B = "11" * 16, "22" * 16


def keys(spec: str, active: str | None = None) -> CommandKeys:
    env = {"CHUNKSERVE_COMMAND_KEYS": spec}
    if active:
        env["CHUNKSERVE_COMMAND_KEY_ID"] = active
    return CommandKeys.from_env(env)


def test_sign_and_verify_with_rotation() -> None:
    old, both = keys(f"a:{A}"), keys(f"a:{A},b:{B}", active="b")
    value = b"an encoded Assign"
    assert both.verify("worker-commands", value, old.sign("worker-commands", value)) is None  # old key still accepted
    assert old.verify("worker-commands", value, both.sign("worker-commands", value)) == "unknown_key"
    assert both.verify("worker-commands", value, []) == "unsigned"
    assert both.verify("worker-commands", value + b"!", both.sign("worker-commands", value)) == "forged"
    # a tag is bound to its topic: a worker command cannot be replayed as a scaling command
    assert both.verify("scaling-commands", value, both.sign("worker-commands", value)) == "forged"
    forged = [("cs-kid", b"a"), ("cs-mac", b"\0" * 32)]
    assert both.verify("worker-commands", value, forged) == "forged"


def test_unsigned_topics_and_disabled_keys() -> None:
    off = CommandKeys.from_env({})
    assert not off.enabled and off.sign("worker-commands", b"x") == []
    assert off.verify("worker-commands", b"x", None) is None  # nothing configured: nothing checked
    on = keys(f"a:{A}")
    assert on.sign("session-events", b"x") == [] and on.verify("session-events", b"x", None) is None


@pytest.mark.parametrize("spec", ["a", "a:zz", f"a:{A[:10]}", ":" + A, "a:" + A + ",b", "", "  ",
                                  f"a:{A},a:{'22' * 16}"])
def test_bad_key_config_names_the_variable(spec: str) -> None:
    with pytest.raises(ConfigError, match="CHUNKSERVE_COMMAND_KEYS"):
        keys(spec)
    with pytest.raises(ConfigError, match="CHUNKSERVE_COMMAND_KEY_ID"):
        keys(f"a:{A}", active="c")


def test_an_empty_or_repeated_key_setting_is_refused_not_taken() -> None:
    """Set but empty (a template whose secret did not arrive) turned signing off with a
    warning; a key id given twice kept the last key, and commands signed with the first were
    refused as forged. Both are refused in one line; unset, signing is off."""
    with pytest.raises(ConfigError, match="set but empty"):
        CommandKeys.from_env({"CHUNKSERVE_COMMAND_KEYS": ""})
    with pytest.raises(ConfigError, match="entry 2: key id 'a' is given twice"):
        CommandKeys.from_env({"CHUNKSERVE_COMMAND_KEYS": f"a:{A},a:{'22' * 16}"})
    assert not CommandKeys.from_env({}).enabled


def test_ed25519_keys_sign_where_private_and_only_verify_where_public() -> None:
    """An Ed25519 pair: the private key signs and verifies, its public half verifies and cannot
    sign, so a worker handed the public half holds nothing that makes a command (HMAC keys
    verify and sign alike). A forged signature, another key's and another topic's are refused."""
    from streams.signing import new_key

    private, public = new_key("e1")
    assert private.startswith("e1:ed25519:") and public.startswith("e1:ed25519-pub:") and private != public
    signer, reader = keys(private), keys(public)
    value = b"an encoded ScaleOut"
    signed = signer.sign("scaling-commands", value)
    assert reader.verify("scaling-commands", value, signed) is None and signer.verify("scaling-commands", value, signed) is None
    assert reader.verify("scaling-commands", value + b"!", signed) == "forged"
    assert reader.verify("worker-commands", value, signed) == "forged"  # bound to its topic
    other, _ = new_key("e1")
    assert reader.verify("scaling-commands", value, keys(other).sign("scaling-commands", value)) == "forged"
    with pytest.raises(ConfigError, match="cannot sign"):
        reader.sign("scaling-commands", value)
    assert reader.sign("worker-events", value) == []  # what a worker writes is not signed
    # verify_only: every Ed25519 key by its public half, HMAC keys as they are, active id kept
    mixed = keys(f"a:{A},{private}", active="e1")
    assert mixed.verify_only() == f"a:{A},{public}" and CommandKeys.from_env({}).verify_only() is None
    assert keys(mixed.verify_only(), active="e1").verify("scaling-commands", value, mixed.sign("scaling-commands", value)) is None


@pytest.mark.parametrize("spec", ["a:ed25519:" + "11" * 31, "a:ed25519-pub:zz", "a:rsa:" + "11" * 32, "a:ed25519:"])
def test_a_bad_ed25519_entry_names_the_variable(spec: str) -> None:
    with pytest.raises(ConfigError, match="CHUNKSERVE_COMMAND_KEYS: entry 1"):
        keys(spec)


def events(spec: str = f"a:{A}", active: str | None = None) -> EventKeys:
    env = {"CHUNKSERVE_EVENT_KEYS": spec}
    if active:
        env["CHUNKSERVE_EVENT_KEY_ID"] = active
    return EventKeys.from_env(env)


def test_a_worker_signs_worker_events_keyed_by_its_own_id_only() -> None:
    masters = events(f"a:{A},b:{B}", active="b")
    own = EventKeys.from_env({"CHUNKSERVE_WORKER_EVENT_KEY": masters.for_worker("w1")})
    assert own.enabled and not own.checks  # it signs, and checks nothing (it holds no master)
    value = b"an encoded WorkerDown"
    assert masters.verify("worker-events", b"w1", value, own.sign("worker-events", b"w1", value)) is None
    # keyed by another worker: its key is not that worker's
    assert masters.verify("worker-events", b"w2", value, own.sign("worker-events", b"w2", value)) == "forged"
    assert masters.verify("worker-events", b"w1", value + b"!", own.sign("worker-events", b"w1", value)) == "forged"
    assert masters.verify("worker-events", b"w1", value, []) == "unsigned"
    # the masters sign for any worker (control's declarations, the provisioner's reports), and
    # a record signed with the first master is taken while the second signs (rotation)
    old = events(f"a:{A}")
    assert masters.verify("worker-events", b"w2", value, old.sign("worker-events", b"w2", value)) is None
    assert old.verify("worker-events", b"w2", value, masters.sign("worker-events", b"w2", value)) == "unknown_key"
    # other topics: no headers, nothing checked; no key at all: off
    assert masters.sign("worker-commands", b"w1", value) == [] and masters.verify("metrics", b"", value, []) is None
    assert not EventKeys.from_env({}).enabled and EventKeys.from_env({}).verify("worker-events", b"w1", value, []) is None


def test_a_worker_is_handed_its_own_key_in_place_of_the_masters() -> None:
    env = {"CHUNKSERVE_EVENT_KEYS": f"a:{A}", "CHUNKSERVE_EVENT_KEY_ID": "a", "OTHER": "x"}
    worker_env(env, "w7")
    assert env == {"OTHER": "x", "CHUNKSERVE_WORKER_EVENT_KEY": events().for_worker("w7")}
    assert events().for_worker("w7") != events().for_worker("w8") and events().for_worker("w7").startswith("a:")
    plain = {"OTHER": "x"}
    worker_env(plain, "w7")  # off: nothing handed
    assert plain == {"OTHER": "x"}


@pytest.mark.parametrize("env, var", [
    ({"CHUNKSERVE_EVENT_KEYS": "a:abcd"}, "CHUNKSERVE_EVENT_KEYS"),  # too short
    ({"CHUNKSERVE_EVENT_KEYS": ""}, "CHUNKSERVE_EVENT_KEYS"),
    ({"CHUNKSERVE_EVENT_KEYS": f"a:{A},a:{B}"}, "CHUNKSERVE_EVENT_KEYS"),
    ({"CHUNKSERVE_EVENT_KEYS": f"a:{A}", "CHUNKSERVE_EVENT_KEY_ID": "b"}, "CHUNKSERVE_EVENT_KEY_ID"),
    ({"CHUNKSERVE_WORKER_EVENT_KEY": "nocolon"}, "CHUNKSERVE_WORKER_EVENT_KEY"),
    ({"CHUNKSERVE_WORKER_EVENT_KEY": " "}, "CHUNKSERVE_WORKER_EVENT_KEY"),
])
def test_a_bad_event_key_setting_names_its_variable(env: dict[str, str], var: str) -> None:
    with pytest.raises(ConfigError, match=var):
        EventKeys.from_env(env)
    if not any(env.values()):
        with pytest.raises(ConfigError, match="set but empty"):
            EventKeys.from_env(env)


def test_a_worker_event_speaking_for_another_worker_is_refused_though_signed_by_its_key() -> None:
    """An outside run's worker signed, with its own key and keyed by its own id, a WorkerDown
    and a Frozen naming another worker, and dispatch took that worker's sessions."""
    from schemas.codec import encode
    from schemas.records import CommandRejected, Frozen, Generation, WorkerDown

    masters = events()
    own = EventKeys.from_env({"CHUNKSERVE_WORKER_EVENT_KEY": masters.for_worker("w1")})

    def check(rec: object, key: bytes = b"w1") -> str | None:
        value = encode(rec)
        return masters.check("worker-events", rec, key, value, own.sign("worker-events", key, value))

    assert check(WorkerDown(worker_id="w1", ts=1.0)) is None
    assert check(WorkerDown(worker_id="w2", ts=1.0)) == "another_worker"
    theirs = Generation("w2", 3)
    assert check(Frozen(worker_id="w1", session_id="s", generation=theirs, target_worker="w1", ts=1.0)) == "another_worker"
    assert check(Frozen(worker_id="w1", session_id="s", generation=Generation("w1", 3), target_worker="w2", ts=1.0)) is None
    # a refused command's generation is the command's: only its worker_id speaks for the writer
    assert check(CommandRejected(worker_id="w1", session_id="s", command="cmd.assign", reason="stale_epoch",
                                 ts=1.0, generation=theirs)) is None
    assert check(WorkerDown(worker_id="w2", ts=1.0), key=b"w2") == "forged"  # w1's key, keyed by w2
    assert EventKeys().check("worker-events", WorkerDown(worker_id="w2", ts=1.0), b"w1", b"", []) is None  # off
