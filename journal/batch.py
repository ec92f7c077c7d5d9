"""A provider batch as one durable step: submitted once, awaited with no worker, kept per item.

A provider batch (Anthropic's Message Batches: the same requests at half the price, answered
within 24 hours) is what a durable run is for: a wait of hours that must outlive deploys and
crashes without holding a worker. ``Run.batch(prefix, items, request, ...)`` makes it a step.
For batch N of the step (a batch holds at most ``BatchPolicy.max_requests``; more items make
more batches, one after the other):

1. **Plan.** ``plan:P-N`` records when, and the keys of the items the batch asks for (each
   item's key is its request's ``custom_id``, or a digest of it where the provider would
   refuse it: ``custom_id``).
2. **Create**, as a fenced effect ``batch-P-N`` whose receipt is the batch (its id): claimed,
   the lease confirmed right before the request, the batch noted in the keyspace's registry
   (``Keyspace.batches``: batch id -> run) as soon as the provider answers, the receipt saved.
3. **Look**, with durable sleeps: ``sleep:look:P-N:K`` waits (``first_look``, doubling up to
   ``max_look``, never sooner than a ``retry-after``), then ``look:P-N:K`` records what the
   provider said and what the run does next. Between looks the run is suspended: no worker
   waits, and a deploy changes nothing.
4. **Results**, once the batch has ended: each item's result is its own step ``P:KEY``
   (``settle`` makes it from the item's ``succeeded`` or ``errored`` entry); an item whose
   entry is ``expired``, ``canceled`` or missing is asked synchronously (``fallback``), as a
   map would ask it. A replay costs nothing; a resumed run never asks again for an item that
   has a result, and never re-reads the results unless an item lacks one.
5. **Deadline.** A look past ``deadline`` seconds from the first plan, or past the instant
   ``until`` (a run's own deadline), whichever comes first, cancels a batch still processing
   (``cancel:P-N``), then looks every ``cancel_look`` seconds for up to ``cancel_grace`` for
   it to end (what it finished is kept), and gives up on it: the items without a result are
   asked synchronously. The looks before it wake by it, and no batch is created after it.

Every decision is recorded (a look says what comes next), so a resumed run takes the path
the first attempt took, whatever the time when it replays.

**A creation that may have happened.** The batch API takes no idempotency key: a holder that
dies after its create request and before saving the batch leaves the effect ambiguous, and
a batch may exist that nobody will read. The effect is ``repeatable``: the next holder (with
``effect.resumed``) lists the batches created since the plan (less ``skew``, for the
provider's clock) with the same number of requests, leaves out those the registry gives to
another run, and adopts the one the registry gives to this run, else the oldest left; only
if none is left does it create one. Then it lists again and cancels every other such batch
no run owns: a duplicate is cancelled before it is processed.

The window left: a create request of an earlier holder that reaches the provider after that
second listing (delayed past its claim's timeout, in a socket buffer or the network): two
batches are processed and paid for, one never read. And an unowned batch of the same size
may be another run's, in the instant between its create and its registration (or another
keyspace's on the same account): adopted, its results are matched by key, so only the items
whose keys it lacks are asked again, synchronously.

**Cancel.** The creation is ``revocable``: an operator's cancel of the run is not refused for
it. ``cancel_batches`` cancels what a cancelled run left processing (the operator's command
calls it after the cancel); a holder that learns of the cancel between two steps cancels its
batch itself.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from journal._batch_state import (
    LOOK,
    BatchApi,
    BatchEntry,
    BatchPolicy,
    BatchState,
    cancel_key,
    effect_key,
    look_key,
    plan_key,
)
from journal._journal import Journal
from journal._schema.meta import Wait
from journal._schema.records import Record, decode_journal, ordered
from journal._schema.steps import StepKey
from journal.errors import one_line

__all__ = [
    "BatchApi",
    "BatchEntry",
    "BatchPolicy",
    "BatchState",
    "BatchView",
    "batches",
    "cancel_batches",
    "is_batch_look",
]

log = logging.getLogger(__name__)


# -- what operators read and do ---------------------------------------------------------------


@dataclass(frozen=True)
class BatchView:
    """One batch of a run as its journal records it (``digest show``, the console).

    Attributes:
        step: the batch step's prefix (``summarize``).
        n: which batch of the step (1 for the first).
        keys: the items it asks for.
        state: what the last look (or the creation) said; None before the creation's receipt.
        creating: the creation is claimed and its receipt not saved (it may exist).
        cancelled: the deadline's cancel was asked.
        outcome: ``results`` or ``give-up`` once the run is done waiting, else None.
        next_look: when the run looks again (seconds since the epoch), if it waits for it.
    """

    step: str
    n: int
    keys: tuple[str, ...]
    state: BatchState | None
    creating: bool
    cancelled: bool
    outcome: str | None
    next_look: float | None


def batches(
    records: Iterable[Record], effects: Mapping[str, str], wait: Wait | None
) -> list[BatchView]:
    """The batches a run's records describe, in the order they were planned.

    Args:
        records: the run's step records.
        effects: the run's effect states by key (``Journal.effect_states``).
        wait: what the run waits for, if it waits.
    """
    by_key = {record.key: record for record in records}
    views = []
    for record in ordered(by_key.values()):
        if not record.key.startswith("plan:") or not isinstance(record.result, dict):
            continue
        prefix, _, number = record.key.removeprefix("plan:").rpartition("-")
        if not number.isdigit():
            continue
        n = int(number)
        created = by_key.get(effect_key(prefix, n))
        state = BatchState.from_json(created.result) if created is not None else None
        outcome = None
        k = 1
        while (look := by_key.get(look_key(prefix, n, k))) is not None:
            if isinstance(look.result, dict):
                if look.result.get("state"):
                    state = BatchState.from_json(look.result["state"])
                if look.result.get("then") in ("results", "give-up"):
                    outcome = str(look.result["then"])
            k += 1
        sleeping = StepKey.SLEEP.of(look_key(prefix, n, k))
        next_look = wait.until if wait is not None and wait.step == sleeping else None
        views.append(
            BatchView(
                step=prefix,
                n=n,
                keys=tuple(record.result.get("keys", ())),
                state=state,
                creating=created is None
                and effects.get(effect_key(prefix, n)) not in (None, "released"),
                cancelled=cancel_key(prefix, n) in by_key,
                outcome=outcome,
                next_look=next_look,
            )
        )
    return views


def cancel_batches(journal: Journal, workflow: str, run_id: str, api: BatchApi) -> list[str]:
    """Cancel the batches a run left processing (after an operator's cancel of the run).

    A batch whose receipt is recorded and which no look saw end is cancelled; a creation
    whose receipt is not (it may have happened) is looked for as a resumed holder would
    (same size, since its plan, owned by this run or by none) and cancelled. Errors of the
    provider are logged, not raised: the run is cancelled either way.

    Returns:
        The ids of the batches asked to stop.
    """
    keys = journal.keys(workflow, run_id)
    _, raw_steps = journal.backend.journal(keys)
    states = journal.effect_states(keys)
    records = decode_journal(keys.run, raw_steps).values()
    asked: list[str] = []
    policy = BatchPolicy()
    for view in batches(records, states, None):
        if view.outcome is not None:
            continue
        targets: list[str] = []
        if view.state is not None and not view.state.ended:
            targets.append(view.state.id)
        elif view.creating:
            plan = next(r for r in records if r.key == plan_key(view.step, view.n))
            since = float(plan.result["at"]) - policy.skew
            try:
                found = [
                    state
                    for state in api.recent(since)
                    if state.requests == len(view.keys) and not state.ended
                ]
            except Exception as error:
                log.warning("run %s: could not list batches: %s", keys.run, one_line(error))
                continue
            owners = journal.backend.batch_owners([state.id for state in found])
            targets += [s.id for s in found if owners.get(s.id) in (None, keys.run)]
        for batch_id in targets:
            try:
                api.cancel(batch_id)
                asked.append(batch_id)
            except Exception as error:
                log.warning(
                    "run %s: could not cancel batch %s: %s", keys.run, batch_id, one_line(error)
                )
    return asked


def is_batch_look(step: str) -> bool:
    """Whether ``step`` is a batch's durable sleep between two looks at it.

    What a run waiting on one says to an operator: it waits for a provider's batch, not for a
    timer of its own.
    """
    return step.startswith(StepKey.SLEEP.of(LOOK))
