"""Test PKI and a TLS-terminating proxy (Debian's stunnel) in front of real services.

The embedded Tansu broker speaks plaintext only, so TLS is tested the way many deployments
run it: a terminating proxy in front of the broker, with the broker advertising the proxy's
address. The same proxy puts TLS in front of Redis. Certificates come from the openssl
command line (``make_pki`` also gives the secured Apache Kafka of
``tests/infra/test_kafka_security.py`` its certificate); nothing here is used outside tests.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from infra.embedded import wait_for_port

__all__ = ["Pki", "make_pki", "stunnel"]


@dataclass(frozen=True)
class Pki:
    ca: Path          # the CA that signed the server certificate
    other_ca: Path    # an unrelated CA: clients trusting only this must refuse the server
    cert: Path
    key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _self_signed_ca(folder: Path, name: str) -> tuple[Path, Path]:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2",
             "-subj", f"/CN=chunkserve test {name}", cwd=folder)
    return folder / f"{name}.pem", folder / f"{name}.key"


def make_pki(folder: Path) -> Pki:
    """A CA, a server certificate for 127.0.0.1 / localhost signed by it, and a second CA."""
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key = _self_signed_ca(folder, "ca")
    other, _ = _self_signed_ca(folder, "other-ca")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1", cwd=folder)
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", ca.name, "-CAkey", ca_key.name,
             "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "san.ext", cwd=folder)
    return Pki(ca=ca, other_ca=other, cert=folder / "server.pem", key=folder / "server.key")


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
