"""The fallback chain on a real worker whose pool child is SIGKILLed in the middle of the map.

The primary model answers 529 to every call, so each summary moves to the fallback after its
five attempts. The child is killed while the fourth item's first call is open; the message
comes back, and the resumed run replays what the fallback answered: the fake API, counting
calls per item and per model, shows the primary was never asked again for those items.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.failure.conftest import (
    ITEMS,
    RUN,
    WEEK,
    enqueue,
    recorded,
    wait_for_status,
)
from tests.fakes.anthropic_server import FakeAnthropic
from tests.support import TITLES, Deployment, wait_until

pytestmark = pytest.mark.slow

PRIMARY = "claude-haiku-5-5"
FALLBACK = "claude-sonnet-5-5"
ATTEMPTS = 5  # a step's attempts on one model before the next is asked
BEFORE_KILL = 3  # items the fallback answered before the kill
CALL_TIME = 0.3  # each call stays open this long before the kill, so hold() finds it open


def asked(fake: FakeAnthropic, title: str) -> dict[str, int]:
    """The calls for one item's summary, per model (the opening's prompt lists every title)."""
    counts: dict[str, int] = {}
    for request in fake.requests:
        if request.text.startswith(f'<update title="{title}">'):
            counts[request.model] = counts.get(request.model, 0) + 1
    return counts


def test_a_killed_child_resumes_without_asking_the_primary_for_what_the_fallback_answered(
    live: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    live.env.update(
        DIGEST_SUMMARY_MODEL=f"{PRIMARY},{FALLBACK}",
        DIGEST_INTRO_MODEL=f"{PRIMARY},{FALLBACK}",
        DIGEST_CONCURRENCY="1",  # one call in flight: the counts below are exact
        DIGEST_LEASE_TTL="30",  # the dead child is provably gone: its lease costs nothing
    )
    fake_anthropic.fail_always(529, model=PRIMARY)
    fake_anthropic.delay = CALL_TIME
    worker = live.worker("a", concurrency=1)

    enqueue(live)
    # Three items each asked the primary five times and the fallback once; the fourth item's
    # first call (to the primary) is open.
    fake_anthropic.wait_for_calls(BEFORE_KILL * (ATTEMPTS + 1) + 1, timeout=60)
    fake_anthropic.hold()
    wait_until(lambda: recorded(live) == BEFORE_KILL, 10, f"{BEFORE_KILL} summaries recorded")
    assert fake_anthropic.calls == BEFORE_KILL * (ATTEMPTS + 1) + 1, "a call escaped hold()"
    [child] = worker.children()
    os.kill(child, signal.SIGKILL)
    killed = time.monotonic()
    fake_anthropic.delay = 0
    fake_anthropic.release()
    wait_for_status(live, "done", 60)

    answered = {title: asked(fake_anthropic, title) for title in TITLES}
    for title in TITLES[:BEFORE_KILL]:  # answered before the kill: replayed, never asked again
        assert answered[title] == {PRIMARY: ATTEMPTS, FALLBACK: 1}, title
    # The fourth: its open call lost with the child; the new delivery's chain starts afresh.
    assert answered[TITLES[BEFORE_KILL]] == {PRIMARY: ATTEMPTS + 1, FALLBACK: 1}
    for title in TITLES[BEFORE_KILL + 1 :]:
        assert answered[title] == {PRIMARY: ATTEMPTS, FALLBACK: 1}, title
    assert fake_anthropic.calls_per_model() == {
        PRIMARY: (ITEMS + 1) * ATTEMPTS + 1,  # the opening walks the chain too
        FALLBACK: ITEMS + 1,
    }
    view = live.view(RUN)
    models = {s.key: s.result["model"] for s in view.steps if s.key.startswith("summarize:")}
    assert models == {f"summarize:{item['id']}": FALLBACK for item in WEEK}
    compose = view.step("compose")
    assert compose is not None and compose.result["model"] == FALLBACK
    fences = {s.key: s.fence for s in view.steps if s.key.startswith("summarize:")}
    assert sorted(fences.values()) == [1] * BEFORE_KILL + [2] * (ITEMS - BEFORE_KILL)
    assert len(live.outbox()) == 1
    assert "WorkerLostError" in worker.text()
    cost = sum(
        float(s.result.get("cost_usd") or 0)
        for s in view.steps
        if s.key != "send" and isinstance(s.result, dict)
    )
    print(
        f"primary down: {fake_anthropic.calls_per_model()}, ${cost:.6f}, "
        f"done {time.monotonic() - killed:.1f}s after the kill"
    )
