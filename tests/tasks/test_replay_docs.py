"""The replay tests of docs/journal.md, run as printed: if the example breaks, this fails.

The page's block is executed as a module; each of its tests is then called the way pytest
calls it, with the fixture its marker names read by ``journal.testing.pytest_plugin`` (enabled in
tests/conftest.py). The fake Anthropic API counts the model calls: none for the replay, one
for the opening run live.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from journal.testing.fixture import Fixture
from tests.fakes.anthropic_server import FakeAnthropic
from tests.support import ROOT

PAGE = ROOT / "docs" / "journal.md"
HEADING = "## Replaying recorded runs"


def example() -> dict[str, Any]:
    """The names of the python block under the heading, run as a module of its own."""
    page = PAGE.read_text(encoding="utf-8")
    assert f"\n{HEADING}\n" in page, f"docs/journal.md has no {HEADING!r} section"
    section = page.split(f"\n{HEADING}\n", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    namespace: dict[str, Any] = {"__name__": "docs_journal_replay"}
    exec(compile(block, str(PAGE), "exec"), namespace)
    return namespace


def recorded(test: Any) -> Fixture:
    """The fixture a test's ``journal_fixture`` marker names, as the plugin reads it."""
    (marker,) = [mark for mark in test.pytestmark if mark.name == "journal_fixture"]
    return Fixture.read(ROOT / marker.args[0])


@pytest.mark.journal_fixture("tests/fixtures/digest-2026-w42.json")
def test_the_plugin_reads_the_fixture_a_marker_names(journal_fixture: Fixture) -> None:
    assert journal_fixture.run == "digest:2026-w42"
    assert [step.key for step in journal_fixture.steps][-3:] == ["send", "mark-seen", "done"]


def test_the_pages_replay_tests_pass_with_one_model_call_for_the_live_step(
    fake_anthropic: FakeAnthropic,
) -> None:
    names = example()
    same = names["test_the_recorded_week_replays_to_the_same_email"]
    tried = names["test_a_new_opening_from_the_recorded_summaries"]

    same(recorded(same))
    assert fake_anthropic.calls == 0
    tried(recorded(tried))
    assert fake_anthropic.calls == 1
