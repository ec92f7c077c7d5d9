"""What an operator does to a run from outside it: cancel, retry, decide, fork, purge.

Generic: any workflow's runs, from a command line or a web page alike. None of these ever
writes a step of a run another process holds: a cancel of a held run is a request that the
holder honours inside its own fenced scripts (see ``journal._cancel``), a retry only un-parks a
run nobody holds, and a fork writes a new run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from journal._cancel import CANCEL_FIELD
from journal._clock import millis
from journal._journal import Journal
from journal._redis.backend import Cancelling, Decided, Purging
from journal._schema import codec
from journal._schema.keys import RunKeys
from journal._schema.meta import RunMeta
from journal._schema.records import decode_fields
from journal._schema.status import RunStatus
from journal.errors import ControlRefused, EffectUnderway, NothingToDecide

# Statuses a retry applies to: failed for now (parked or not), or failed and due for an
# automatic retry later.
RETRYABLE = (RunStatus.FAILED, RunStatus.RETRYING)


@dataclass(frozen=True)
class Cancellation:
    """How a cancel request landed.

    Attributes:
        run: the full run id.
        immediate: True when nobody held the run and it is ``cancelled`` now; False when its
            holder stops at its next step boundary.
    """

    run: str
    immediate: bool


def cancel(journal: Journal, workflow: str, run_id: str, reason: str = "") -> Cancellation:
    """Cancel a run: at once when nobody holds it (waiting, failed), else at its next step.

    Refused once an effect of the run is claimed: it may have happened, and what follows it
    (the digest's mark-seen) must run, or the run's work would be done again by another.

    Raises:
        ControlRefused: the run does not exist or has already ended.
        EffectUnderway: an effect of the run is claimed or done; nothing was written.
    """
    keys = journal.keys(workflow, run_id)
    now = millis(journal.clock.now())
    status, named = journal.backend.cancel(keys, now, reason or "cancelled")
    if status is Cancelling.NO_SUCH_RUN:
        raise ControlRefused(keys.run, "no such run")
    if status is Cancelling.ENDED:
        raise ControlRefused(keys.run, f"it is {named[0]} already; there is nothing to cancel")
    if status is Cancelling.EFFECT_CLAIMED:
        raise EffectUnderway(keys.run, effect=named[0], state=named[1])
    return Cancellation(keys.run, immediate=status is Cancelling.CANCELLED)


def retry(journal: Journal, workflow: str, run_id: str) -> dict[str, Any]:
    """Make a failed run (parked or not) ready to start again now; its steps stay.

    Returns:
        The run's frozen arguments, for the caller to hand it to a worker.

    Raises:
        ControlRefused: the run does not exist, or has not failed.
    """
    keys = journal.keys(workflow, run_id)
    meta = journal.meta(keys)
    status = meta.get("status")
    if not meta:
        raise ControlRefused(keys.run, "no such run")
    if status not in RETRYABLE or CANCEL_FIELD in meta:
        raise ControlRefused(keys.run, f"it is {status or 'new'}; only a failed run can be retried")
    if meta.get("parked"):
        journal.reset(workflow, run_id)
    return journal.run_args(keys)


def decide(
    journal: Journal,
    workflow: str,
    run_id: str,
    effect: str,
    *,
    happened: bool,
    receipt: Any = None,
) -> dict[str, Any]:
    """Settle an effect that may have happened: it did, or it is performed again.

    ``happened`` says it did (``receipt`` then stands for its receipt); otherwise it is
    performed again under its idempotency key.
    Only an operator can know (the receiver's own records, a mailbox), so only an operator
    decides; the run waits for it (``Run.effect``) and goes on at once, woken like a signal.

    Returns:
        The run's frozen arguments, for the caller to hand it to a worker.

    Raises:
        ControlRefused: the run does not exist.
        NothingToDecide: the effect is not ambiguous: nothing was written.
    """
    keys = journal.keys(workflow, run_id)
    if not journal.meta(keys):
        raise ControlRefused(keys.run, "no such run")
    decision = "done" if happened else "resend"
    status, state = journal.backend.effect_decide(keys, effect, decision, codec.dumps(receipt))
    if status is not Decided.DECIDED:
        raise NothingToDecide(keys.run, effect, state)
    journal.backend.make_due(keys, millis(journal.clock.now()))
    return journal.run_args(keys)


def fork(
    journal: Journal, workflow: str, run_id: str, from_step: str, new_run_id: str | None = None
) -> RunKeys:
    """A new run holding the source run's steps recorded before ``from_step``.

    The new run starts with the source's frozen arguments and replays the kept steps; from
    ``from_step`` on it executes again, under its own id, so every idempotency key it derives
    (the digest's email key among them) is its own. Map steps recorded after ``from_step``
    are not kept, whichever group they belong to: the fork re-executes them.

    Raises:
        ControlRefused: no such run or step, or the new run id is taken.
    """
    source = journal.keys(workflow, run_id)
    raw_meta, raw_steps = journal.backend.journal(source)
    if not raw_meta:
        raise ControlRefused(source.run, "no such run")
    steps = {field.decode(): value for field, value in raw_steps.items()}
    if from_step not in steps:
        raise ControlRefused(source.run, f"it has no step {from_step!r} to fork from")
    cut = decode_fields(source.run, from_step, steps[from_step])["seq"]
    kept = {
        key: value
        for key, value in steps.items()
        if decode_fields(source.run, key, value)["seq"] < cut
    }
    target = _claim(journal, workflow, run_id, new_run_id, source.run)
    now = millis(journal.clock.now())
    fields: dict[Any, Any] = {
        "workflow": workflow,
        "run_id": target.run_id,
        "forked_at_step": from_step,
        "created_at": now,
        "updated_at": now,
    }
    if b"args" in raw_meta:
        fields["args"] = raw_meta[b"args"]
    journal.backend.write_copy(target, kept, fields, now)
    return target


def _claim(
    journal: Journal, workflow: str, run_id: str, wanted: str | None, origin: str
) -> RunKeys:
    """Reserve the fork's run id (``<run>-fork<N>`` unless given) with one HSETNX."""
    for n in range(1, 1000):
        name = wanted or f"{run_id}-fork{n}"
        keys = journal.keys(workflow, name)
        if journal.backend.reserve(keys, origin):
            return keys
        if wanted:
            raise ControlRefused(keys.run, "that run exists already; choose another --as")
    raise ControlRefused(f"{workflow}:{run_id}", "it has been forked 999 times; use --as")


# Statuses a purge may remove: runs that ended, or failed for good (parked ones included). A
# running, waiting or retrying run is never purged, however old.
PURGEABLE = (RunStatus.DONE, RunStatus.CANCELLED, RunStatus.FAILED)


@dataclass(frozen=True)
class Purged:
    """One run a purge removed (or, dry, would remove).

    Attributes:
        run: the full run id.
        status: its status then.
    """

    run: str
    status: str


def purge(journal: Journal, older_than: float, *, dry_run: bool = False) -> list[Purged]:
    """Remove the keys of every ended run last updated more than ``older_than`` seconds ago.

    Each run is checked again in the script that deletes it (unheld, not updated since it was
    read, still ended), so a run that a delivery or an operator touches meanwhile stays.

    Returns:
        The runs removed, oldest first; with ``dry_run``, those that would be, none removed.
    """
    cutoff = millis(journal.clock.now()) - int(older_than * 1000)
    found = journal.backend.runs_updated_before(cutoff)
    listed = [(journal.keyspace.parse_run(member.decode()), score) for member, score in found]
    metas = journal.backend.metas([keys for keys, _ in listed], False)
    purged: list[Purged] = []
    for (keys, score), raw in zip(listed, metas, strict=True):
        meta = RunMeta.parse(keys.run, raw)
        status = meta.get("status", "")
        if status not in PURGEABLE or "updated_at" not in meta:
            continue
        if status != RunStatus.DONE and unsettled_effects(journal, keys):
            continue  # it may have acted: its keys say so, and its claims must stay
        if (
            dry_run
            or journal.backend.purge(keys, meta["updated_at"], score, PURGEABLE) is Purging.DELETED
        ):
            purged.append(Purged(keys.run, status))
    return purged


def unsettled_effects(journal: Journal, keys: RunKeys) -> dict[str, str]:
    """The run's effects not known to have not happened, by step key: their states.

    A run that did not finish keeps them (and the purge keeps the run): whatever it claimed
    for them elsewhere may be in use by what they did. A revocable effect (a provider batch)
    is not among them: its application undoes it when the run is cancelled.
    """
    raw = journal.backend.effects(keys)
    revocable = {
        field.decode(errors="replace").removesuffix(":revocable")
        for field in raw
        if field.endswith(b":revocable")
    }
    return {
        effect: state
        for effect, state in journal.effect_states(keys).items()
        if state != "released" and effect not in revocable
    }
