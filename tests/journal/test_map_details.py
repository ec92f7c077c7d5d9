"""``Run.map`` beyond its results: the default width, its threads, its refusals, retries, drift.

And what happens to the items still running when the map is left behind (an ``on_step`` hook
that raises while an earlier item replays): they end, none blocked for good on a report that
will not come. Found by mutation testing (docs/mutation.md): no test looked at any of these.
"""

from __future__ import annotations

import threading

import pytest

from journal import Journal, ManualClock, RetryPolicy, Run, StepEvent
from journal.errors import ReplayMismatch
from tests.conftest import MakeJournal
from tests.support import execute, wait_until


def rerun(journal: Journal) -> None:
    """Make the next ``execute`` run the body again, replaying what it recorded."""
    journal.client.hdel(journal.keys("wf", "r1").meta, "status")


def test_a_map_runs_three_items_at_a_time_by_default_on_threads_named_after_it(
    make_journal: MakeJournal,
) -> None:
    journal = make_journal(clock=ManualClock())
    changed = threading.Condition()
    running: list[str] = []
    peak: list[int] = []
    names: set[str] = set()

    def item(name: str) -> str:
        with changed:
            running.append(name)
            peak.append(len(running))
            names.add(threading.current_thread().name.split("_")[0])
            changed.notify_all()
            changed.wait_for(lambda: len(running) >= 4, timeout=0.15)  # never, at width 3
            running.remove(name)
        return name

    outcome = execute(journal, "wf", "r1", lambda run: run.map("week", list("abcd"), item, key=str))
    assert outcome.result == list("abcd")
    assert max(peak) == 3
    assert names == {"week"}


@pytest.mark.parametrize(
    ("items", "concurrency", "says"),
    [
        (["a", "a"], 3, "map 'm': item keys are not unique"),
        (["a"], 0, "concurrency must be at least 1"),
    ],
    ids=["duplicate-keys", "no-width"],
)
def test_a_map_refuses_duplicate_keys_and_a_width_below_one_saying_which(
    make_journal: MakeJournal, items: list[str], concurrency: int, says: str
) -> None:
    journal = make_journal()
    with pytest.raises(ValueError) as caught:
        execute(
            journal,
            "wf",
            "r1",
            lambda run: run.map("m", items, str, key=str, concurrency=concurrency),
        )
    assert str(caught.value) == says


def test_a_map_of_new_items_after_unreplayed_steps_names_its_first_item_as_the_drift(
    make_journal: MakeJournal,
) -> None:
    journal = make_journal()
    execute(journal, "wf", "r1", lambda run: run.step("old", lambda: 1))
    rerun(journal)
    with pytest.raises(ReplayMismatch) as caught:
        execute(journal, "wf", "r1", lambda run: run.map("m", ["a", "b"], str, key=str))
    assert (caught.value.recorded, caught.value.requested, caught.value.position) == (
        "old",
        "m:a",
        1,
    )


def test_a_map_item_retries_under_the_maps_policy(make_journal: MakeJournal) -> None:
    clock = ManualClock()
    journal = make_journal(clock=clock)
    failures = {"b": 2}

    def item(name: str) -> str:
        if failures.get(name):
            failures[name] -= 1
            raise ConnectionResetError("blip")
        return name.upper()

    policy = RetryPolicy(base_delay=0.5, retryable=lambda e: isinstance(e, ConnectionResetError))
    events: list[StepEvent] = []
    outcome = execute(
        journal,
        "wf",
        "r1",
        lambda run: run.map("m", ["a", "b"], item, key=str, retry=policy),
        on_step=events.append,
    )
    assert outcome.result == ["A", "B"]
    assert events == [StepEvent("m:a", False, "step", 1), StepEvent("m:b", False, "step", 3)]
    assert len(clock.slept) == 2
    rerun(journal)
    events.clear()
    execute(
        journal,
        "wf",
        "r1",
        lambda run: run.map("m", ["a", "b"], item, key=str),
        on_step=events.append,
    )
    assert events == [StepEvent("m:a", True, "step", 1), StepEvent("m:b", True, "step", 3)]


def test_no_item_thread_is_left_behind_when_a_report_fails(
    make_journal: MakeJournal,
) -> None:
    journal = make_journal()
    execute(journal, "wf", "r1", lambda run: run.step("left:a", lambda: "A"))
    rerun(journal)
    # Journal so far: left:a recorded, left:b not. Replaying left:a reports to a hook that fails.

    def hook(event: StepEvent) -> None:
        if event.replayed:
            raise RuntimeError("the dashboard is down")

    def body(run: Run) -> list[str]:
        return run.map("left", ["a", "b"], str.upper, key=str)

    with pytest.raises(RuntimeError, match="the dashboard is down"):
        execute(journal, "wf", "r1", body, on_step=hook)

    def no_item_thread_left() -> bool:
        return not any(t.name.startswith("left_") for t in threading.enumerate())

    wait_until(no_item_thread_left, 5, "the item still running to end")
