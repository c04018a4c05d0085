"""Certificates and passwords for a broker on this machine, from the openssl command line.

``make_pki`` makes a CA and a server certificate for 127.0.0.1 / localhost signed by it (and a
second, unrelated CA that tests trust to check a refusal). ``local_security`` gives
``chunkserve broker start --secure`` its CA, certificate, one password per role and a
command-signing key, made once
in a private folder and read again on every later start, so the users made when the broker's
storage was formatted keep signing in.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from schemas.errors import InfraError
from streams.kafka_acls import ROLES
from streams.signing import new_key

__all__ = ["Pki", "make_pki", "local_security", "LOCAL_USERS"]


@dataclass(frozen=True)
class Pki:
    ca: Path          # the CA that signed the server certificate
    other_ca: Path | None  # an unrelated CA (tests): clients trusting only this must refuse the server
    cert: Path
    key: Path


def _openssl(*args: str, cwd: Path) -> None:
    if shutil.which("openssl") is None:
        raise InfraError("the openssl command is not installed (Debian's openssl package): it makes the certificates")
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise InfraError(f"openssl {args[0]} failed: {done.stderr.strip()[-300:]}")


def _self_signed_ca(folder: Path, name: str, days: int) -> tuple[Path, Path]:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", str(days),
             "-subj", f"/CN=chunkserve {name}", cwd=folder)
    return folder / f"{name}.pem", folder / f"{name}.key"


def make_pki(folder: Path, days: int = 2, other: bool = True) -> Pki:
    """A CA, a server certificate for 127.0.0.1 / localhost signed by it, and (``other``, for
    tests) a second CA."""
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key = _self_signed_ca(folder, "ca", days)
    other_ca = _self_signed_ca(folder, "other-ca", days)[0] if other else None
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1", cwd=folder)
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", ca.name, "-CAkey", ca_key.name,
             "-CAcreateserial", "-out", "server.pem", "-days", str(days), "-extfile", "san.ext", cwd=folder)
    for key in folder.glob("*.key"):
        key.chmod(0o600)
    for scratch in ("server.csr", "san.ext", "ca.srl"):  # the signing's own files
        (folder / scratch).unlink(missing_ok=True)
    return Pki(ca=ca, other_ca=other_ca, cert=folder / "server.pem", key=folder / "server.key")


#: the users of ``broker start --secure``: its admin and one per role of ``chunkserve acls``
LOCAL_USERS = ("admin", *ROLES)


def local_security(folder: Path) -> tuple[Pki, dict[str, Path]]:
    """The certificates and each user's password file in ``folder`` (mode 0700, its files
    0600), made on the first call and read on later ones."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.chmod(0o700)
    pki = Pki(folder / "ca.pem", None, folder / "server.pem", folder / "server.key")
    if not all(p.exists() for p in (pki.ca, pki.cert, pki.key)):
        pki = make_pki(folder, days=825, other=False)
    files = {}
    for user in LOCAL_USERS:
        files[user] = _secret(folder / f"{user}.password", lambda: secrets.token_hex(16))
    # the command-signing key (an Ed25519 pair's private entry): `up` hands its readers the public half
    files["command-keys"] = _secret(folder / "command-keys", lambda: new_key("local")[0])
    # the masters of worker-events' signatures: `up` and the provisioner hand each worker its own key
    files["event-keys"] = _secret(folder / "event-keys", lambda: f"local:{secrets.token_hex(32)}")
    return pki, files


def _secret(path: Path, make: Callable[[], str]) -> Path:
    """``path``, written once with ``make()`` (mode 0600, never over a file that is there)."""
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(make() + "\n")
    return path
