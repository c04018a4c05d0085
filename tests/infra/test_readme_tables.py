"""The Kafka ACL table (docs/security.md) and the README's record bounds say what the code grants and sets."""

from __future__ import annotations

import re
from pathlib import Path

from schemas.topics import TOPICS
from streams.kafka_acls import ROLES

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
SECURITY = (ROOT / "docs" / "security.md").read_text()


def _topics(cell: str) -> set[str]:
    return {t for t in re.findall(r"`([a-z-]+)`", cell) if t in TOPICS}


def test_the_security_doc_acl_table_grants_what_roles_grants():
    table = SECURITY.split("| role | reads | writes | consumer group |", 1)[1].split("\n\n", 1)[0]
    rows = {}
    for row in table.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) == 4 and not cells[0].startswith("---"):
            rows[cells[0].split()[0]] = (_topics(cells[1]), _topics(cells[2]))
    assert set(rows) == set(ROLES)
    for name, role in ROLES.items():
        assert rows[name] == (set(role.reads), set(role.writes)), name


def test_the_readme_record_bounds_are_the_topics():
    said = README.split("Default record bounds per topic", 1)[1].split("\n\n", 1)[0]
    bounds: dict[str, int] = {}
    for names, kib in re.findall(r"((?:`[a-z-]+`(?:,| and| or)?\s*)+)(\d+) KiB", said):
        for name in re.findall(r"`([a-z-]+)`", names):
            bounds[name] = int(kib) * 1024
    for part in re.findall(r"((?:`[a-z-]+`(?:,| and| or)?\s*)+)(\d+) MiB", said):
        for name in re.findall(r"`([a-z-]+)`", part[0]):
            bounds[name] = int(part[1]) * 1024 * 1024
    assert bounds == {name: spec.max_bytes for name, spec in TOPICS.items()}
