"""The slow call in the middle of the map: answers paid for after it survive any crash.

At the default concurrency (three calls at once), the third item's call is held open at the
fake API while every other item is answered. Each answer must be in the journal as soon as it
is paid for, not held in memory until the third is recorded; then the process running the run
is hit: a Celery pool child SIGKILLed, a worker frozen with SIGSTOP past its lease, a
``digest run`` killed. What the resumed run may pay again is only the call in flight at the
fault: items + 1 + 1 = 10 model calls, the third item asked twice, one email.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from tests.failure.conftest import CALLS, RUN, intro_calls, summary_calls, wait_for_status
from tests.fakes.gated import GatedFake
from tests.support import BIN, JOURNAL, ROOT, TITLES, Deployment, as_text, wait_until

pytestmark = pytest.mark.slow

SLOW = 2  # the third item, i3: its first call is held
ANSWERED = [f"summarize:i{n}" for n in range(1, 9) if n != SLOW + 1]


def hold_the_third_item(deployment: Deployment, fake: GatedFake) -> None:
    """Default concurrency; returns once every answer but the held third one is recorded.

    The first thing the old code broke: items 4 and 5, answered while 3 hangs, waited in
    memory for their turn, so they were lost with the process.
    """
    assert "DIGEST_CONCURRENCY" not in deployment.env
    assert deployment.config.concurrency == 3
    fake.wait_for_calls(5, timeout=30)  # i1..i5 at least: i3 is held, 4 and 5 answered
    wait_until(
        lambda: fake.calls_for(f'<update title="{TITLES[4]}">') == 1,
        10,
        "the fifth item's call to arrive while the third is held",
    )
    keys = deployment.runtime().journal.keys("digest", RUN)
    client = deployment.client()

    def recorded() -> set[str]:
        return {as_text(key) for key in client.hkeys(keys.steps)}

    wait_until(
        lambda: {"summarize:i4", "summarize:i5"} <= recorded(),
        10,
        "the answers of items 4 and 5 to be recorded while item 3's call is held",
    )
    wait_until(lambda: set(ANSWERED) <= recorded(), 10, "every answered item to be recorded")
    assert "summarize:i3" not in recorded()


def assert_only_the_call_in_flight_repeated(deployment: Deployment, fake: GatedFake) -> None:
    assert fake.calls == CALLS + 1  # items + 1 + the one in flight at the fault
    assert summary_calls(fake) == [1, 1, 2, 1, 1, 1, 1, 1]
    assert intro_calls(fake) == 1
    assert [path.name for path in deployment.outbox()] == [f"digest-{RUN}.json"]
    view = deployment.view(RUN)
    assert sorted(step.key for step in view.steps) == sorted(JOURNAL)
    fences = {step.key: step.fence for step in view.steps}
    assert {fences[key] for key in ["select", *ANSWERED]} == {1}  # replayed, never asked again
    assert fences["summarize:i3"] == 2


def test_a_pool_child_killed_while_the_middle_call_hangs(
    deployment: Deployment, gated_fake: GatedFake
) -> None:
    deployment.env.update(gated_fake.env(), DIGEST_LEASE_TTL="30")
    held = gated_fake.gate_first(f'<update title="{TITLES[SLOW]}">')
    worker = deployment.worker("a", concurrency=1)
    assert deployment.cli("enqueue", RUN).returncode == 0
    hold_the_third_item(deployment, gated_fake)
    [child] = worker.children()
    os.kill(child, signal.SIGKILL)
    killed = time.monotonic()
    held.set()  # answered to nobody: the child is gone
    wait_for_status(deployment, "done", 30)
    took = time.monotonic() - killed

    assert_only_the_call_in_flight_repeated(deployment, gated_fake)
    print(f"pool child SIGKILL, i3 held: done {took:.1f}s after, {gated_fake.calls} calls")


def test_a_worker_frozen_past_its_lease_while_the_middle_call_hangs(
    deployment: Deployment, gated_fake: GatedFake
) -> None:
    deployment.env.update(gated_fake.env())  # lease TTL 2 s
    held = gated_fake.gate_first(f'<update title="{TITLES[SLOW]}">')
    frozen_worker = deployment.worker("a", concurrency=1)
    assert deployment.cli("enqueue", RUN).returncode == 0
    hold_the_third_item(deployment, gated_fake)
    [frozen] = frozen_worker.children()
    os.kill(frozen, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        deployment.worker("b", concurrency=1)
        assert deployment.cli("enqueue", RUN).returncode == 0  # A's only slot is taken
        wait_for_status(deployment, "done", 30)
        took = time.monotonic() - stopped
    finally:
        os.kill(frozen, signal.SIGCONT)
    held.set()  # the zombie's late answer: its record is refused
    wait_until(
        lambda: "'status': 'lease-lost'" in frozen_worker.text(), 20, "the zombie to give up"
    )

    assert_only_the_call_in_flight_repeated(deployment, gated_fake)
    print(f"worker frozen, i3 held: done {took:.1f}s after, {gated_fake.calls} calls")


def test_a_digest_run_killed_while_the_middle_call_hangs(
    deployment: Deployment, gated_fake: GatedFake
) -> None:
    deployment.env.update(gated_fake.env())
    del deployment.env["DIGEST_LEASE_TTL"]  # the default 30 s: a dead holder is not waited for
    held = gated_fake.gate_first(f'<update title="{TITLES[SLOW]}">')
    first = subprocess.Popen(
        [str(BIN / "digest"), "run", RUN],
        cwd=ROOT,
        env=deployment.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        hold_the_third_item(deployment, gated_fake)
    finally:
        first.kill()
        first.wait(timeout=10)
    held.set()
    started = time.monotonic()
    resumed = deployment.cli("run", RUN)
    took = time.monotonic() - started

    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert resumed.stdout.splitlines()[-1] == (
        f"sent: 8 items, 2 model calls in this attempt, email sent (digest-{RUN})"
    )
    assert_only_the_call_in_flight_repeated(deployment, gated_fake)
    print(f"digest run killed, i3 held: resumed and done in {took:.1f}s, {gated_fake.calls} calls")
