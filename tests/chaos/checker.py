"""The promise, checked from what the outside world saw and what Redis holds at the end.

The campaign hands :func:`check` an :class:`Observation`: the SMTP server's mailbox, the fake
model API's call log (each call's window), the runs as the journal holds them after the quiet
period, and what a monitor sampled while the faults ran (statuses, fences, step records,
send states). Every check is a pure function of it, so the unit tests feed it fabricated
observations and the campaign's evidence is what the checker judged, saved as JSON.

The five parts of the promise (../shared/DESIGN.md, "The promise, as the campaign checks
it"), one function each:

1. :func:`check_emails`: at most one email per run id, unless the journal marked its send
   ambiguous and every copy carries the same Message-ID; none for a gated run not approved.
2. :func:`check_items`: each item in exactly one run's email, or held by a run `digest runs`
   lists; never in two, never silently dropped.
3. :func:`check_weeks`: every week the schedule reached has a run, in a visible state.
4. :func:`check_paid_calls`: an item's paid calls (and an opening paragraph's), synchronous
   or batch requests, beyond one per run that recorded it are each explained by a fault that
   hit one of its calls in flight.
5. :func:`check_journal`: no step rewritten, fences never going down, no lease of an ended
   run, every sampled status change allowed by ``TRANSITIONS`` (the sampled sequence may skip
   statuses, so a change must be *reachable*, not necessarily direct).

And :func:`check_progress`, the campaign's reading of "time for runs to finish": after the
quiet period no run is left running, retrying or waiting on anything but a person.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from journal._schema.status import ENDED, TRANSITIONS, RunStatus

# Statuses a week's run may show at the end: it was sent or found nothing new (done), or it
# is visibly failed, waiting (a person, a timer, a batch), retrying, or still running;
# cancelled is an operator's decision, shown by `digest runs` as such.
VISIBLE = frozenset({"done", "failed", "waiting", "retrying", "running", "cancelled"})
# How long after a call's answer its result may still be unrecorded for a fault to cost it:
# recording is one round trip, a fault within this margin still caught it in flight.
IN_FLIGHT_MARGIN_S = 0.5


@dataclass(frozen=True)
class Email:
    """One message the SMTP server took."""

    run_id: str
    message_id: str
    items: tuple[str, ...]
    received_at: float


@dataclass(frozen=True)
class Call:
    """One model request that was paid for: a synchronous 200, or a succeeded batch request.

    Attributes:
        item: the item summarized; None for the opening paragraph.
        started, ended: the call's window (a batch request's: its batch's creation to end).
        batch: whether it was a batch request.
        opening: for the opening paragraph, the items its prompt names: the call is told
            apart by them from another run's opening (a fork's names its parent's items).
    """

    item: str | None
    started: float
    ended: float
    batch: bool = False
    opening: tuple[str, ...] = ()


@dataclass(frozen=True)
class FaultWindow:
    """A fault of the timeline, and the time it could catch calls in flight."""

    kind: str
    started: float
    ended: float
    target: str = ""


@dataclass
class RunState:
    """One run as the journal holds it at the end.

    Attributes:
        run_id: the run's id (``2031-w03``, ``2031-w03-fork1``).
        status: the stored status; None for a run never started.
        args: the options it froze at its first start (``approval``, ``batch``).
        send: the send effect's state, "" when never claimed.
        approval: the recorded ``signal:approval`` outcome: "approved", "rejected" or
            "timed-out"; None when the run never recorded one.
        lease: whether a lease key exists.
        fence: the fence counter.
        step_fences: each recorded step's fence.
        summarized: the items whose ``summarize:<id>`` the run recorded, by its own call (a
            fork's copies of its parent's records are not its own).
        opened: the items of the opening paragraph the run recorded (its ``compose`` step,
            asked by its own call: a fork from ``compose`` asks it again), sorted; empty when
            it recorded none.
        listed: whether ``digest runs`` showed it.
        frozen: the items its ``select`` step froze (none for a fork: they are its parent's).
        fork_of: the run it was forked from, for a fork.
        stuck: still running or retrying, or waiting on something other than a person (an
            approval, a decision on an ambiguous send), after the quiet period.
    """

    run_id: str
    status: str | None
    args: dict[str, Any] = field(default_factory=dict)
    send: str = ""
    approval: str | None = None
    lease: bool = False
    fence: int = 0
    step_fences: dict[str, int] = field(default_factory=dict)
    summarized: tuple[str, ...] = ()
    opened: tuple[str, ...] = ()
    listed: bool = True
    frozen: tuple[str, ...] = ()
    fork_of: str | None = None
    stuck: bool = False


@dataclass
class Observation:
    """Everything the checker judges; JSON-serialisable for the evidence file.

    Attributes:
        items: every item id the items file ever held.
        weeks: the weeks the schedule reached (the dispatchers' simulated clock).
        emails: the mailbox.
        calls: the paid model calls.
        runs: every run the journal lists, by run id.
        claims: item id -> holder (``digest:<run>``), at the end.
        seen: item ids in the seen set, at the end.
        statuses: per run, the statuses the monitor saw, in order, repeats collapsed.
        fences: per run, the fence counters the monitor saw, in order.
        rewritten: ``(run, step, before, after)`` for a step record the monitor saw change.
        ambiguous: runs whose send the journal showed ``ambiguous`` (or ``resend``) at any
            sample, or that an operator's ``digest resend`` was accepted for.
        faults: the timeline's faults, as windows.
        copies_allowed: the deployment repeats an ambiguous send under its key by itself
            (``DIGEST_AMBIGUOUS_SEND=resend``): copies under one Message-ID are its design,
            even where the monitor's samples missed the moment the send was ambiguous.
    """

    items: list[str] = field(default_factory=list)
    weeks: list[str] = field(default_factory=list)
    emails: list[Email] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    runs: dict[str, RunState] = field(default_factory=dict)
    claims: dict[str, str] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)
    statuses: dict[str, list[str]] = field(default_factory=dict)
    fences: dict[str, list[int]] = field(default_factory=dict)
    rewritten: list[tuple[str, str, str, str]] = field(default_factory=list)
    ambiguous: set[str] = field(default_factory=set)
    faults: list[FaultWindow] = field(default_factory=list)
    copies_allowed: bool = False

    def to_json(self) -> dict[str, Any]:
        """The observation as plain JSON (sets sorted), for ``observation.json``."""
        data = asdict(self)
        data["seen"] = sorted(self.seen)
        data["ambiguous"] = sorted(self.ambiguous)
        return data


@dataclass(frozen=True)
class Violation:
    """One broken promise: which part, what happened, the evidence, and when (for the timeline).

    Attributes:
        rule: ``emails``, ``items``, ``weeks``, ``paid-calls`` or ``journal``.
        message: one line saying what was broken.
        evidence: the messages, items and runs involved.
        at: the moment to show the fault timeline around (epoch seconds), when one is known.
    """

    rule: str
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)
    at: float | None = None


def check(observation: Observation) -> list[Violation]:
    """Every violation of the promise in ``observation``; empty when it was kept."""
    return [
        *check_emails(observation),
        *check_items(observation),
        *check_weeks(observation),
        *check_paid_calls(observation),
        *check_journal(observation),
        *check_progress(observation),
    ]


def check_emails(observation: Observation) -> list[Violation]:
    """At most one email per run, or same-Message-ID copies of an ambiguous send; gates kept."""
    violations = []
    by_run: dict[str, list[Email]] = defaultdict(list)
    for email in observation.emails:
        by_run[email.run_id].append(email)
    for run_id, emails in sorted(by_run.items()):
        ids = {email.message_id for email in emails}
        marked = run_id in observation.ambiguous or observation.copies_allowed
        if len(emails) > 1 and (not marked or len(ids) > 1):
            violations.append(
                Violation(
                    "emails",
                    f"run {run_id} was emailed {len(emails)} times"
                    + (
                        " and its send was never marked ambiguous"
                        if run_id not in observation.ambiguous
                        else f" under {len(ids)} Message-IDs"
                    ),
                    {"run": run_id, "emails": [asdict(e) for e in emails]},
                    emails[1].received_at,
                )
            )
        run = observation.runs.get(run_id)
        if run is not None and run.args.get("approval") and run.approval != "approved":
            violations.append(
                Violation(
                    "emails",
                    f"run {run_id} waited for approval and was emailed though its approval "
                    f"was {run.approval or 'never given'}",
                    {"run": asdict(run), "emails": [asdict(e) for e in emails]},
                    emails[0].received_at,
                )
            )
    return violations


def check_items(observation: Observation) -> list[Violation]:
    """Each item in one run's email, or visibly pending; never two runs', never dropped.

    A fork is an operator's decision to send a run's items again under the fork's own id:
    its emails are left out of the item count (each still at most one, by ``check_emails``).
    """
    violations = []
    senders: dict[str, list[Email]] = defaultdict(list)
    for email in observation.emails:
        run = observation.runs.get(email.run_id)
        if run is not None and run.fork_of is not None:
            continue
        for item in email.items:
            if email.run_id not in {e.run_id for e in senders[item]}:
                senders[item].append(email)
    for item in observation.items:
        emails = senders.get(item, [])
        if len(emails) > 1:
            violations.append(
                Violation(
                    "items",
                    f"item {item} is in the emails of {len(emails)} runs: "
                    + ", ".join(e.run_id for e in emails),
                    {
                        "item": item,
                        "emails": [asdict(e) for e in emails],
                        "runs": [_run_json(observation, e.run_id) for e in emails],
                    },
                    emails[1].received_at,
                )
            )
        elif not emails:
            problem = _not_pending(observation, item)
            if problem is not None:
                violations.append(
                    Violation("items", f"item {item} {problem}", _item(observation, item))
                )
    return violations


def _not_pending(observation: Observation, item: str) -> str | None:
    """Why an item no email carried is not visibly pending; None when it is."""
    holder = observation.claims.get(item)
    if holder is None:
        seen = " though it is marked seen" if item in observation.seen else ""
        return f"was never emailed and no run holds it{seen}: silently dropped"
    run_id = holder.partition(":")[2]
    run = observation.runs.get(run_id)
    if run is None or not run.listed:
        return f"is held by {holder}, which `digest runs` does not show"
    if run.status == "done":
        return f"is held by {holder}, which is done without having emailed it"
    return None


def _item(observation: Observation, item: str) -> dict[str, Any]:
    holder = observation.claims.get(item)
    return {
        "item": item,
        "holder": holder,
        "seen": item in observation.seen,
        "holder_run": _run_json(observation, holder.partition(":")[2]) if holder else None,
    }


def _run_json(observation: Observation, run_id: str) -> dict[str, Any] | None:
    run = observation.runs.get(run_id)
    return None if run is None else asdict(run)


def check_weeks(observation: Observation) -> list[Violation]:
    """Every week the schedule reached has a run in a visible state: never absent."""
    violations = []
    for week in observation.weeks:
        run = observation.runs.get(week)
        status = None if run is None else run.status
        if status not in VISIBLE:
            violations.append(
                Violation(
                    "weeks",
                    f"week {week} was reached by the schedule and has "
                    + ("no run at all" if run is None else f"a run in state {status}"),
                    {"week": week, "run": _run_json(observation, week)},
                )
            )
    return violations


def check_paid_calls(observation: Observation) -> list[Violation]:
    """Every paid request, summaries and opening paragraphs, synchronous or in a batch.

    Each item's summary is paid once per run that recorded it, plus once per fault that hit
    one of its calls in flight; likewise each opening paragraph, told apart by the items it
    names, once per run that recorded it. A batch counts each of its requests that ended
    paid (``succeeded``) as one call of its item. A fault hits a call when its window
    overlaps the call's, the call's extended by ``IN_FLIGHT_MARGIN_S`` for the record's
    round trip; each fault explains at most one more call of each thing it hit. An operator's
    cancel explains one more call of each item its run had paid for and not recorded (a
    batch's answers that a crashed holder had not yet recorded): the next run asks again.
    """
    recorded: Counter[str] = Counter()
    for run in observation.runs.values():
        recorded.update(run.summarized)
    calls: dict[str, list[Call]] = defaultdict(list)
    for call in observation.calls:
        if call.item is not None:
            calls[call.item].append(call)
    violations = []
    for item, paid in sorted(calls.items()):
        abandoned = _abandoned(observation, item, paid)
        violation = _overpaid(observation, paid, recorded[item], f"item {item}", abandoned)
        if violation is not None:
            violation.evidence["item"] = item
            violation.evidence["runs"] = sorted(
                r.run_id for r in observation.runs.values() if item in r.summarized
            )
            violations.append(violation)
    opened: Counter[tuple[str, ...]] = Counter(
        run.opened for run in observation.runs.values() if run.opened
    )
    openings: dict[tuple[str, ...], list[Call]] = defaultdict(list)
    for call in observation.calls:
        if call.item is None:
            openings[tuple(sorted(call.opening))].append(call)
    for items, paid in sorted(openings.items()):
        what = f"the opening paragraph of {', '.join(items) or 'no items'}"
        violation = _overpaid(observation, paid, opened[items], what)
        if violation is not None:
            violation.evidence["opening"] = list(items)
            violation.evidence["runs"] = sorted(
                r.run_id for r in observation.runs.values() if r.opened == items
            )
            violations.append(violation)
    return violations


def _abandoned(observation: Observation, item: str, paid: list[Call]) -> int:
    """How many paid answers of ``item`` operators' cancels may have thrown away.

    One per cancelled run that froze ``item``, never recorded it, and was cancelled after
    its first paid call.
    """
    first = min(call.started for call in paid)
    cancelled = {
        fault.target
        for fault in observation.faults
        if fault.kind == "operator-cancel" and first < fault.started
    }
    return sum(
        1
        for run_id in cancelled
        if (run := observation.runs.get(run_id)) is not None
        and run.status == "cancelled"
        and item in run.frozen
        and item not in run.summarized
    )


def _overpaid(
    observation: Observation, paid: list[Call], recorded: int, what: str, abandoned: int = 0
) -> Violation | None:
    """A violation when ``paid`` holds more calls than the runs, faults and cancels explain.

    ``abandoned``: the answers runs an operator cancelled threw away (``_abandoned``).
    """
    hit = [fault for fault in observation.faults if any(_overlaps(fault, call) for call in paid)]
    allowed = recorded + len(hit) + abandoned
    if len(paid) <= max(allowed, 1):
        return None
    return Violation(
        "paid-calls",
        f"{what} was paid for {len(paid)} times: {recorded} runs recorded it, "
        f"{len(hit)} faults hit its calls in flight and {abandoned} cancels threw one away",
        {"calls": [asdict(c) for c in paid], "faults_hit": [asdict(f) for f in hit]},
        paid[-1].started,
    )


def _overlaps(fault: FaultWindow, call: Call) -> bool:
    return fault.started <= call.ended + IN_FLIGHT_MARGIN_S and call.started <= fault.ended


def _reachable(before: str) -> frozenset[str]:
    """Every status a run in ``before`` may show later (``TRANSITIONS``, transitively)."""
    start: RunStatus | None = None if before == "new" else RunStatus(before)
    reached: set[RunStatus] = set()
    frontier: list[RunStatus | None] = [start]
    while frontier:
        for after in TRANSITIONS[frontier.pop()]:
            if after not in reached:
                reached.add(after)
                frontier.append(after)
    return frozenset(str(status) for status in reached)


def check_journal(observation: Observation) -> list[Violation]:
    """Steps recorded once, fences only growing, no lease of an ended run, allowed changes."""
    violations = [
        Violation(
            "journal",
            f"run {run_id}: step {step} was recorded twice (its record changed)",
            {"run": run_id, "step": step, "before": before, "after": after},
        )
        for run_id, step, before, after in observation.rewritten
    ]
    for run_id, fences in sorted(observation.fences.items()):
        drops = [(a, b) for a, b in itertools.pairwise(fences) if b < a]
        if drops:
            violations.append(
                Violation(
                    "journal",
                    f"run {run_id}: its fence went down from {drops[0][0]} to {drops[0][1]}",
                    {"run": run_id, "fences": fences},
                )
            )
    for run_id, run in sorted(observation.runs.items()):
        if run.status in ENDED and run.lease:
            violations.append(
                Violation(
                    "journal",
                    f"run {run_id} is {run.status} and a lease is still held on it",
                    {"run": asdict(run)},
                )
            )
        over = {step: fence for step, fence in run.step_fences.items() if fence > run.fence}
        if over and run.fork_of is None:  # a fork's copies keep its parent's fences
            violations.append(
                Violation(
                    "journal",
                    f"run {run_id}: steps recorded at fences above its counter ({run.fence})",
                    {"run": run_id, "steps": over},
                )
            )
    for run_id, statuses in sorted(observation.statuses.items()):
        for before, after in _changes(statuses):
            if after not in _reachable(before):
                violations.append(
                    Violation(
                        "journal",
                        f"run {run_id}: status went from {before} to {after}, which "
                        "TRANSITIONS does not allow",
                        {"run": run_id, "statuses": statuses},
                    )
                )
                break
    return violations


def check_progress(observation: Observation) -> list[Violation]:
    """Once every fault has stopped and the quiet period has passed, no run is left stuck.

    The promise lets a week be visibly waiting or retrying; this is the campaign's own
    reading of "time for runs to finish": with every process back and every fake normal
    for longer than any back-off, lease or batch deadline, a run that waits for no person
    and has not ended did not recover.
    """
    return [
        Violation(
            "progress",
            f"run {run_id} is still {run.status} after the quiet period, waiting for no person",
            {"run": asdict(run)},
        )
        for run_id, run in sorted(observation.runs.items())
        if run.stuck
    ]


def _changes(statuses: Iterable[str]) -> list[tuple[str, str]]:
    collapsed: list[str] = []
    for status in statuses:
        if not collapsed or collapsed[-1] != status:
            collapsed.append(status)
    return list(itertools.pairwise(collapsed))
