"""A pytest plugin for tests that replay recorded runs (``journal.testing``).

Enable it in a ``conftest.py`` with ``pytest_plugins = ["journal.testing.pytest_plugin"]``, then
name a test's recorded run with a marker; the ``journal_fixture`` fixture reads it::

    @pytest.mark.journal_fixture("tests/fixtures/digest-2026-w42.json")
    def test_last_week(journal_fixture: Fixture) -> None:
        assert replay(digest, journal_fixture).status == "done"

A relative path is read from the pytest root directory. Kept apart from ``journal.testing``
so that the library never imports pytest.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from journal.testing.fixture import Fixture

MARKER = "journal_fixture"


def pytest_configure(config: pytest.Config) -> None:
    """Declare the marker, so ``--strict-markers`` accepts it."""
    config.addinivalue_line("markers", f"{MARKER}(path): the recorded run journal_fixture reads")


@pytest.fixture
def journal_fixture(request: pytest.FixtureRequest) -> Fixture:
    """The recorded run the test's ``journal_fixture(path)`` marker names, read and checked."""
    marker = request.node.get_closest_marker(MARKER)
    if marker is None or not marker.args:
        raise pytest.UsageError(
            f"{request.node.nodeid} uses journal_fixture without @pytest.mark.{MARKER}(path)"
        )
    path = Path(marker.args[0])
    return Fixture.read(path if path.is_absolute() else request.config.rootpath / path)
