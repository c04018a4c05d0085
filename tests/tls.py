"""Test PKI and a TLS-terminating proxy (Debian's stunnel) in front of real services.

The embedded Tansu broker speaks plaintext only, so TLS is tested the way many deployments
run it: a terminating proxy in front of the broker, with the broker advertising the proxy's
address. The same proxy puts TLS in front of Redis. Certificates come from ``infra.pki``
(the openssl command line), as ``chunkserve broker start --secure``'s do.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

from infra.embedded import wait_for_port
from infra.pki import Pki, make_pki

__all__ = ["Pki", "make_pki", "stunnel"]


@contextlib.contextmanager
def stunnel(folder: Path, pki: Pki, routes: dict[int, str]) -> Iterator[None]:
    """Run stunnel terminating TLS on each ``127.0.0.1:port`` and forwarding to its target
    (``host:port`` or a unix socket path) until the block ends."""
    binary = shutil.which("stunnel4") or shutil.which("stunnel")
    if binary is None:
        raise RuntimeError("stunnel is not installed: `make test` installs Debian's stunnel4")
    lines = ["foreground = yes", "pid =", f"output = {folder / 'stunnel.log'}", "debug = 5"]
    for port, target in routes.items():
        lines += [f"[p{port}]", f"accept = 127.0.0.1:{port}", f"connect = {target}",
                  f"cert = {pki.cert}", f"key = {pki.key}"]
    conf = folder / "stunnel.conf"
    conf.write_text("\n".join(lines) + "\n")
    proc = subprocess.Popen([binary, str(conf)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        for port in routes:
            wait_for_port("127.0.0.1", port, timeout_s=10.0)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
