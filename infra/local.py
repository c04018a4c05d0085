"""Local process fleet: dispatch replicas and workers as child processes of this one.

The embedded default for one machine; every child reads its endpoints from the
``CHUNKSERVE_*`` environment this module passes down, and logs to its own file.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from streams.config import Settings, child_env

__all__ = ["LocalFleet", "child_env"]


@dataclass
class LocalFleet:
    """Starts and stops chunkserve child processes; each logs to ``log_dir/<name>.log``."""

    settings: Settings
    log_dir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    extra_env: dict[str, str] = field(default_factory=dict)

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "infra", *args],
                                    env={**child_env(self.settings), **self.extra_env},
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.procs[name] = proc
        return proc

    def start_worker(self, worker_id: str, capacity: int = 8, chunk_interval_s: float = 0.1,
                     gpu_type: str = "cpu") -> None:
        self._spawn(worker_id, ["worker", "--worker-id", worker_id, "--capacity", str(capacity),
                                "--chunk-interval", str(chunk_interval_s), "--gpu-type", gpu_type])

    def start_provisioner(self) -> None:
        self._spawn("provisioner", ["provisioner"])

    def start_processor(self, name: str, replica: str = "0") -> None:
        self._spawn(f"{name}-{replica}", ["processor", name])

    def alive(self) -> dict[str, bool]:
        return {name: p.poll() is None for name, p in self.procs.items()}

    def stop(self, name: str, timeout_s: float = 10.0) -> int | None:
        proc = self.procs.pop(name, None)
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        return proc.returncode

    def kill(self, name: str) -> None:
        """SIGKILL a child (a crash, for recovery and chaos runs)."""
        proc = self.procs.pop(name)
        proc.kill()
        proc.wait(timeout=10)

    def stop_all(self) -> None:
        for name in list(self.procs):
            proc = self.procs[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # a paused child cannot handle SIGTERM
                proc.send_signal(signal.SIGTERM)
        for name in list(self.procs):
            self.stop(name)
