"""A failed run keeps its items, and no later week is silently quiet about them.

Week 46 fails for good reason (the API key is refused) after selecting, and so claims the
week's eight items; a failed run may still be retried, so it keeps them. Week 47 then finds
nothing of its own: its report names what is held, by whom and why, and the two ways out.
`digest runs` and `digest show` flag the holder; `digest release` hands the items on: the
failed run is ended for good (no retry can send them any more) and week 48 sends all eight.
"""

from __future__ import annotations

import json

import pytest

from tests.fakes.anthropic_server import FakeAnthropic
from tests.support import TITLES, Deployment

pytestmark = pytest.mark.slow

HELD = (
    "nothing-new: 0 new items, 0 model calls in this attempt; 8 are held by digest:2026-w46 "
    "(failed: {error}); digest retry 2026-w46 sends them, digest release 2026-w46 hands them "
    "to the next week"
)


def claims(deployment: Deployment) -> dict[bytes, bytes]:
    key = f"{deployment.env['DIGEST_KEY_PREFIX']}:digest:claims"
    return deployment.client().hgetall(key)  # type: ignore[return-value]


def test_a_failed_weeks_items_are_named_in_the_next_report_and_released_on_demand(
    deployment: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    deployment.env.update(fake_anthropic.env(), DIGEST_CONCURRENCY="1")
    fake_anthropic.fail_always(401)
    failed = deployment.cli("run", "2026-w46")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert set(claims(deployment).values()) == {b"digest:2026-w46"}
    fake_anthropic.clear_faults()
    error = deployment.view("2026-w46").meta["last_error"]

    quiet = deployment.cli("run", "2026-w47")
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout.splitlines()[-1] == HELD.format(error=error)

    listed = deployment.cli("runs").stdout.splitlines()
    [w46] = [line for line in listed if line.startswith("digest:2026-w46 ")]
    assert w46.endswith("holds 8 items")
    [w47] = [line for line in listed if line.startswith("digest:2026-w47 ")]
    assert "holds" not in w47
    assert "holds    8 items: digest retry sends them, digest release hands them on" in (
        deployment.cli("show", "2026-w46").stdout
    )

    done = deployment.cli("release", "2026-w47")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "digest: digest:2026-w47 holds no items; nothing was released: release a failed run "
        "`digest runs` shows holding items\n"
    )
    released = deployment.cli("release", "2026-w46")
    assert released.returncode == 0, released.stderr
    assert released.stdout == (
        "released 8 items of digest:2026-w46: it is cancelled and will send nothing; "
        "the next run takes them\n"
    )
    assert claims(deployment) == {}
    retried = deployment.cli("retry", "2026-w46")
    assert retried.returncode == 2

    following = deployment.cli("run", "2026-w48")
    assert following.stdout.splitlines()[-1].startswith("sent: 8 items"), following.stdout
    [path] = deployment.outbox()
    body = json.loads(path.read_text())["body"]
    assert all(body.count(f"* {title}:") == 1 for title in TITLES)
    assert "holds" not in deployment.cli("runs").stdout
