"""docs/guarantees.md holds claims users rely on: each row names the test that proves it."""

from __future__ import annotations

import re

from tests.support import ROOT

PAGE = (ROOT / "docs" / "guarantees.md").read_text()
TEST_FILES = {path.name for path in (ROOT / "tests").rglob("test_*.py")}


def section(heading: str) -> str:
    """The text under ``## heading`` of the guarantees page, up to the next heading."""
    assert f"\n## {heading}\n" in PAGE, f"docs/guarantees.md has no {heading!r} section"
    return PAGE.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def table_rows(text: str, header: str) -> list[str]:
    """The body rows of the table whose header row starts with ``| header |``."""
    table = text.split(f"\n| {header} |", 1)[1].split("\n\n", 1)[0]
    return [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]


def test_every_guarantee_names_a_test_file_that_exists() -> None:
    rows = table_rows(section("Failure scenarios"), "scenario")
    assert len(rows) >= 30
    for row in rows:
        named = re.findall(r"test_[a-z0-9_]+\.py", row)
        assert named, f"a guarantee names no test: {row[:100]}"
        missing = [name for name in named if name not in TEST_FILES]
        assert not missing, f"a guarantee names tests that do not exist {missing}: {row[:100]}"


def test_every_protocol_property_names_a_test_file_that_exists() -> None:
    rows = table_rows(section("The protocol, proven"), "property")
    assert len(rows) >= 10
    for row in rows:
        checked_by = row.split(" | ")[1]
        named = re.findall(r"test_[a-z0-9_]+\.py", checked_by)
        assert named, f"a property names no test that checks it: {row[:100]}"
        missing = [name for name in named if name not in TEST_FILES]
        assert not missing, f"a property names tests that do not exist {missing}: {row[:100]}"
