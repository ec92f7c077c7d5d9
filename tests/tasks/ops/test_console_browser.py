"""The console driven in a real headless browser against real processes.

Debian's ``chromium`` driven by Playwright's Python API (the system browser: nothing is
downloaded), a real ``digest console``, a real worker and beat on an isolated deployment, the
offline summarizer in the CLI and the fake Anthropic API on the worker. The operator lists
runs, opens one, approves a waiting run and sees its email go out, rejects another, sees the
model call a running one is in, cancels it, and forks a finished one from a step after reading
the fork's preview and what it would cost (the console asks the fake API too). Each page is
saved as a screenshot, to ``DIGEST_SCREENSHOTS`` when set (``DIGEST_SCREENSHOTS=docs``
refreshes the ones docs/operations.md shows).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tasks.keys import DigestKeys
from tasks.llm.cost import dollars
from tests.fakes.anthropic_server import FakeAnthropic
from tests.support import BIN, ROOT, WEEK, Deployment, wait_until

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip("no browser: install Debian's chromium (apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        try:
            yield launched
        finally:
            launched.close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def console(
    deployment: Deployment, port: int, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    log = (deployment.state_dir / "console.log").open("ab")
    process = subprocess.Popen(
        [str(BIN / "digest"), "console", "--port", str(port)],
        cwd=ROOT,
        env={**deployment.env, **(env or {})},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deployment.processes.append(process)

    def answers() -> bool:
        assert process.poll() is None, (deployment.state_dir / "console.log").read_text()
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", port)) == 0

    wait_until(answers, 20, "the console to listen")
    return process


def text_of(page: Any, url: str) -> str:
    page.goto(url)
    return str(page.locator("#timeline").inner_text())


def state_of(page: Any, url: str, wanted: str) -> bool:
    page.goto(url)
    return str(page.locator("#state").inner_text()) == wanted


def test_an_operator_steers_runs_from_the_console(
    deployment: Deployment, fake_anthropic: FakeAnthropic, browser: Any, tmp_path: Path
) -> None:
    shots = (
        ROOT / os.environ["DIGEST_SCREENSHOTS"] if "DIGEST_SCREENSHOTS" in os.environ else tmp_path
    )
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"):
        deployment.env.pop(name, None)
    cli = deployment.cli
    # An item belongs to one digest: the runs that wait or are sent side by side each get
    # a week of updates of their own.
    weeks = {}
    for tag in ("a", "b"):
        weeks[tag] = tmp_path / f"week-{tag}.json"
        weeks[tag].write_text(json.dumps([{**i, "id": tag + i["id"]} for i in WEEK]))
    assert cli("run", "2026-w40", "--approval").returncode == 0  # waits: approved below
    waits = cli("run", "2026-w41", "--approval", env={"DIGEST_ITEMS": str(weeks["a"])})
    assert waits.returncode == 0  # waits: rejected below
    assert cli("run", "2026-w42", env={"DIGEST_ITEMS": str(weeks["b"])}).returncode == 0
    worker_env = {**fake_anthropic.env(), "DIGEST_CONCURRENCY": "1"}
    deployment.worker("w1", concurrency=2, env=worker_env)
    deployment.beat()
    port = free_port()
    console(deployment, port, env=fake_anthropic.env())  # a fork's preview asks the model
    base = f"http://127.0.0.1:{port}"
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    shots.mkdir(exist_ok=True)

    # The runs page, newest first, each run a link.
    page.goto(base + "/")
    weeks = page.locator("#runs tbody tr td:first-child a").all_inner_texts()
    assert weeks == ["2026-w42", "2026-w41", "2026-w40"]
    assert "waiting for approval until" in page.locator("#runs").inner_text()

    # A page at a time: the older runs are a click away.
    page.goto(base + "/?limit=2")
    assert page.locator("#runs tbody tr td:first-child a").all_inner_texts() == weeks[:2]
    page.click("#older")
    assert page.locator("#runs tbody tr td:first-child a").all_inner_texts() == weeks[2:]
    assert page.locator("#older").count() == 0
    page.goto(base + "/")

    # Open a waiting run, read its draft, approve it: its email goes out.
    page.click("text=2026-w40")
    assert "Your weekly digest (2026-w40)" in page.locator("#approval pre").inner_text()
    page.screenshot(path=str(shots / "console-run-approval.png"), full_page=True)
    page.click("#approve")
    assert "approved digest:2026-w40" in page.locator(".flash.ok").inner_text()
    outbox = deployment.state_dir / "outbox"
    wait_until(lambda: (outbox / "digest-2026-w40.json").exists(), 30, "the approved email")
    wait_until(lambda: state_of(page, base + "/runs/2026-w40", "sent"), 30, "w40 done")
    steps = page.locator("#timeline .name.step").all_inner_texts()
    assert steps[0] == "select the week's items" and steps[-1] == "finish"
    assert page.locator("#timeline h3").count() == 2  # before the approval, and after
    page.screenshot(path=str(shots / "console-run.png"), full_page=True)

    # Reject another: it ends without sending.
    page.goto(base + "/runs/2026-w41")
    page.fill("#reason", "the intro is wrong")
    page.click("#reject")
    wait_until(lambda: state_of(page, base + "/runs/2026-w41", "rejected"), 30, "w41 done")
    assert deployment.view("2026-w41").step("send") is None
    assert not (outbox / "digest-2026-w41.json").exists()

    # Cancel a running one: held in its first model call, it stops before its next step.
    keys = DigestKeys(deployment.env["DIGEST_KEY_PREFIX"])
    deployment.client().delete(keys.seen, keys.claims)  # the shipped week, as if never sent
    fake_anthropic.hold()
    assert cli("enqueue", "2026-w43").returncode == 0
    fake_anthropic.wait_for_calls(1, timeout=30)
    # Its holder publishes the step it is in with its next lease renewal: the page shows it.
    wait_until(
        lambda: "summarize i1 (in flight now)" in text_of(page, base + "/runs/2026-w43"),
        10,
        "the model call in flight on the run's page",
    )
    assert "In flight now: summarize i1" in page.locator("#outcome").inner_text()
    page.screenshot(path=str(shots / "console-run-in-flight.png"), full_page=True)
    page.click("#cancel")
    assert "cancelling digest:2026-w43" in page.locator(".flash.ok").inner_text()
    fake_anthropic.release()
    wait_until(lambda: state_of(page, base + "/runs/2026-w43", "cancelled"), 30, "w43 cancelled")
    assert [r.key for r in deployment.view("2026-w43").steps] == ["select", "summarize:i1"]
    assert fake_anthropic.calls == 1

    # Fork a finished one from its compose step: a new run, its own email. Its preview asks
    # the fake model for the opening the CLI wrote offline, and says what that call costs.
    page.goto(base + "/runs/2026-w42")
    page.select_option("#fork-step", "compose")
    page.click("#fork-preview")
    assert "run again from “compose the introduction”" in page.locator("h1").inner_text()
    cost = page.locator("#fork-cost").inner_text()
    assert re.fullmatch(r"1 model call, costing \$0\.\d{4}", cost) and not cost.endswith("0000")
    assert fake_anthropic.calls == 2  # the preview's own call, charged to nothing
    diff = page.locator("#diff").inner_text().splitlines()
    previewed = [line[1:] for line in diff if line.startswith("+") and line[:3] != "+++"]
    assert previewed[0].startswith("opening for Dark mode"), diff
    page.screenshot(path=str(shots / "console-fork.png"), full_page=True)
    page.click("#fork-confirm")
    assert (
        "forked digest:2026-w42 at compose as digest:2026-w42-fork1"
        in page.locator(".flash.ok").inner_text()
    )
    assert page.url.endswith("/runs/2026-w42-fork1")
    wait_until(lambda: state_of(page, base + "/runs/2026-w42-fork1", "sent"), 30, "the fork done")
    sent = json.loads((outbox / "digest-2026-w42-fork1.json").read_text())
    assert all(line in sent["body"] for line in previewed)  # what went out is what was shown
    assert fake_anthropic.calls == 3  # the fork's own call
    composed = deployment.view("2026-w42-fork1").step("compose")
    assert composed is not None and cost.endswith(dollars(composed.result["cost_usd"]))
    assert "from digest:2026-w42 at compose" in page.inner_text("dl")

    # Readable on a phone: the runs page at a phone's width keeps week, status and cost.
    phone = browser.new_page(viewport={"width": 390, "height": 844})
    phone.goto(base + "/")
    assert phone.locator("#runs th.wide").first.is_hidden()
    assert shutil.which("chromium") or CHROMIUM.exists()
