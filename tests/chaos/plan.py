"""The campaign's schedule, drawn from the seed alone: the same seed, the same faults.

Everything random is drawn here, up front, by one ``random.Random(seed)``: each week's new
items and dispatcher, each fault's moment, kind and parameters, each operator's verb and a
number in [0, 1) that picks its target among the runs that exist when it acts (the runs differ
between replays only where the system under test behaves differently, which is the point).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any

from tests.chaos.stack import SMTP_PHASES

WORKERS = ("a", "b")
# What each start of a worker runs its weeks with, in turn (worker b starts at batches).
MODES: tuple[dict[str, str], ...] = (
    {},
    {"DIGEST_APPROVAL": "1"},
    {"DIGEST_BATCH": "1"},
)


FAULT_WEIGHTS = {
    "kill-child": 3.0,
    "stop-child": 2.0,
    "kill-worker": 1.0,
    "stop-worker": 1.5,
    "kill-beat": 0.5,
    "kill-valkey": 1.0,
    "smtp-hold": 2.5,
    "smtp-slow": 1.0,
    "smtp-drop": 1.0,
    "api-latency": 1.0,
    "api-429": 1.0,
    "api-529": 0.7,
    "api-500": 0.7,
    "api-hold": 1.0,
    # Heavier than its share of time would make it: the baseline seed of chaos-ci (1, 60 s)
    # must draw it, and chaos-ci has no minute left for a seed of its own.
    "api-outage": 2.0,
    "api-credit": 0.4,
    "api-slow-item": 1.0,
    "duplicate": 1.5,
    "clock-skew": 0.5,
    "probe-kill": 1.0,
    "batch-create-kill": 0.8,
    "batch-results-kill": 0.6,
    "batch-deadline-kill": 0.6,
}
VERB_WEIGHTS = {
    "approve": 3.0,
    "reject": 1.0,
    "cancel": 1.0,
    "retry": 1.0,
    "fork": 0.5,
    "release": 2.5,
    "resend": 1.0,
    "mark-sent": 1.0,
}


# Faults that aim at a run's first calls, so they fall just after a week is dispatched.
AT_A_WEEKS_START = frozenset(
    {
        "api-slow-item",
        "probe-kill",
        "batch-create-kill",
        "batch-results-kill",
        "batch-deadline-kill",
    }
)
# The batch-results fault arms its crash (a worker's restart) before the next week starts.
ARMED_BEFORE_A_WEEK = frozenset({"batch-results-kill"})
ARMING_S = 4.0


@dataclass(frozen=True)
class Power:
    """How hard the campaign hits; the planted-bug runs tune these to find each bug.

    Attributes:
        week_seconds: how long a simulated week lasts; shorter weeks overlap more.
        faults_per_minute: nemesis faults, spread evenly at random over the run.
        operators_per_minute: operator commands, likewise.
        weights: relative weight of each fault kind (kinds left out are not drawn).
        verbs: relative weight of each operator verb.
        dispatcher_faults: what each week's dispatcher suffers, one drawn per week (None:
            nothing; ``crash``: it dies between claim and publish; ``stall``: it freezes there).
        smtp_phases: where an SMTP hold may fall.
        smtp_hold_seconds: how long a hold lasts, drawn in this range (the SMTP timeout is
            3 s: a hold after the marker longer than it leaves the send ambiguous).
        env: settings of the deployment under test this power needs.
        spare_first_dispatch: the deployment's first dispatch suffers nothing: one that dies
            between claim and publish loses its week (found by the campaign; seeds.txt), which
            would hide whether a bug planted in the dispatcher is caught.
        modes: what each start of a worker runs its weeks with, in turn.
        ask_failed_ambiguous: verbs an operator aims at a run as soon as it has failed with
            its send ambiguous (its email may be out), besides the drawn ones: such a run is
            soon taken over by a duplicate delivery, and a drawn command would seldom meet it.
    """

    week_seconds: float = 8.0
    faults_per_minute: float = 18.0
    operators_per_minute: float = 8.0
    weights: dict[str, float] = field(default_factory=lambda: dict(FAULT_WEIGHTS))
    verbs: dict[str, float] = field(default_factory=lambda: dict(VERB_WEIGHTS))
    dispatcher_faults: tuple[str | None, ...] = (None, None, None, "crash", "stall")
    smtp_phases: tuple[str, ...] = SMTP_PHASES
    smtp_hold_seconds: tuple[float, float] = (1.0, 7.0)
    env: dict[str, str] = field(default_factory=dict)
    spare_first_dispatch: bool = False
    modes: tuple[dict[str, str], ...] = MODES
    ask_failed_ambiguous: tuple[str, ...] = ()


@dataclass(frozen=True)
class Event:
    """One thing the campaign does at ``at`` seconds from its start."""

    at: float
    kind: str
    params: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """As the saved schedule holds it."""
        return asdict(self)


def make_plan(seed: int, duration: float, power: Power) -> list[Event]:
    """Every week, fault and operator command of one campaign, in time order."""
    rng = random.Random(seed)
    events = []
    weeks = max(2, int(duration // power.week_seconds))
    for index in range(weeks):
        events.append(
            Event(
                index * power.week_seconds,
                "week",
                {
                    "index": index,
                    "new_items": rng.randint(2, 4),
                    "second_dispatcher": rng.random() < 0.3,
                    "dispatcher_fault": _dispatcher_fault(rng, power, index),
                },
            )
        )
    kinds, kind_weights = zip(*sorted(power.weights.items()), strict=True)
    for _ in range(round(duration * power.faults_per_minute / 60)):
        kind = rng.choices(kinds, kind_weights)[0]
        at = rng.uniform(1.0, duration - 1.0)
        if kind in AT_A_WEEKS_START:
            at = rng.randrange(weeks) * power.week_seconds + 0.2
            if kind in ARMED_BEFORE_A_WEEK:  # armed a few seconds before the next week
                at += max(0.0, power.week_seconds - ARMING_S)
        events.append(Event(at, kind, fault_params(rng, kind, power)))
    verbs, verb_weights = zip(*sorted(power.verbs.items()), strict=True)
    for _ in range(round(duration * power.operators_per_minute / 60)):
        verb = rng.choices(verbs, verb_weights)[0]
        events.append(
            Event(
                rng.uniform(1.0, duration - 1.0), "operator", {"verb": verb, "pick": rng.random()}
            )
        )
    return sorted(events, key=lambda event: (event.at, event.kind))


def _dispatcher_fault(rng: random.Random, power: Power, week: int) -> str | None:
    drawn = rng.choice(power.dispatcher_faults)
    return None if week == 0 and power.spare_first_dispatch else drawn


def fault_params(rng: random.Random, kind: str, power: Power) -> dict[str, Any]:
    """The parameters of one fault, drawn in a fixed order per kind."""
    worker = rng.choice(WORKERS)
    if kind == "kill-child":
        return {"worker": worker, "child": rng.randint(0, 1)}
    if kind == "stop-child":
        return {"worker": worker, "child": rng.randint(0, 1), "seconds": rng.uniform(1.0, 5.0)}
    if kind == "kill-worker":
        return {"worker": worker, "down": rng.uniform(0.5, 3.0)}
    if kind == "stop-worker":
        return {"worker": worker, "seconds": rng.uniform(1.0, 5.0)}
    if kind in ("kill-beat", "kill-valkey"):
        return {"down": rng.uniform(0.2, 2.5)}
    if kind == "smtp-hold":
        return {
            "phase": rng.choice(power.smtp_phases),
            "seconds": rng.uniform(*power.smtp_hold_seconds),
        }
    if kind == "smtp-slow":
        return {"per_reply": rng.uniform(0.3, 2.0), "seconds": rng.uniform(3.0, 10.0)}
    if kind == "api-latency":
        return {"delay": rng.uniform(0.2, 1.5), "seconds": rng.uniform(3.0, 10.0)}
    if kind in ("api-429", "api-529", "api-500"):
        return {"times": rng.randint(1, 3)}
    if kind in ("api-hold", "api-credit"):
        return {"seconds": rng.uniform(1.0, 6.0)}
    if kind == "api-outage":
        # Longer than a week (8 s) and than the run retries' cap (4 s): weeks pile up retrying.
        return {"seconds": rng.uniform(6.0, 15.0)}
    if kind == "api-slow-item":
        # Under the model timeout (DIGEST_MODEL_TIMEOUT=4): slow, never a timed-out repeat;
        # long enough for the other items' calls to be answered well before the kill under it.
        return {"pick": rng.random(), "seconds": rng.uniform(3.0, 3.5)}
    if kind == "batch-results-kill":
        return {"pick": rng.random()}
    if kind == "duplicate":
        return {"pick": rng.random()}
    if kind == "clock-skew":
        return {"offset": round(rng.uniform(-1.2, 1.2), 2)}
    return {}


# Campaigns aimed at one kind of bug (``--focus``): the planted-bug check of ``make chaos-ci``
# uses them so that a bug of that kind is caught under any timing, not only under lucky ones.
FOCUS = {
    # A third of the weeks' dispatchers freeze between their claim and their publish, past the
    # next week's dispatch, then die: the dispatches after them, left alone, must not move
    # past the week they hold, and must publish it once they are gone.
    "dispatch": Power(
        weights={"duplicate": 1.0, "kill-child": 1.0},
        faults_per_minute=6.0,
        dispatcher_faults=("stall", None, None),
        spare_first_dispatch=True,
    ),
    # The same, the deployment's very first dispatch included.
    "first-dispatch": Power(
        weights={"duplicate": 1.0, "kill-child": 1.0},
        faults_per_minute=6.0,
        dispatcher_faults=("crash", "stall"),
    ),
    # Every send held after the end-of-data marker past the SMTP timeout, or dropped there:
    # each one ambiguous; operators try to release them, resend them, mark them sent.
    "ambiguous-send": Power(
        weights={"smtp-hold": 3.0, "smtp-drop": 1.0},
        faults_per_minute=20.0,
        operators_per_minute=20.0,
        verbs={"release": 3.0, "resend": 1.0, "mark-sent": 1.0},
        smtp_phases=("DATA",),
        smtp_hold_seconds=(3.5, 6.0),
    ),
    # The limiter's learned limits lapse at the start of most weeks and the probing call's
    # worker dies under it: the probe must be free again for the calls after it.
    "limiter": Power(
        weights={"probe-kill": 1.0, "kill-child": 0.3},
        faults_per_minute=8.0,
    ),
    # The same sends, under a deployment that repeats an ambiguous send under its key instead
    # of waiting (DIGEST_AMBIGUOUS_SEND=resend) and gives up at once: the run fails for good
    # with its email maybe out, the one case `digest release` is asked about such a run. Every
    # week is dispatched on time: a dispatcher that dies or stalls holds its weeks back until
    # the next one publishes them, and a 45 s run could then see one week send in all.
    "failed-ambiguous": Power(
        weights={"smtp-hold": 3.0, "smtp-drop": 1.0},
        faults_per_minute=20.0,
        operators_per_minute=20.0,
        verbs={"release": 3.0, "retry": 1.0},
        dispatcher_faults=(None,),
        smtp_phases=("DATA",),
        smtp_hold_seconds=(3.5, 6.0),
        env={"DIGEST_AMBIGUOUS_SEND": "resend", "DIGEST_GIVE_UP_AFTER": "0"},
        ask_failed_ambiguous=("release",),
    ),
    # Sends held after the marker (ambiguous) while operators cancel the runs sending them
    # (refused: the email may be out); the next weeks must not take and send their items.
    "cancel-send": Power(
        weights={"smtp-hold": 3.0, "smtp-drop": 1.0},
        faults_per_minute=20.0,
        operators_per_minute=20.0,
        verbs={"cancel": 3.0, "release": 1.0},
        smtp_phases=("DATA",),
        smtp_hold_seconds=(3.5, 6.0),
    ),
    # One item of most weeks answers slowly; once the other items' answers are old, every
    # pool child dies under the slow call: only answers recorded as they came survive.
    "slow-item": Power(
        weights={"api-slow-item": 1.0},
        faults_per_minute=8.0,
        operators_per_minute=2.0,
        modes=({},),  # every run maps its summaries (a batch run asks no call to hold back)
    ),
    # Runs made slow (API latency, a slow SMTP server) and delivered again while a worker runs
    # them: worker b, behind a hidepid /proc, sees none of worker a's processes and must not
    # take a run a live one holds.
    "hidden-holder": Power(
        week_seconds=6.0,
        weights={"duplicate": 3.0, "api-latency": 1.5, "smtp-slow": 1.0},
        faults_per_minute=24.0,
        operators_per_minute=2.0,
    ),
    # The model API down for every call for longer than a week, again and again, with pool
    # children killed meanwhile: weeks pile up retrying; once it is back each is sent once,
    # and no answer recorded before the outage is paid for twice.
    "outage": Power(
        weights={"api-outage": 2.0, "kill-child": 0.5},
        faults_per_minute=6.0,
        operators_per_minute=2.0,
    ),
    # Every run asks by Message Batches, killed right after a batch's creation, between two of
    # its results, and while asking synchronously past the batch's deadline.
    "batch": Power(
        weights={
            "batch-create-kill": 1.0,
            "batch-results-kill": 1.0,
            "batch-deadline-kill": 1.0,
            "kill-child": 0.3,
        },
        faults_per_minute=9.0,
        dispatcher_faults=(None,),
        env={"DIGEST_BATCH": "1"},
    ),
}
