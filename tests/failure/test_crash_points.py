"""A crash at every point of the digest, then a resume: one email, nine model calls, no gaps.

Each point is a real process exit (``CRASH=<point>`` makes the ``digest run`` process call
``os._exit(137)`` there, leaving its lease behind), followed by a second ``digest run`` that
must replay what was recorded, run the rest, and end with exactly one delivered email, the
week's items in the seen set and exactly nine model calls at the fake API: with one summary in
flight at a time and every crash after a record (or, for ``before-save:send``, after a step
that makes no model call), no call is ever lost in flight and none is made twice.

The command line is started by ``ForkedCli``: a Python process that imports the CLI once and
forks a child per invocation. Each child runs ``tasks.ops.cli.entry``, the ``digest`` script, in
its own process with its own environment, exit status and output files, but without paying
the 1.5 s import of the SDK again: three invocations per point cost about a second, not six.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest

from tasks.keys import text
from tests.fakes.anthropic_server import FakeAnthropic
from tests.forked_cli import ForkedCli
from tests.support import JOURNAL, TITLES, WEEK, Deployment, item_ordered, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def forked_cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForkedCli]:
    cli = ForkedCli(tmp_path_factory.mktemp("cli"))
    yield cli
    cli.close()


ITEMS = [item["id"] for item in WEEK]
MODEL_STEPS = {f"summarize:{item}" for item in ITEMS} | {"compose"}
POINTS = [
    "after:select",
    *(f"after:summarize:{item}" for item in ITEMS),
    "after:compose",
    "before-save:send",
    "after:send",
    "after:mark-seen",
]


def ran_before_crash(point: str) -> list[str]:
    """The steps the crashed attempt ran (in order) before it died at ``point``."""
    if point == "before-save:send":
        return JOURNAL[: JOURNAL.index("send")]  # the email left, its record never happened
    return JOURNAL[: JOURNAL.index(point.removeprefix("after:")) + 1]


def recorded_before_resume(point: str) -> list[str]:
    """What of it the journal holds: some records wait for the run's next write.

    ``mark-seen`` is a set union, safe to repeat, and the send's receipt stands in the store:
    a crash right after either finds it unrecorded, and the resume runs it again (the send
    answering from its receipt, sending nothing).
    """
    ran = ran_before_crash(point)
    return ran[: ran.index("send")] if "send" in ran else ran


def step_lines(stdout: str) -> list[tuple[str, str]]:
    """(``ran`` | ``replayed``, step key) for every step line the CLI printed."""
    lines = []
    for line in stdout.splitlines():
        words = line.split()
        if len(words) == 2 and words[0] in ("ran", "replayed"):
            lines.append((words[0], words[1]))
    return lines


def seen_items(deployment: Deployment) -> set[str]:
    runtime = deployment.runtime()
    return {text(member) for member in runtime.client.smembers(runtime.keys.seen)}


def lease_gone(deployment: Deployment, run_id: str) -> bool:
    keys = deployment.runtime().journal.keys("digest", run_id)
    return not deployment.client().exists(keys.lease)


@pytest.mark.parametrize("point", POINTS)
def test_crash_then_resume(
    point: str, deployment: Deployment, forked_cli: ForkedCli, fake_anthropic: FakeAnthropic
) -> None:
    deployment.env.update(fake_anthropic.env(), DIGEST_CONCURRENCY="1", DIGEST_LEASE_TTL="1")
    run_id = "2026-w42"
    recorded = recorded_before_resume(point)
    calls_before = len(MODEL_STEPS.intersection(recorded))
    emailed_before = point in ("before-save:send", "after:send", "after:mark-seen")

    crashed = forked_cli.run({**deployment.env, "CRASH": point}, "run", run_id)

    assert crashed.returncode == 137, crashed.stdout + crashed.stderr
    assert crashed.stdout.splitlines()[-1] == f"  ** simulated crash at {point} **"
    assert step_lines(crashed.stdout) == [("ran", key) for key in ran_before_crash(point)]
    assert crashed.stderr == ""
    assert fake_anthropic.calls == calls_before
    assert len(deployment.outbox()) == int(emailed_before)
    view = deployment.view(run_id)
    assert [record.key for record in view.steps] == recorded
    assert view.status == "running"
    assert seen_items(deployment) == (set(ITEMS) if point == "after:mark-seen" else set())

    wait_until(lambda: lease_gone(deployment, run_id), 5, "the crashed run's lease to expire")
    resumed = forked_cli.run(deployment.env, "run", run_id)

    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert step_lines(resumed.stdout) == [
        ("replayed" if key in recorded else "ran", key) for key in JOURNAL
    ]
    state = "already sent earlier, not resent" if emailed_before else "sent"
    assert resumed.stdout.splitlines()[-1] == (
        f"sent: 8 items, {9 - calls_before} model calls in this attempt, "
        f"email {state} (digest-{run_id})"
    )
    assert resumed.stderr == ""
    assert fake_anthropic.calls == 9
    # Each title is in its own summary's prompt and in the opening's: called once each.
    assert Counter(fake_anthropic.models) == {"claude-haiku-5-5": 8, "claude-sonnet-5-5": 1}
    assert [fake_anthropic.calls_for(title) for title in TITLES] == [2] * 8
    assert [path.name for path in deployment.outbox()] == [f"digest-{run_id}.json"]
    assert seen_items(deployment) == set(ITEMS)
    view = deployment.view(run_id)
    assert view.status == "done"
    assert item_ordered(view.steps) == JOURNAL
    assert [(r.key, r.fence, r.attempt) for r in view.steps] == [
        (key, 1 if key in recorded else 2, 1) for key in JOURNAL
    ]
    assert view.meta["starts"] == "2"

    again = forked_cli.run(deployment.env, "run", run_id)

    assert (again.returncode, again.stdout, again.stderr) == (
        0,
        f"already-done: ended earlier (sent: 8 items, email {state} (digest-{run_id})); "
        "nothing ran in this attempt\n",
        "",
    )
    assert fake_anthropic.calls == 9
    assert len(deployment.outbox()) == 1
