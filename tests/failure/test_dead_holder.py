"""A holder that provably died on this host is not waited for; a stopped one is.

With the default 30 s lease: the tutorial's walk-through (crash, run again at once, resume),
a zombie process (killed, not yet reaped) and a stopped one (SIGSTOP: alive, only paused).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from tests.failure.conftest import JOURNAL, RUN, fences
from tests.fakes.anthropic_server import FakeAnthropic
from tests.fakes.gated import GatedFake
from tests.support import BIN, ROOT, Deployment, wait_until

pytestmark = pytest.mark.slow

CRASHED_AFTER = JOURNAL.index("summarize:i3") + 1  # select and three summaries


def steps(stdout: str) -> list[str]:
    return [" ".join(line.split()) for line in stdout.splitlines() if line.startswith("  ")]


def test_crash_then_an_immediate_rerun_resumes_with_the_default_lease(
    deployment: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    deployment.env.update(fake_anthropic.env(), DIGEST_CONCURRENCY="1")
    del deployment.env["DIGEST_LEASE_TTL"]
    assert deployment.config.lease_ttl == 30.0

    crashed = deployment.cli("run", RUN, env={"CRASH": "after:summarize:i3"})
    assert crashed.returncode == 137, crashed.stderr
    started = time.monotonic()
    resumed = deployment.cli("run", RUN)
    took = time.monotonic() - started

    assert resumed.returncode == 0, resumed.stderr
    assert steps(resumed.stdout) == [f"replayed {key}" for key in JOURNAL[:CRASHED_AFTER]] + [
        f"ran {key}" for key in JOURNAL[CRASHED_AFTER:]
    ]
    assert resumed.stdout.splitlines()[-1] == (
        f"sent: 8 items, 6 model calls in this attempt, email sent (digest-{RUN})"
    )
    assert fake_anthropic.calls == 9
    assert len(deployment.outbox()) == 1
    assert set(fences(deployment).values()) == {1, 2}
    assert took < 10, took  # the whole resumed run, process start included; not the 30 s lease
    print(f"crash, then rerun at once: resumed and done in {took:.1f}s (lease 30 s)")


def test_a_stopped_holder_keeps_its_lease_and_a_killed_one_is_taken_over_unreaped(
    deployment: Deployment, gated_fake: GatedFake
) -> None:
    deployment.env.update(gated_fake.env(), DIGEST_CONCURRENCY="1")
    del deployment.env["DIGEST_LEASE_TTL"]
    held = gated_fake.gate(4)  # the first holder's call for i4 stays open
    first = subprocess.Popen(
        [str(BIN / "digest"), "run", RUN],
        cwd=ROOT,
        env=deployment.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        gated_fake.wait_for_calls(4, timeout=30)
        os.kill(first.pid, signal.SIGSTOP)

        busy = deployment.cli("run", RUN)
        assert busy.returncode == 3, busy.stdout + busy.stderr
        assert "is leased by another worker (fence 1)" in busy.stderr

        os.kill(first.pid, signal.SIGKILL)  # not waited for: a zombie until reaped
        wait_until(lambda: _state(first.pid) == "Z", 5, "the killed holder to be a zombie")
        resumed = deployment.cli("run", RUN)
    finally:
        held.set()
        if first.poll() is None:
            first.kill()
        first.wait()

    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.splitlines()[-1].startswith("sent: 8 items")
    assert len(deployment.outbox()) == 1
    assert set(fences(deployment).values()) == {1, 2}


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as stat:
        raw = stat.read()
    return raw[raw.rfind(b")") + 2 :].split()[0].decode()
