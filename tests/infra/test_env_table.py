"""Every environment variable the code reads is in the README's configuration table."""

from __future__ import annotations

import re
from pathlib import Path

from streams.config_file import KEYS, SASL_ROLES, env_var, role_sasl_env

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("schemas", "streams", "processors", "workers", "infra")
# read by the code but the operating system's, not chunkserve's to document
SYSTEM = {"PATH"}
_READ = re.compile(r"""(?:environ\.get|environ\[|getenv|env\.get|env\[|envvar=)\(?\s*["']([A-Z][A-Z0-9_]*)["'](?!\]\s*=[^=])""")
_NAMED = re.compile(r"""["'](CHUNKSERVE_[A-Z0-9_]*[A-Z0-9])["']""")


def read_by_code() -> set[str]:
    names = {env_var(k) for k in KEYS} | {v for role in SASL_ROLES for v in role_sasl_env(role)}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text()
            names |= set(_READ.findall(text)) | set(_NAMED.findall(text))
    return names - SYSTEM


def documented() -> list[str]:
    """Names in the first column of the README's configuration table; ``_X`` after a name
    replaces its last part (`CHUNKSERVE_KAFKA_SSL_CAFILE` / `_CERTFILE`), ``<TOPIC>`` stands
    for any topic."""
    text = (ROOT / "README.md").read_text()
    table = text.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    names: list[str] = []
    for row in table.splitlines():
        if not row.startswith("| `"):
            continue
        first = None
        for token in re.findall(r"`([A-Z_<>]+[A-Z0-9_<>]*)`", row.split(" | ")[0]):
            if token.startswith("_") and first:
                names.append(first.rsplit("_", 1)[0].rstrip("_") + token)
            else:
                first = token
                names.append(token)
    return names


def test_every_variable_the_code_reads_is_documented():
    patterns = [re.compile(re.escape(n).replace(re.escape("<TOPIC>"), "[A-Z_]+").replace(re.escape("<ROLE>"), "[A-Z]+")
                           + "$") for n in documented()]
    missing = sorted(n for n in read_by_code() if not any(p.match(n) for p in patterns))
    assert not missing, f"read by the code, not in README.md's configuration table: {missing}"


def test_the_table_names_nothing_the_code_does_not_read():
    code = read_by_code()
    stale = [n for n in documented() if "<TOPIC>" not in n and n not in code
             and not ("<ROLE>" in n and any(n.replace("<ROLE>", r.upper()) in code for r in SASL_ROLES))]
    assert not stale, f"in the README's table, read nowhere: {stale}"


def test_the_check_sees_names_spelt_out_in_a_mapping():
    assert {"CHUNKSERVE_BOOT_S", "CHUNKSERVE_CONTROL_TICK_S", "CHUNKSERVE_DETECTOR_TICK_S",
            "CHUNKSERVE_GPU_TYPE", "CHUNKSERVE_KAFKA_SASL_PASSWORD", "XDG_CACHE_HOME"} <= read_by_code()
