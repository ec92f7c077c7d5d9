"""Every page state seen in headless Chromium, and the screenshots docs/operations.md shows.

The runs of ``console_states`` (made by the real digest in this process) and 10,000 more in
the index, served by the console's own app on a loopback port, read by Debian's ``chromium``
through Playwright. ``DIGEST_SCREENSHOTS=docs`` (``make screenshots``) writes the PNGs into
docs/; otherwise into the test's own directory.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from werkzeug.serving import make_server

from tasks.ops.console import Names, create_app
from tests.support import ROOT
from tests.tasks.ops import test_console_browser as chromium
from tests.tasks.ops.console_states import every_state, many_runs, runtime_for

pytestmark = pytest.mark.slow  # it starts Playwright's driver and a browser

browser = chromium.browser  # the fixture: Debian's chromium, or a skip that says why

STATES = ("sent", "rejected", "nothing-new", "waiting", "retrying", "failed", "held", "ambiguous")


@pytest.fixture
def served(
    real_redis: redis.Redis, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, dict[str, str]]]:
    monkeypatch.chdir(tmp_path)
    runtime = runtime_for(real_redis, prefix, tmp_path)
    runs = every_state(runtime, tmp_path)
    port = chromium.free_port()
    server = make_server("127.0.0.1", port, create_app(runtime, Names.bound("127.0.0.1", port)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}", runs
    finally:
        server.shutdown()


def shots_dir(tmp_path: Path) -> Path:
    chosen = (
        ROOT / os.environ["DIGEST_SCREENSHOTS"] if "DIGEST_SCREENSHOTS" in os.environ else tmp_path
    )
    chosen.mkdir(exist_ok=True)
    return chosen


def test_each_run_state_reads_in_a_browser(
    served: tuple[str, dict[str, str]],
    browser: Any,
    tmp_path: Path,
) -> None:
    base, runs = served
    shots = shots_dir(tmp_path)
    page = browser.new_page(viewport={"width": 1280, "height": 900}, timezone_id="Europe/Paris")
    said = {}
    for state in STATES:
        page.goto(f"{base}/runs/{runs[state]}")
        said[state] = page.locator("#outcome").inner_text()
        assert page.locator("#timeline .lane").count() > 0
        page.screenshot(path=str(shots / f"console-run-{state}.png"), full_page=True)
    assert "Rejected by console" in said["rejected"] and "the intro is wrong" in said["rejected"]
    assert "Sent 4 items to team@example.com" in said["sent"]
    assert "Nothing new" in said["nothing-new"]
    assert "Waiting for approval until" in said["waiting"]
    assert "Failed; it retries" in said["retrying"]
    assert "Failed for good" in said["failed"]
    assert "held by digest:2026-w45" in said["held"]
    assert "may have been sent" in said["ambiguous"]
    # Times in the reader's zone, UTC on hover.
    stamp = page.locator("#outcome time").first
    assert "UTC" in str(stamp.get_attribute("title")) and "UTC" not in stamp.inner_text()
    # A failed attempt is red, with its error open; the fork is one control showing its diff.
    page.goto(f"{base}/runs/{runs['retrying']}")
    assert "answered 421" in page.locator("#timeline details.error").inner_text()
    page.goto(f"{base}/runs/{runs['sent']}")
    page.select_option("#fork-step", "compose")
    page.click("#fork-preview")
    said = page.locator("h1").inner_text()
    assert said == "Fork 2026-w40: run again from “compose the introduction”?"
    assert page.locator("#fork-cost").inner_text() == "no model calls, costing nothing"


def test_ten_thousand_runs_page_and_read_at_phone_width(
    served: tuple[str, dict[str, str]],
    browser: Any,
    real_redis: redis.Redis,
    prefix: str,
    tmp_path: Path,
) -> None:
    base, _ = served
    shots = shots_dir(tmp_path)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{base}/")
    page.screenshot(path=str(shots / "console-runs.png"), full_page=True)
    from journal import Journal, Keyspace

    many_runs(Journal(real_redis, keyspace=Keyspace(prefix)), 10_000, 1_700_000_000_000)
    page.goto(f"{base}/?limit=1000&outcome=sent")
    pages, seen = 1, page.locator("#runs tbody tr").count()
    while page.locator("#older").count():
        with page.expect_navigation():
            page.click("#older")
        pages += 1
        seen += page.locator("#runs tbody tr").count()
    assert seen == 6666 + 1  # two of every three load runs sent, and 2026-w40
    assert pages == 7

    phone = browser.new_page(viewport={"width": 390, "height": 844})
    phone.goto(f"{base}/")
    assert phone.locator("#runs th.wide").first.is_hidden()
    width = phone.evaluate("document.documentElement.scrollWidth")
    assert width <= 390
    phone.screenshot(path=str(shots / "console-runs-phone.png"))
    phone.goto(f"{base}/runs/2026-w41")
    phone.screenshot(path=str(shots / "console-run-phone.png"), full_page=True)
