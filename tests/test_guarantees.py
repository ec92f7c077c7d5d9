"""The README's guarantees are claims users rely on: each row names the test that proves it."""

from __future__ import annotations

import re

from tests.support import ROOT

README = (ROOT / "README.md").read_text()
TEST_FILES = {path.name for path in (ROOT / "tests").rglob("test_*.py")}


def guarantee_rows() -> list[str]:
    """The rows of the scenario table under ``## Guarantees``."""
    section = README.split("\n## Guarantees\n", 1)[1].split("\n## ", 1)[0]
    table = section.split("\n| scenario |", 1)[1].split("\n\n", 1)[0]
    return [line for line in table.splitlines() if line.startswith("| ")]


def test_every_guarantee_names_a_test_file_that_exists() -> None:
    rows = guarantee_rows()
    assert len(rows) >= 30
    for row in rows:
        named = re.findall(r"test_[a-z0-9_]+\.py", row)
        assert named, f"a guarantee names no test: {row[:100]}"
        missing = [name for name in named if name not in TEST_FILES]
        assert not missing, f"a guarantee names tests that do not exist {missing}: {row[:100]}"


def test_every_protocol_property_names_a_test_file_that_exists() -> None:
    section = README.split("\n## Guarantees\n", 1)[1].split("\n## ", 1)[0]
    table = section.split("\n| property |", 1)[1].split("\n\n", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) >= 10
    for row in rows:
        checked_by = row.split(" | ")[1]
        named = re.findall(r"test_[a-z0-9_]+\.py", checked_by)
        assert named, f"a property names no test that checks it: {row[:100]}"
        missing = [name for name in named if name not in TEST_FILES]
        assert not missing, f"a property names tests that do not exist {missing}: {row[:100]}"
