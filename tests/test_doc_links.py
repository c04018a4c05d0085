"""The README and docs/ hold together: every relative link reaches a file and, when it names
one, a heading (the reference moved from the README into docs/, and a link left behind points
at nothing), and the table both give is the same."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6} (.*?)\s*#*\s*$")


def _prose(path: Path) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks, numbered."""
    out, fence = [], False
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
        elif not fence:
            out.append((n, line))
    return out


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, only letters, digits, spaces, '-' and '_', spaces
    as '-', a repeated one suffixed -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in _prose(path):
        m = _HEADING.match(line)
        if m:
            slug = re.sub(r"[^a-z0-9 _-]", "", m.group(1).strip().lower()).replace(" ", "-")
            k = seen.get(slug, 0)
            out.add(slug if k == 0 else f"{slug}-{k}")
            seen[slug] = k + 1
    return out


def test_anchor_rules() -> None:
    assert _HEADING.match("## The SLO mode's burst reserve")
    assert re.sub(r"[^a-z0-9 _-]", "", "the slo mode's burst reserve").replace(" ", "-") == "the-slo-modes-burst-reserve"


def test_every_relative_link_reaches_its_file_and_heading() -> None:
    broken = []
    for doc in DOCS:
        for n, line in _prose(doc):
            for target in _LINK.findall(line):
                if re.match(r"^[a-z]+:", target):  # https:, mailto:
                    continue
                path, _, anchor = target.partition("#")
                dest = (doc.parent / path).resolve() if path else doc
                where = f"{doc.relative_to(ROOT)}:{n}: {target}"
                if not dest.exists():
                    broken.append(f"{where}: no such file")
                elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
                    broken.append(f"{where}: no such heading")
    assert not broken, "\n".join(broken)


def _glance(path: Path) -> list[str]:
    """The rows of the "Every split at a glance" table."""
    text = path.read_text()
    start = text.index("| model (split) | traces |")
    return text[start:].split("\n\n", 1)[0].splitlines()


def test_the_readme_and_the_simulator_doc_give_the_same_splits_at_a_glance() -> None:
    """The front page copies the table from docs/simulator.md: a split added to one only
    would read as a different count of traces and bars in each."""
    ours = _glance(ROOT / "README.md")
    assert ours == _glance(ROOT / "docs" / "simulator.md") and len(ours) >= 10
