"""The README and the pages under docs/: the first two commands, the index, and every link.

A reader's first minute is the README's first block, so it is pinned byte for byte; the pages
are reached from the README's index, and a link that points at a moved section or a renamed
file fails here rather than in front of a reader.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.support import ROOT

README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
FIRST_COMMANDS = (
    "# durable-digest\n"
    "\n"
    "```sh\n"
    "make run     # install, then run this week's digest"
    " (embedded Valkey, offline summarizer: no Redis, Docker or API key)\n"
    "make test    # install, then ruff, mypy, every test"
    " (unit, contract, real Celery workers, real signals), mutants\n"
    "```\n"
)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> list[str]:
    """The lines outside code fences: only there is a link or a heading one."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of a page (a repeated heading gets ``-1``, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose(path.read_text(encoding="utf-8")):
        heading = re.match(r"#{1,6} (.+)", line)
        if heading is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def relative_links(path: Path) -> list[str]:
    """The targets of a page's links that point inside the repository."""
    return [
        target
        for line in prose(path.read_text(encoding="utf-8"))
        for target in LINK.findall(line)
        if not re.match(r"[a-z]+:", target)
    ]


def test_the_readme_starts_with_the_two_commands() -> None:
    assert README.read_text(encoding="utf-8").startswith(FIRST_COMMANDS)


def test_the_readme_indexes_every_page_under_docs() -> None:
    linked = {(README.parent / target.split("#")[0]).resolve() for target in relative_links(README)}
    unlinked = [page.name for page in PAGES if page.resolve() not in linked]
    assert unlinked == [], f"pages the README's index does not link: {unlinked}"


def test_every_relative_link_reaches_a_file_and_its_anchor() -> None:
    broken = []
    checked = 0
    for page in [README, *PAGES]:
        for target in relative_links(page):
            checked += 1
            name, _, anchor = target.partition("#")
            destination = (page.parent / name).resolve() if name else page
            if not destination.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert checked >= 30
    assert broken == []
