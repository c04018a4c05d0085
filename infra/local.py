"""Local process fleet: dispatch replicas and workers as child processes of this one.

The embedded default for one machine; every child reads its endpoints from the
``CHUNKSERVE_*`` environment this module passes down, logs to its own file and stops when
this process dies (``workers.supervision``).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from schemas.errors import ChunkserveError, LeaseHeldError
from streams.config import PROVISIONER_ENV, Settings
from streams.lease import PROCESSOR_LEASE_S, Lease, holder_of
from streams.config_file import SASL_ROLES, child_env, role_sasl_env
from streams.signing import (COMMAND_KEYS_ENV, COMMAND_SIGNERS, EVENT_KEY_HOLDERS, EVENT_KEYS_ENV, CommandKeys,
                             worker_env)
from workers.supervision import spawn, stop_in_order

__all__ = ["LocalFleet", "FleetLease", "child_env", "after_exit", "RESTARTS", "RESTART_WINDOW_S"]

RESTARTS, RESTART_WINDOW_S = 5, 300.0  # a child that exits this often this fast is not restarted again


def after_exit(code: int | None, restarts: Sequence[float], now: float) -> str | None:
    """What a supervisor does with a child that exited with ``code``, given when it restarted
    it before: None, start it again (every processor rebuilds from the topics); else why the
    fleet stops (a setting the child refused, which a restart cannot mend, or a crash loop)."""
    if code == 2:
        return "it refused a setting (exit code 2)"
    if sum(t > now - RESTART_WINDOW_S for t in restarts) >= RESTARTS:
        return f"it exited {RESTARTS + 1} times within {RESTART_WINDOW_S:g} s"
    return None


class FleetLease:
    """`up`'s hold on its topic prefix, so that one fleet runs per prefix: a second `up` is
    refused in one line before it starts anything (its provisioner had joined the group and
    started a worker under an id the running fleet then used again). The lease (in Redis,
    as the processors') is taken and kept by a thread of its own, as `up` supervises in a
    plain loop; ``lost`` is set when another process took it while this one could not
    refresh it."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.lost: ChunkserveError | None = None
        self._ready = threading.Event()
        self._refused: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._hold()), name="up-lease", daemon=True)

    def take(self) -> None:
        """Take the lease (waiting out one that a killed `up` left), or raise why not."""
        self._thread.start()
        self._ready.wait()
        if self._refused is not None:
            raise self._refused

    def release(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=PROCESSOR_LEASE_S)

    async def _hold(self) -> None:
        from streams.generations import GenerationStore

        store = GenerationStore.from_settings(self.settings)
        prefix = self.settings.topic_prefix
        try:
            lease = Lease(store, f"up:{prefix}", PROCESSOR_LEASE_S)
            answer = await lease.take()
            if not answer.ours:
                self._refused = LeaseHeldError(lease.name, holder_of(answer.holder), (
                    f"a fleet (chunkserve up) of topic prefix {prefix!r} is running already ({holder_of(answer.holder)}); run "
                    f"one per topic prefix (one that stopped without a clean shutdown frees its place within "
                    f"{PROCESSOR_LEASE_S:g} s)"))
                return
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            self._ready.set()
            taken = await lease.keep(self._stop, PROCESSOR_LEASE_S / 5)
            if taken is None:
                await lease.release()
            else:
                self.lost = ChunkserveError(f"the fleet's lease on topic prefix {prefix!r} was taken by another "
                                            f"`up` ({holder_of(taken.holder)}) while this one could not refresh it")
        except Exception as exc:  # noqa: BLE001 - Redis out of reach at start: `up` says so in one line
            self._refused = exc if isinstance(exc, ChunkserveError) else ChunkserveError(f"the fleet's lease: {exc}")
        finally:
            self._ready.set()
            await store.aclose()


@dataclass
class LocalFleet:
    """Starts and stops chunkserve child processes; each logs to ``log_dir/<name>.log``."""

    settings: Settings
    log_dir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    extra_env: dict[str, str] = field(default_factory=dict)
    # per role (worker, provisioner, or the processor's name): variables over the rest, e.g.
    # each role's SASL user and password, so every process runs as its own principal
    role_env: dict[str, dict[str, str]] = field(default_factory=dict)
    specs: dict[str, tuple[list[str], dict[str, str] | None, str]] = field(default_factory=dict)

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None,
               role: str = "") -> subprocess.Popen[bytes]:
        self.specs[name] = (args, env, role)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        given = {**child_env(self.settings), **self.extra_env, **(env or {})}
        if role not in COMMAND_SIGNERS and (verify_only := CommandKeys.from_env(given).verify_only()):
            given[COMMAND_KEYS_ENV] = verify_only  # an Ed25519 key's public half: it reads commands, writes none
        if role == "worker":
            worker_env(given, name)  # its own event key, nothing that signs for another worker
        elif role not in EVENT_KEY_HOLDERS:
            given.pop(EVENT_KEYS_ENV, None)
        for other in SASL_ROLES:  # every role's password stays with the one that needs it
            if not (role == "provisioner" and other == "worker"):  # it hands its workers theirs
                for var in role_sasl_env(other):
                    given.pop(var, None)
        with open(self.log_dir / f"{name}.log", "ab") as log:
            proc = spawn([sys.executable, "-m", "infra", *args], {**given, **self.role_env.get(role, {})},
                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.procs[name] = proc
        return proc

    def start_worker(self, worker_id: str, capacity: int = 8, chunk_interval_s: float = 0.1,
                     gpu_type: str = "cpu") -> None:
        self._spawn(worker_id, ["worker", "--worker-id", worker_id, "--capacity", str(capacity),
                                "--chunk-interval", str(chunk_interval_s), "--gpu-type", gpu_type],
                    {PROVISIONER_ENV: "local-fleet"},  # this fleet stops its workers: control may shut them down
                    role="worker")

    def start_provisioner(self, options: Sequence[str] = ()) -> None:
        self._spawn("provisioner", ["provisioner", *options], role="provisioner")

    def start_processor(self, name: str, replica: str = "0", options: Sequence[str] = ()) -> None:
        self._spawn(f"{name}-{replica}", ["processor", name, *options], role=name)

    def restart(self, name: str) -> subprocess.Popen[bytes]:
        """Start the child ``name`` again as it was started (it exited; its log goes on)."""
        self.procs.pop(name, None)
        args, env, role = self.specs[name]
        return self._spawn(name, args, env, role)

    def alive(self) -> dict[str, bool]:
        return {name: p.poll() is None for name, p in self.procs.items()}

    def failed(self) -> str | None:
        """The first child that exited by itself with an error, with the last line its log
        says (a bad setting, say); None while none has."""
        for name, p in self.procs.items():
            if p.poll() not in (None, 0):
                return f"{name} exited with code {p.returncode}: {last_words(self.log_dir / f'{name}.log')}"
        return None

    def stop(self, name: str, timeout_s: float = 10.0) -> int | None:
        proc = self.procs.pop(name, None)
        if proc is None:
            return None
        stop_in_order([[proc]], timeout_s)
        return proc.returncode

    def kill(self, name: str) -> None:
        """SIGKILL a child (a crash, for recovery and chaos runs)."""
        proc = self.procs.pop(name)
        proc.kill()
        proc.wait(timeout=10)

    def stop_all(self, first: Sequence[str] = (), grace_s: float = 10.0) -> None:
        """Stop the children named in ``first`` one after the other, then the rest together:
        SIGTERM, and SIGKILL for any still running after ``grace_s``."""
        groups = [[self.procs.pop(n)] for n in first if n in self.procs]
        rest = list(self.procs.values())
        self.procs.clear()
        stop_in_order([*groups, rest], grace_s)


def last_words(log: Path, tail_bytes: int = 4096) -> str:
    """The last line of ``log`` that says something (not a box-drawing rule), or a note."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - tail_bytes))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    said = [t for t in (line.strip(" │╭╮╰╯─┃━") for line in lines) if any(c.isalnum() for c in t)]
    return said[-1] if said else "(an empty log)"
