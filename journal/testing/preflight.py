"""Before a deploy: would the code installed now resume each run that has not ended?

A run waits for days (an approval, a back-off, a batch); the code changes meanwhile. Today
that is found when the resumed run raises ``ReplayMismatch`` in production. ``check_run``
finds it first: it reads the run's journal in one snapshot and replays it in memory against
the installed workflow (``Recording.replay``), stopping at the first step the journal lacks,
where the run would go on. Read-only: nothing is written, no step function is called, so no
model call and no effect; the store sees one MULTI of reads per run.

A verdict is clean when every recorded step replays (the run stops where it would go on, or
at the wait it is waiting in), and names the version gates that kept the run on its old path.
Otherwise it names the step where the code drifted, what the journal recorded there and
what the code asks for, or the error the body raised on the recorded results.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from journal._journal import Journal
from journal._redact import redact
from journal._workflow import Workflow
from journal.errors import JournalError, ReplayMismatch
from journal.ops.views import list_runs, state_of
from journal.testing._recording import Recording
from journal.testing._rehearsal import Frontier, StopAtFrontier

# Every state of a run that has not ended: each may be resumed by the code deployed next.
UNENDED = frozenset({"running", "cancelling", "waiting", "retrying", "failed", "parked"})


@dataclass(frozen=True)
class Drift:
    """Where a replay left the recording.

    At ``position`` (the recorded step's sequence number) the journal recorded ``expected``;
    the code asks for ``found`` there.
    """

    position: int
    expected: str
    found: str


@dataclass(frozen=True)
class Verdict:
    """What replaying one run against the installed code found.

    Attributes:
        run: the full id; state: its state (``journal.ops.views.state_of``).
        stopped: where a clean replay stopped: ``at <key>`` (the run would go on there),
            ``waiting at <key>``, or ``at its end``.
        drift: where the code drifted, if it did.
        error: the error the body raised on the recorded results, if it did.
        gates: each version gate met and its answer (0: the run keeps the old path).
    """

    run: str
    state: str
    stopped: str = ""
    drift: Drift | None = None
    error: str | None = None
    gates: dict[str, int] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        """Whether the installed code would resume the run along what it recorded."""
        return self.drift is None and self.error is None


def check_run(journal: Journal, workflow: Workflow[Any, Any], run_id: str) -> Verdict:
    """Replay one run's journal against ``workflow`` as installed, in memory (see the module).

    Raises:
        ControlRefused: no such run.
        StoreUnavailable: the store could not be read.
    """
    recording = Recording.load(journal, workflow.name, run_id)
    run = recording.keys.run
    gates: dict[str, int] = {}
    state = _state(recording)
    try:
        ended = recording.replay(
            workflow, policy=StopAtFrontier(), clock=journal.clock, gates=gates
        )
    except Frontier as frontier:
        return Verdict(run, state, stopped=f"at {frontier.key}", gates=gates)
    except ReplayMismatch as drift:
        found = Drift(drift.position, drift.recorded, drift.requested)
        return Verdict(run, state, drift=found, gates=gates)
    except Exception as error:  # the body failed on what the run recorded: it would break
        text = redact(f"{type(error).__name__}: {error}")
        return Verdict(run, state, error=text, gates=gates)
    if ended.unreplayed:  # the body returned before asking for every recorded step
        seqs = {key: recording.seq(key) for key in ended.unreplayed}
        first = min(seqs, key=seqs.__getitem__)
        end = Drift(seqs[first], first, "(the end of the workflow)")
        return Verdict(run, state, drift=end, gates=gates)
    if ended.wait is not None:
        return Verdict(run, state, stopped=f"waiting at {ended.wait.step}", gates=gates)
    return Verdict(run, state, stopped="at its end", gates=gates)


def unended_runs(journal: Journal, workflow: str) -> list[str]:
    """The run ids of ``workflow``'s runs that have not ended, newest first (the runs index)."""
    return [
        row.run_id
        for row in list_runs(journal, limit=sys.maxsize)
        if row.run.split(":", 1)[0] == workflow and row.state in UNENDED
    ]


def check_runs(
    journal: Journal, workflow: Workflow[Any, Any], run_ids: Iterable[str]
) -> list[Verdict]:
    """``check_run`` for each run id, in order."""
    return [check_run(journal, workflow, run_id) for run_id in run_ids]


def _state(recording: Recording) -> str:
    """The run's state, or ``unreadable`` when its meta is what failed."""
    try:
        return state_of(recording.text_meta())
    except JournalError:
        return "unreadable"
