"""Real runs as tests: replay a workflow in this process against a recorded run.

``replay(workflow, fixture)`` runs the workflow's body as the code defines it now, against a
run exported with ``journal.testing.fixture.export`` (the ``digest export`` command), with no Redis,
no broker and no lease (the rehearsal ``Recording.replay`` also drives):

- every step the fixture holds returns its recorded result, its function never called: a
  model step makes no model call;
- a step the fixture lacks raises ``StepNotInFixture``, naming its key and the nearest
  recorded keys (a renamed step is found at once), unless the test lets it run live;
- ``live`` steps run for real even when the fixture holds them (an eval of a changed prompt),
  in memory: drift is not checked at them, and what they return is kept for the rest of the
  replay only;
- effects never run: a recorded effect returns its receipt; one the fixture lacks raises.

For pytest, ``journal.testing.pytest_plugin`` reads the fixture a test names with a marker.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, NoReturn

from journal._clock import Clock, SystemClock
from journal._run import StepEvent
from journal._schema import codec
from journal._workflow import Workflow
from journal.errors import StepNotInFixture
from journal.testing._recording import Recording
from journal.testing._rehearsal import Frontier, Rehearsal, RunOn, StopAtFrontier, rehearse
from journal.testing.fixture import Fixture

__all__ = [
    "Fixture",
    "Frontier",
    "Live",
    "Recording",
    "Rehearsal",
    "RunOn",
    "StopAtFrontier",
    "replay",
]

Live = Collection[str] | Callable[[str], bool]


def replay(
    workflow: Workflow[Any, Any],
    fixture: Fixture | str | Path,
    *,
    live: Live = (),
    clock: Clock | None = None,
    on_step: Callable[[StepEvent], None] | None = None,
) -> Rehearsal:
    """Run ``workflow`` in this process against a recorded run (see the module).

    Args:
        workflow: the workflow as the code defines it now. Its name need not be the
            fixture's: a dry-run variant of a workflow replays that workflow's runs.
        fixture: a ``Fixture``, or the path of one.
        live: the steps that run for real: keys (``{"compose"}``), map prefixes
            (``{"summarize"}`` lets every ``summarize:<id>`` run), or a predicate on the key.
        clock: the clock of sleeps, signal deadlines and ``now`` (the system's by default).
        on_step: told of every step, replayed or run live.

    Returns:
        How the replay ended: the body's result, or the wait it stopped at; the keys
        replayed, run live, and recorded but never asked for.

    Raises:
        StepNotInFixture: a step or an effect the fixture lacks, not allowed live.
        ReplayMismatch: the code asks for a new step while recorded ones wait: drift.
        BadFixture: ``fixture`` is a path to something that is not a fixture.
    """
    recording = fixture if isinstance(fixture, Fixture) else Fixture.read(fixture)
    policy = _FixturePolicy(recording, live)
    return rehearse(
        workflow,
        recording.run_id,
        recording.args,
        {key: raw for key, raw in recording.recorded().items() if not policy.exempt(key)},
        signals={name: codec.dumps(payload) for name, payload in recording.signals.items()},
        policy=policy,
        clock=clock if clock is not None else SystemClock(),
        on_step=on_step,
    )


class _FixturePolicy:
    """Live steps run; any other step or effect the fixture lacks is refused by name."""

    def __init__(self, fixture: Fixture, live: Live) -> None:
        self._run = fixture.run
        self._keys = [record.key for record in fixture.steps]
        # One key given bare would otherwise match its every substring: "compose" lets "c" in.
        self._live = {live} if isinstance(live, str) else live

    def exempt(self, key: str) -> bool:
        """Whether ``key`` runs live: named, its map prefix named, or the predicate says so."""
        if callable(self._live):
            return bool(self._live(key))
        return key in self._live or key.split(":", 1)[0] in self._live

    def admit(self, key: str, kind: str) -> None:
        """Let a live step run; refuse any other."""
        if not self.exempt(key):
            raise StepNotInFixture(self._run, key, self._nearest(key))

    def refuse_effect(self, key: str) -> NoReturn:
        """Effects never run in a replay, live or not."""
        raise StepNotInFixture(self._run, key, self._nearest(key), effect=True)

    def _nearest(self, key: str) -> list[str]:
        return difflib.get_close_matches(key, self._keys, n=3, cutoff=0.0)
