"""A fork rehearsed in memory: the email it would send, beside the one its run sent.

``digest fork RUN --from STEP --dry-run`` answers "what would this digest say if it ran again
from STEP?" (after a prompt edit, say) without a trace: the run's journal is read in one
snapshot, and both emails come from the dry-run workflow (``preview``: every step but send
and mark-seen) replayed in memory (``journal.testing.Recording``):

- the original's, from every recorded step (nothing runs; no email if it never composed);
- the fork's, from the steps recorded before STEP, the rest run for real (model calls
  included) into a scratch journal that lives in this process only.

Nothing is written to Redis or sent: the steps the fork runs only read the store (the seen
set, the claims), an effect is never reached in memory, and the fork's model calls are held
against the budget (``DIGEST_MAX_COST_USD``) in a tally of this process, started from what
the kept steps paid for, rather than in the run's usage hash: a preview's cost is reported,
and charged to nothing that lasts. The fork keeps the run's id, so
the two emails differ only where the fork's steps answered differently.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from journal.errors import ControlRefused, JournalError
from journal.testing import Frontier, Recording, RunOn, StopAtFrontier
from tasks.job.workflow import digest, preview
from tasks.llm.budget import Tally, journaled_spend
from tasks.runtime import Runtime, rehearsing


@dataclass(frozen=True)
class ForkPreview:
    """The two emails and what the fork ran.

    Attributes:
        run: the full id of the forked run; step: the step it forks from.
        original: the email the run's recorded steps make, or None if it never composed one.
        forked: the email the fork would send.
        ran: the steps the fork ran for real, in the order they finished.
        model_calls: how many of them called the model.
        cost_usd: what those calls cost.
    """

    run: str
    step: str
    original: dict[str, str] | None
    forked: dict[str, str]
    ran: tuple[str, ...]
    model_calls: int
    cost_usd: float

    def diff(self) -> str:
        """The two emails as a unified diff; empty when they are the same."""
        before = email_text(self.original) if self.original is not None else ""
        return "".join(
            difflib.unified_diff(
                before.splitlines(keepends=True),
                email_text(self.forked).splitlines(keepends=True),
                fromfile=f"{self.run} (recorded)",
                tofile=f"{self.run} forked from {self.step} (dry run)",
            )
        )


def preview_fork(runtime: Runtime, run_id: str, step: str) -> ForkPreview:
    """Rehearse the fork of ``run_id`` from ``step`` in memory (see the module).

    Raises:
        ControlRefused: no such run or step, or the fork would stop before its email.
    """
    clock = runtime.journal.clock
    recording = Recording.load(runtime.journal, digest.name, run_id)
    run = recording.keys.run
    kept = recording.before(step)
    try:
        original = _email(recording.replay(preview, policy=StopAtFrontier(), clock=clock).result)
    except Frontier:
        original = None  # it stopped before composing: there is no email to compare with
    tally = Tally.starting_at(journaled_spend(run, kept.steps))
    try:
        with rehearsing(runtime, tally):
            fork = kept.replay(preview, policy=RunOn(), clock=clock)
    except Frontier as stopped:
        raise ControlRefused(run, f"a fork from {step!r} stops at {stopped.key!r}") from None
    forked = _email(fork.result)
    if forked is None:
        raise ControlRefused(run, f"a fork from {step!r} sends no email ({fork.result})")
    calls = fork.result.get("model_calls", 0) if isinstance(fork.result, dict) else 0
    return ForkPreview(run, step, original, forked, fork.ran, int(calls), tally.charged_usd)


def recorded_email(runtime: Runtime, run_id: str) -> dict[str, str] | None:
    """The email a run's recorded steps make, replayed in memory: what it sent, or drafts.

    The console shows this rather than a copy kept at send time: a run that never reached
    its draft step still reads as the email its summaries make, from the same code.
    """
    recording = Recording.load(runtime.journal, digest.name, run_id)
    try:
        clock = runtime.journal.clock
        return _email(recording.replay(preview, policy=StopAtFrontier(), clock=clock).result)
    except (Frontier, JournalError):
        return None  # it stopped before composing, or its journal is not this code's


def email_text(email: dict[str, str]) -> str:
    """An email as its reader sees it: the headers that matter, a blank line, the body."""
    return f"To: {email['to']}\nSubject: {email['subject']}\n\n{email['body']}\n"


def _email(result: Any) -> dict[str, str] | None:
    """The email of a dry run's report; None for a report without one (nothing new)."""
    if isinstance(result, dict) and isinstance(result.get("email"), dict):
        return dict(result["email"])
    return None
