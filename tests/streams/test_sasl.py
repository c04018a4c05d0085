"""SASL settings reach aiokafka and faust, and authenticate on the wire.

The embedded Tansu keeps SCRAM users in memory and refuses to create them once
``--authentication`` is on, and the test environment has no Apache Kafka. So, as the TLS tests put stunnel in front of Tansu, these put a
SASL-terminating front in front of it: it answers ApiVersions (from Tansu), SaslHandshake and
SaslAuthenticate itself, checks PLAIN and SCRAM-SHA-256/512 (RFC 5802/7677, credentials kept
as salt, StoredKey and ServerKey as Kafka keeps them) and only then pipes the connection to
Tansu, which advertises the front. The client side is entirely the real one; what this cannot
show is interoperation with Apache Kafka's own SASL server.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import logging
import secrets
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest
from aiokafka.errors import KafkaConnectionError, SaslAuthenticationFailed

from infra.embedded import EmbeddedTansu, free_port
from schemas.records import SessionOpened
from schemas.topics import SESSION_EVENTS
from streams.config import KafkaSettings, Settings
from streams.kafka import RecordConsumer, RecordProducer
from streams.topics import ensure_topics

pytestmark = [pytest.mark.integration, pytest.mark.tansu]

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_HASHES = {"SCRAM-SHA-256": hashlib.sha256, "SCRAM-SHA-512": hashlib.sha512}
_SASL_HANDSHAKE, _SASL_AUTHENTICATE, _API_VERSIONS = 17, 36, 18
_UNSUPPORTED_SASL_MECHANISM, _SASL_AUTHENTICATION_FAILED, _ILLEGAL_SASL_STATE = 33, 58, 34


# --- the SASL-terminating front -------------------------------------------------------------

@dataclass(frozen=True)
class ScramCredential:
    """What a server keeps for one SCRAM user: never the password itself."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    @classmethod
    def make(cls, mechanism: str, password: str, salt: bytes, iterations: int = 4096) -> "ScramCredential":
        h = _HASHES[mechanism]
        salted = hashlib.pbkdf2_hmac(h().name, password.encode(), salt, iterations)
        client_key = hmac.new(salted, b"Client Key", h).digest()
        return cls(salt, iterations, h(client_key).digest(), hmac.new(salted, b"Server Key", h).digest())


class ScramServer:
    """The server half of one SCRAM exchange (RFC 5802): two steps, then verdict."""

    def __init__(self, mechanism: str, users: dict[str, ScramCredential], nonce: str | None = None) -> None:
        self._h = _HASHES[mechanism]
        self._users = users
        self._nonce = nonce or secrets.token_urlsafe(18)
        self._first_bare = self._server_first = self._combined = ""
        self._cred: ScramCredential | None = None
        self.user: str | None = None

    def first(self, message: bytes) -> bytes:
        text = message.decode()
        if not text.startswith("n,"):
            raise PermissionError("channel binding / authzid not supported")
        self._first_bare = text.split(",", 2)[2]
        attrs = dict(kv.split("=", 1) for kv in self._first_bare.split(","))
        self.user = attrs["n"].replace("=2C", ",").replace("=3D", "=")
        cred = self._users.get(self.user)
        # an unknown user gets a made-up salt, so the reply does not tell who exists
        self._cred = cred or ScramCredential(secrets.token_bytes(16), 4096, b"", b"")
        self._combined = attrs["r"] + self._nonce
        self._server_first = (f"r={self._combined},s={base64.b64encode(self._cred.salt).decode()},"
                              f"i={self._cred.iterations}")
        return self._server_first.encode()

    def final(self, message: bytes) -> bytes:
        text = message.decode()
        without_proof, _, proof_attr = text.rpartition(",p=")
        attrs = dict(kv.split("=", 1) for kv in without_proof.split(","))
        if attrs.get("r") != self._combined or attrs.get("c") != "biws" or self._cred is None:
            raise PermissionError("nonce or channel binding mismatch")
        auth_message = f"{self._first_bare},{self._server_first},{without_proof}".encode()
        signature = hmac.new(self._cred.stored_key, auth_message, self._h).digest()
        proof = base64.b64decode(proof_attr)
        client_key = bytes(a ^ b for a, b in zip(proof, signature))
        if len(proof) != len(signature) or not hmac.compare_digest(
                self._h(client_key).digest(), self._cred.stored_key):
            raise PermissionError("invalid credentials")
        server_signature = hmac.new(self._cred.server_key, auth_message, self._h).digest()
        return b"v=" + base64.b64encode(server_signature)


@dataclass
class SaslFront:
    """A listener that authenticates Kafka SASL clients, then pipes them to ``upstream``."""

    upstream: tuple[str, int]
    plain: dict[str, str]
    scram: dict[str, dict[str, ScramCredential]]
    port: int = field(default_factory=free_port)
    authenticated: list[tuple[str, str]] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None

    def start(self) -> "SaslFront":
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            server = loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", self.port))
            ready.set()
            try:
                loop.run_forever()
            finally:
                server.close()
                loop.run_until_complete(server.wait_closed())
                loop.close()

        self._thread = threading.Thread(target=run, name="sasl-front", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("SASL front did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        try:
            if await self._authenticate(reader, writer, up_reader, up_writer):
                await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            for w in (writer, up_writer):
                w.close()

    async def _authenticate(self, reader, writer, up_reader, up_writer) -> bool:
        mechanism: str | None = None
        scram: ScramServer | None = None
        step = 0
        while True:
            frame = await _read_frame(reader)
            api_key, version, correlation = struct.unpack(">hhi", frame[:8])
            (client_len,) = struct.unpack(">h", frame[8:10])
            body = frame[10 + max(client_len, 0):]
            if api_key == _API_VERSIONS and mechanism is None:
                up_writer.write(struct.pack(">i", len(frame)) + frame)
                await up_writer.drain()
                writer.write(_frame(await _read_frame(up_reader)))
                await writer.drain()
            elif api_key == _SASL_HANDSHAKE and version in (0, 1) and mechanism is None:
                (n,) = struct.unpack(">h", body[:2])
                mechanism = body[2:2 + n].decode()
                ok = mechanism in self.plain_or_scram()
                reply = struct.pack(">hi", 0 if ok else _UNSUPPORTED_SASL_MECHANISM, len(MECHANISMS))
                reply += b"".join(_string(m) for m in MECHANISMS)
                await _respond(writer, correlation, reply)
                if not ok or version == 0:  # v0 carries raw tokens; aiokafka uses v1 here
                    return False
            elif api_key == _SASL_AUTHENTICATE and version in (0, 1) and mechanism is not None:
                (n,) = struct.unpack(">i", body[:4])
                token = body[4:4 + n]
                try:
                    if mechanism == "PLAIN":
                        _, user, password = token.decode().split("\0")
                        expected = self.plain.get(user)
                        if expected is None or not hmac.compare_digest(expected, password):
                            raise PermissionError("invalid credentials")
                        answer, done, who = b"", True, user
                    else:
                        if step == 0:
                            scram = ScramServer(mechanism, self.scram.get(mechanism, {}))
                            answer, done, who = scram.first(token), False, ""
                        else:
                            assert scram is not None
                            answer, done, who = scram.final(token), True, scram.user or ""
                except (PermissionError, ValueError, KeyError) as exc:
                    user = scram.user if scram is not None else token.split(b"\0")[-2:][0].decode(errors="replace")
                    self.refused.append((mechanism, user))
                    message = (f"Authentication failed during authentication due to invalid "
                               f"credentials with SASL mechanism {mechanism}: {exc}")
                    await _respond(writer, correlation, _auth_reply(version, _SASL_AUTHENTICATION_FAILED,
                                                                    message, b""))
                    return False
                step += 1
                await _respond(writer, correlation, _auth_reply(version, 0, None, answer))
                if done:
                    self.authenticated.append((mechanism, who))
                    return True
            else:  # Kafka drops a connection that sends anything else before authenticating
                self.refused.append((mechanism or "", f"api_key {api_key} before authentication"))
                return False

    def plain_or_scram(self) -> set[str]:
        return ({"PLAIN"} if self.plain else set()) | {m for m, users in self.scram.items() if users}


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (n,) = struct.unpack(">i", await reader.readexactly(4))
    return await reader.readexactly(n)


def _frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def _string(s: str | None) -> bytes:
    if s is None:
        return struct.pack(">h", -1)
    raw = s.encode()
    return struct.pack(">h", len(raw)) + raw


def _auth_reply(version: int, error: int, message: str | None, token: bytes) -> bytes:
    reply = struct.pack(">h", error) + _string(message) + struct.pack(">i", len(token)) + token
    return reply + (struct.pack(">q", 0) if version >= 1 else b"")


async def _respond(writer: asyncio.StreamWriter, correlation: int, body: bytes) -> None:
    writer.write(_frame(struct.pack(">i", correlation) + body))
    await writer.drain()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


# --- fixtures -------------------------------------------------------------------------------

@dataclass(frozen=True)
class SaslBroker:
    bootstrap: str
    users: dict[str, tuple[str, str]]  # mechanism -> (user, password), made for this run
    front: SaslFront

    def settings(self, mechanism: str, namespace: str, password: str | None = None) -> Settings:
        user, right = self.users[mechanism]
        kafka = KafkaSettings(bootstrap=self.bootstrap, security_protocol="SASL_PLAINTEXT",
                              sasl_mechanism=mechanism, sasl_username=user,
                              sasl_password=right if password is None else password,
                              idempotence="off")  # Tansu
        return Settings(kafka=kafka, topic_prefix=f"{namespace}.", namespace=namespace)


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SaslBroker]:
    users = {m: (f"{m.lower().replace('-', '')}-user", secrets.token_hex(12)) for m in MECHANISMS}
    plain = {users["PLAIN"][0]: users["PLAIN"][1]}
    scram = {m: {users[m][0]: ScramCredential.make(m, users[m][1], secrets.token_bytes(16))}
             for m in _HASHES}
    front_port = free_port()
    broker = EmbeddedTansu(log_path=Path(tmp_path_factory.mktemp("sasl")) / "tansu.log",
                            advertised=f"127.0.0.1:{front_port}").start()
    front = SaslFront(("127.0.0.1", broker.port), plain, scram, port=front_port).start()
    try:
        yield SaslBroker(f"127.0.0.1:{front_port}", users, front)
    finally:
        front.stop()
        broker.stop()


async def _round_trip(settings: Settings, name: str) -> tuple[SessionOpened, list]:
    """ensure_topics, send one record and read it back, all through ``settings``."""
    await ensure_topics(settings)
    rec = SessionOpened(session_id=f"s-{name}", ts=time.time(), prompt=name)
    async with RecordProducer(settings) as producer:
        await producer.send(rec)
        consumer = RecordConsumer(settings, [SESSION_EVENTS], producer, name=f"reader-{name}",
                                  group_id=f"{settings.namespace}-g")
        await consumer.start()
        got: list = []
        deadline = time.monotonic() + 20
        while not got and time.monotonic() < deadline:
            got.extend(await consumer.poll(timeout_ms=200))
        await consumer.stop()
    return rec, got


# --- tests ----------------------------------------------------------------------------------

def test_scram_server_matches_rfc7677_example():
    """The front's SCRAM-SHA-256 server reproduces the exchange printed in RFC 7677 §3."""
    cred = ScramCredential.make("SCRAM-SHA-256", "pencil", base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ=="))
    server = ScramServer("SCRAM-SHA-256", {"user": cred}, nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    assert server.first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO") == (
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    assert server.final(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=") == (
        b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_records_flow_through_sasl(sasl_broker, namespace, mechanism):
    settings = sasl_broker.settings(mechanism, namespace)
    rec, got = asyncio.run(_round_trip(settings, mechanism))
    assert [d.record for d in got] == [rec]
    user = sasl_broker.users[mechanism][0]
    assert (mechanism, user) in sasl_broker.front.authenticated


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_wrong_password_is_refused(sasl_broker, namespace, mechanism, caplog):
    settings = sasl_broker.settings(mechanism, namespace, password=secrets.token_hex(12))

    async def run() -> None:
        producer = RecordProducer(settings, request_timeout_ms=5000)
        try:
            await asyncio.wait_for(producer.start(), 20)
        finally:
            await producer.stop()

    caplog.set_level(logging.ERROR, logger="aiokafka")
    with pytest.raises(KafkaConnectionError, match="Unable to bootstrap"):
        asyncio.run(run())
    assert any(SaslAuthenticationFailed.__name__ in r.getMessage() for r in caplog.records)
    assert (mechanism, sasl_broker.users[mechanism][0]) in sasl_broker.front.refused


def test_plaintext_client_is_refused(sasl_broker, namespace):
    settings = Settings(kafka=KafkaSettings(bootstrap=sasl_broker.bootstrap, idempotence="off"),
                        topic_prefix=f"{namespace}.", namespace=namespace)

    async def run() -> None:
        producer = RecordProducer(settings, request_timeout_ms=3000)
        try:
            await asyncio.wait_for(producer.start(), 20)
        finally:
            await producer.stop()

    with pytest.raises(KafkaConnectionError):
        asyncio.run(run())


def test_settings_from_env_reach_the_client(sasl_broker, namespace):
    user, password = sasl_broker.users["SCRAM-SHA-512"]
    env = {"CHUNKSERVE_KAFKA_BOOTSTRAP": sasl_broker.bootstrap,
           "CHUNKSERVE_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
           "CHUNKSERVE_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
           "CHUNKSERVE_KAFKA_SASL_USERNAME": user,
           "CHUNKSERVE_KAFKA_SASL_PASSWORD": password,
           "CHUNKSERVE_KAFKA_IDEMPOTENCE": "off",  # the broker behind the front is Tansu
           "CHUNKSERVE_TOPIC_PREFIX": f"{namespace}.",
           "CHUNKSERVE_NAMESPACE": namespace}
    settings = Settings.from_env(env)
    rec, got = asyncio.run(_round_trip(settings, "env"))
    assert [d.record for d in got] == [rec]


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_faust_agent_consumes_through_sasl(sasl_broker, namespace, mechanism):
    from streams.faust_app import make_app

    settings = sasl_broker.settings(mechanism, namespace)
    payload = f"hello {mechanism}".encode()
    front = sasl_broker.front

    async def run() -> tuple[list[bytes], int]:
        catalogue = await ensure_topics(settings)
        before = len(front.authenticated)
        app = make_app(f"sasl-{mechanism.lower()}", settings)
        topic = app.topic(catalogue.name(SESSION_EVENTS), value_serializer="raw", key_serializer="raw")
        seen: list[bytes] = []
        done = asyncio.Event()

        @app.agent(topic)
        async def take(stream):  # noqa: ANN001 - faust's stream type
            async for value in stream:
                seen.append(value)
                done.set()

        await app.start()
        try:
            await topic.send(key=b"k", value=payload)
            await asyncio.wait_for(done.wait(), 40)
        finally:
            await app.stop()
        return seen, before

    seen, before = asyncio.run(run())
    assert seen == [payload]
    user = sasl_broker.users[mechanism][0]  # faust's own connections authenticated
    assert (mechanism, user) in front.authenticated[before:]
