"""A workflow defined without Celery (``journal._workflow``): run here, options checked and frozen.

The Celery side of the same object is in ``test_durable.py``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from journal import Journal, Run, StepEvent
from journal._workflow import Workflow, workflow
from journal.errors import InvalidArguments, InvalidRunId
from tests.support import ROOT


@dataclass(frozen=True)
class Greeting:
    to: str = "world"
    loud: bool = False


def test_typed_options_run_here_are_frozen_as_given_and_replayed(
    make_journal: Callable[..., Journal],
) -> None:
    journal = make_journal()
    seen: list[Greeting] = []

    @workflow("greet", options=Greeting, journal=lambda: journal)
    def greet(run: Run, options: Greeting) -> str:
        seen.append(options)
        text = run.step("text", lambda: f"hello {options.to}")
        return text.upper() if options.loud else text

    first = greet.start("r1", Greeting(to="ada", loud=True))
    assert (first.status, first.result, first.ran) == ("done", "HELLO ADA", 1)
    # Only the fields given: a field left at its default is neither sent nor frozen.
    assert journal.meta(journal.keys("greet", "r1"))["args"] == '{"to":"ada","loud":true}'
    assert greet.encode(Greeting()) == {}

    again = greet.start("r1", Greeting(to="someone else"))  # a started run keeps its own
    assert (again.status, again.result) == ("already-done", "HELLO ADA")
    assert seen == [Greeting(to="ada", loud=True)]


def test_defaults_fill_what_was_left_out_and_the_caller_wins(
    make_journal: Callable[..., Journal],
) -> None:
    journal = make_journal()

    # Given the run id, as a default derived from it (a week's deadline) would be.
    @workflow(
        "greet",
        options=Greeting,
        journal=lambda: journal,
        defaults=lambda run_id: {"to": f"env-{run_id}"},
    )
    def greet(run: Run, options: Greeting) -> str:
        return run.step("text", lambda: f"hello {options.to}")

    assert greet.start("r1").result == "hello env-r1"
    assert greet.start("r2", Greeting(to="ada")).result == "hello ada"
    assert journal.meta(journal.keys("greet", "r1"))["args"] == '{"to":"env-r1"}'


def test_bad_options_and_run_ids_are_refused_before_anything_is_written(
    make_journal: Callable[..., Journal],
) -> None:
    journal = make_journal()
    calls: list[str] = []

    @workflow("greet", options=Greeting, journal=lambda: journal)
    def greet(run: Run, options: Greeting) -> str:
        calls.append(run.run_id)
        return "hi"

    with pytest.raises(InvalidArguments) as refused:
        greet.check("r1", {"loud": "yes"})
    assert str(refused.value) == (
        "run greet:r1: invalid arguments: loud='yes' is not bool; nothing was started; "
        "the workflow takes to, loud"
    )
    with pytest.raises(InvalidArguments, match="unexpected keyword argument 'volume'"):
        greet._start("r1", {"volume": 11})  # a delivery's options, as they travel
    with pytest.raises(InvalidRunId):
        greet.start("no such/run")
    assert calls == []
    assert journal.client.keys(f"{journal.keyspace.prefix}:*") == []


def test_frozen_options_the_code_no_longer_takes_fail_the_run_by_name(
    make_journal: Callable[..., Journal],
) -> None:
    journal = make_journal()

    def older(run: Run, **options: Any) -> str:
        raise RuntimeError("stopped half-way")

    # An older version of the workflow took a `colour` and froze it; the run then failed.
    before: Workflow[dict[str, Any], str] = Workflow("greet", older, journal=lambda: journal)
    with pytest.raises(RuntimeError):
        before.start("r1", {"colour": "red"})

    @workflow("greet", options=Greeting, journal=lambda: journal)
    def greet(run: Run, options: Greeting) -> str:
        return "hi"

    with pytest.raises(InvalidArguments, match="unexpected keyword argument 'colour'"):
        greet.start("r1")
    meta = journal.meta(journal.keys("greet", "r1"))
    assert meta["status"] == "failed"
    assert "colour" in meta["last_error"]


def test_keyword_options_and_observers_compose(make_journal: Callable[..., Journal]) -> None:
    journal = make_journal()
    order: list[str] = []

    def own(event: StepEvent) -> None:
        order.append(f"own {event.key}")

    @workflow("kw", journal=lambda: journal, on_step=own)
    def kw(run: Run, *, name: str = "x") -> str:
        return run.step("a", lambda: name)

    outcome = kw.start("r1", {"name": "y"}, on_step=lambda e: order.append(f"caller {e.key}"))
    assert outcome.result == "y"
    assert order == ["caller a", "own a"]  # the caller prints first, then the workflow's hook
    with pytest.raises(InvalidArguments, match="name=3 is not str"):
        kw.start("r2", {"name": 3})


@pytest.mark.slow
def test_defining_and_running_a_workflow_imports_no_celery() -> None:
    # What lets `digest run` start without paying for Celery's import.
    probe = (
        "import sys, journal, tasks.ops.cli, tasks.job.workflow; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('celery', 'kombu')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr
