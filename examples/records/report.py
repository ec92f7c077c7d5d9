"""A batch's progress, read from the journal: every record's latest status, run by run.

Nothing but the journal is read: each record's status is its step's result, so the report
is as true mid-run (or after a crash) as at the end, and there is no side file to disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from examples.records.batch import STEP, WORKFLOW, BatchOptions
from journal import Journal
from journal.ops.views import inspect_run


@dataclass(frozen=True)
class Attempt:
    """One run of a batch: its state and each of its records' statuses so far.

    Attributes:
        run_id: the run (``b1``, then ``b1.retry1``, ...).
        state: the run's state as an operator reads it (``running``, ``done``, ...).
        records: how many records the run was given.
        statuses: the recorded result of each record processed, by id.
    """

    run_id: str
    state: str
    records: int
    statuses: dict[str, dict[str, Any]]

    @property
    def failed(self) -> dict[str, str]:
        """The failed ids of this run, with their errors."""
        return {rid: s["error"] for rid, s in self.statuses.items() if s["status"] != "done"}


@dataclass(frozen=True)
class Report:
    """A batch as its attempts left it: each record's latest status.

    Attributes:
        batch: the batch, named by its first run's id.
        attempts: its runs in order: the first, then each retry.
    """

    batch: str
    attempts: list[Attempt]

    @property
    def records(self) -> int:
        """The batch's records: the first run's."""
        return self.attempts[0].records if self.attempts else 0

    @property
    def latest(self) -> dict[str, dict[str, Any]]:
        """Each record processed so far, with the status its latest attempt recorded."""
        statuses: dict[str, dict[str, Any]] = {}
        for attempt in self.attempts:
            statuses.update(attempt.statuses)
        return statuses

    @property
    def done(self) -> int:
        """Records whose latest status is done."""
        return sum(s["status"] == "done" for s in self.latest.values())

    @property
    def failed(self) -> dict[str, str]:
        """Records whose latest status is failed, with the error, in id order."""
        latest = self.latest
        return {
            rid: latest[rid]["error"] for rid in sorted(latest) if latest[rid]["status"] != "done"
        }

    @property
    def pending(self) -> int:
        """Records no attempt has processed yet."""
        return self.records - len(self.latest)


def attempt_id(batch: str, number: int) -> str:
    """The run id of a batch's attempt ``number``: 0 is the batch's first run."""
    return batch if number == 0 else f"{batch}.retry{number}"


def read_attempt(journal: Journal, run_id: str) -> Attempt:
    """One run's state and record statuses, in one consistent read of the journal."""
    view = inspect_run(journal, WORKFLOW, run_id)
    args = journal.run_args(journal.keys(WORKFLOW, run_id)) if view.status != "new" else {}
    ids = args.get("ids")
    records = len(ids) if isinstance(ids, list) else int(args.get("count", BatchOptions.count))
    prefix = f"{STEP}:"
    statuses = {
        step.key.removeprefix(prefix): step.result
        for step in view.steps
        if step.key.startswith(prefix)
    }
    return Attempt(run_id, view.state, records if view.status != "new" else 0, statuses)


def report(journal: Journal, batch: str) -> Report:
    """The batch ``batch``: its first run and every retry started so far."""
    attempts: list[Attempt] = []
    while True:
        attempt = read_attempt(journal, attempt_id(batch, len(attempts)))
        if attempt.state == "new":
            return Report(batch, attempts)
        attempts.append(attempt)
