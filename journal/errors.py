"""Every failure the journal raises, under one root.

    JournalError
    ├── InvalidRunId          a run id that would build an unsafe or ambiguous key
    ├── InvalidArguments      options the workflow's signature does not take, or of a wrong type
    ├── LeaseBusy             another live holder has the run; carries the time it has left
    ├── LeaseLost             our lease expired or was taken over; nothing more may be written
    │   ├── Fenced            a write was refused because a newer holder owns the run
    │   └── EffectLate        an effect's claim ran out before its irreversible moment
    ├── EffectAmbiguous       an effect may have happened, and may not be repeated unasked
    ├── ReceiptUnsaved        an effect happened, and the store refused to record its receipt
    ├── ReplayMismatch        the code asks for a step the journal lacks while recorded ones wait
    ├── StepNotInFixture      a replay against a fixture reached a step the fixture lacks
    ├── BadFixture            a fixture document this version cannot read
    ├── CorruptJournal        a stored record is not what this library writes
    ├── UnserializableResult  a step returned something JSON cannot hold
    ├── RunParked             a run kept dying at start and was set aside
    ├── RetryScheduled        the run failed for a transient cause; the due sweep retries it
    ├── GaveUp                transient failures outlasted the retry deadline: failed for good
    ├── ControlRefused        an operator's cancel, retry or fork does not apply to that run
    │   ├── EffectUnderway    a cancel refused: an effect of the run is claimed or done
    │   └── NothingToDecide   a decision on an effect that is not ambiguous
    ├── StoreUnavailable      Redis could not be reached
    ├── StoreUnsupported      the server lacks what a setting needs (WAITAOF for fsync_records)
    ├── StoreEvicts           the server deletes keys when its memory fills (maxmemory-policy)
    ├── ClockSkewed           this process's clock is too far from the Redis server's
    ├── NotDurable            a record was written but its fsync or replication was not confirmed
    ├── EmbeddedServerError   the embedded Valkey server could not be started or reached
    └── UnknownScriptStatus   a Lua script returned a code this version does not know (a bug)

Control flow that is not a failure (a run suspending until a time or a signal, a run
cancelled by an operator) derives from ``Suspend`` in ``journal._waits`` or is ``Cancelled``
in ``journal._cancel``, not from ``JournalError``, so ``except JournalError`` never swallows
either.

Every exception keeps its constructor arguments in ``args`` so it survives pickling across
Celery's result backend and process pools.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from journal._redact import redact


@dataclass(frozen=True)
class Hints:
    """What an error tells its reader to do, in the words of the application around the journal.

    The library cannot know the command that resets a run or the variable that names the
    store; an application passes its own (``Journal(hints=...)``) and the errors say them.
    """

    parked: str = "fix the cause, then reset it deliberately (Journal.reset)"
    store_down: str = "check that the server is running and the journal's URL is right"


class JournalError(Exception):
    """Root of every error raised by the journal.

    An error with facts to tell is a dataclass of them (``eq=False``: an error is itself, not
    its value); they are its ``args`` too, so a pickled copy is built again from them.
    """

    def __post_init__(self) -> None:
        super().__init__(*vars(self).values())


@dataclass(eq=False)
class InvalidRunId(JournalError):
    """A run id is refused before any Redis key is built from it."""

    run_id: str
    problem: str

    def __str__(self) -> str:
        return (
            f"invalid run id {self.run_id!r}: {self.problem}; "
            "use 1-128 characters of letters, digits, '.', '_' or '-' (for example 2026-w42)"
        )


@dataclass(eq=False)
class InvalidArguments(JournalError):
    """A delivery's options are refused before anything is journaled or frozen."""

    run: str
    problem: str
    takes: str

    def __str__(self) -> str:
        return (
            f"run {self.run}: invalid arguments: {self.problem}; nothing was started; "
            f"the workflow takes {self.takes or 'no options'}"
        )


@dataclass(eq=False)
class LeaseBusy(JournalError):
    """Another live worker holds the run's lease."""

    run: str
    remaining_ms: int
    holder: str | None = None

    def __str__(self) -> str:
        return (
            f"run {self.run} is leased by another worker (fence {self.holder or '?'}) for "
            f"{self.remaining_ms / 1000:.1f}s more; a live holder carries on, a dead one's "
            "lease expires then: retry after that"
        )


@dataclass(eq=False)
class LeaseLost(JournalError):
    """Our lease expired or was taken over; the run must stop without writing."""

    run: str
    detail: str

    def __str__(self) -> str:
        return f"run {self.run}: lease lost ({self.detail}); this worker stops and records nothing"


class Fenced(LeaseLost):
    """A newer holder owns the run: our write was refused by the fence check."""


class EffectLate(LeaseLost):
    """An effect's claim ran out before its irreversible moment: it must not happen now.

    A later holder may already be performing it, having waited the claim out.
    """


@dataclass(eq=False)
class EffectAmbiguous(JournalError):
    """An effect may have happened, and its receiver would not recognise a repeat.

    Raised inside ``Run.effect``, which suspends the run until an operator decides
    (``journal.ops.actions.decide``); it reaches a caller only from an effect outside a run.

    Attributes:
        effect: the effect's step key.
        detail: why it may have happened (a line).
    """

    run: str
    effect: str
    detail: str

    def __str__(self) -> str:
        return f"run {self.run}: effect {self.effect!r} may have happened ({self.detail})"


@dataclass(eq=False)
class ReceiptUnsaved(JournalError):
    """An effect happened, and the store refused the write of its receipt.

    Not a failure before the effect: its claim stays confirmed, so no later holder repeats
    it unasked; the run waits for a decision once the store takes writes again.

    Attributes:
        effect: the effect's step key.
        receipt: what the effect answered (JSON-ready).
        cause: the store's refusal, as it said it.
    """

    run: str
    effect: str
    receipt: object
    cause: str

    def __post_init__(self) -> None:
        self.cause = redact(self.cause)
        super().__post_init__()

    def __str__(self) -> str:
        return (
            f"run {self.run}: effect {self.effect!r} happened, but the store refused its "
            f"receipt ({self.cause}); it will not be repeated unasked"
        )


@dataclass(eq=False)
class ReplayMismatch(JournalError):
    """The workflow's steps no longer line up with what the journal recorded."""

    run: str
    recorded: str
    requested: str
    position: int

    def __str__(self) -> str:
        return (
            f"run {self.run}: replay mismatch at step {self.position}: the code asks for "
            f"{self.requested!r} but the journal recorded {self.recorded!r} there; the code "
            "changed under a running job: gate the change with run.version(...) or finish "
            "old runs on the old code"
        )


@dataclass(eq=False)
class StepNotInFixture(JournalError):
    """A replay against a recorded run reached a step the recording lacks, not allowed live."""

    run: str
    key: str
    nearest: list[str]
    effect: bool = False

    def __str__(self) -> str:
        near = ", ".join(repr(k) for k in self.nearest) or "none"
        if self.effect:
            return (
                f"run {self.run}: effect {self.key!r} is not in the fixture (nearest recorded: "
                f"{near}); a replay never performs an effect: record a new fixture"
            )
        return (
            f"run {self.run}: step {self.key!r} is not in the fixture (nearest recorded: "
            f"{near}); record a new fixture, or let it run live (live={{{self.key!r}}})"
        )


@dataclass(eq=False)
class BadFixture(JournalError):
    """A fixture document that is not one this version of the journal writes or reads."""

    source: str
    problem: str

    def __str__(self) -> str:
        return (
            f"fixture {self.source}: {self.problem}; export it again with this version "
            "(journal.fixture.export)"
        )


@dataclass(eq=False)
class CorruptJournal(JournalError):
    """A journal record cannot be decoded; never treated as a missing step."""

    run: str
    field: str
    detail: str

    def __str__(self) -> str:
        return (
            f"run {self.run}: journal field {self.field!r} is corrupt ({self.detail}); "
            "inspect it with HGET, then repair or delete that field deliberately"
        )


@dataclass(eq=False)
class _StepError(JournalError):
    """A failure tied to one step of one run."""

    run: str
    step: str
    detail: str


class UnserializableResult(_StepError):
    """A step's result cannot be stored as JSON."""

    def __str__(self) -> str:
        return (
            f"run {self.run}: step {self.step!r} returned a value JSON cannot hold "
            f"({self.detail}); return plain dicts, lists, strings, numbers, booleans or None"
        )


@dataclass(eq=False)
class RunParked(JournalError):
    """A run that kept dying before it could record progress was set aside."""

    run: str
    starts: int
    hint: str = Hints.parked

    def __str__(self) -> str:
        return f"run {self.run} was parked after {self.starts} starts without progress; {self.hint}"


def one_line(error: BaseException) -> str:
    """An error as one line of a log or a message: its words, else its type's name."""
    return " ".join(str(error).split()) or type(error).__name__


def _utc(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@dataclass(eq=False)
class RetryScheduled(JournalError):
    """The run failed for a cause its application calls transient, and will be retried.

    Raised by ``Journal.execute`` instead of the error itself (kept as ``__cause__``): the run
    is not failed for good, and the caller should not report it as if it were.
    """

    run: str
    error: str
    retry_at: float
    give_up_at: float

    def __str__(self) -> str:
        return (
            f"run {self.run} failed ({self.error}); the due sweep retries it at "
            f"{_utc(self.retry_at)}, until {_utc(self.give_up_at)} at the latest"
        )


@dataclass(eq=False)
class GaveUp(JournalError):
    """Transient failures went on past the retry deadline: the run is failed for good."""

    run: str
    error: str
    failures: int
    since: float

    def __str__(self) -> str:
        return (
            f"run {self.run} failed for good after {self.failures} transient failures since "
            f"{_utc(self.since)} (the last: {self.error}); it is not retried again: fix the "
            "cause, then start it again deliberately"
        )


@dataclass(eq=False)
class ControlRefused(JournalError):
    """An operator's action (cancel, retry, fork) does not apply to the run as it stands."""

    run: str
    detail: str

    def __str__(self) -> str:
        return f"run {self.run}: {self.detail}"


class EffectUnderway(ControlRefused):
    """A cancel refused: an effect of the run is claimed (under way) or done.

    Attributes:
        effect: the effect's step key (``send``).
        state: ``claimed`` (it may be happening now) or ``done`` (it happened).
    """

    def __init__(self, run: str, effect: str, state: str) -> None:
        super().__init__(run, f"its effect {effect!r} {_effect_state(state)}")
        self.args = (run, effect, state)  # picklable: rebuilt from these
        self.effect = effect
        self.state = state


class NothingToDecide(ControlRefused):
    """A decision on an effect that is not ambiguous: done, not done, or still under way.

    Attributes:
        effect: the effect's step key.
        state: what the effect is (``""`` when the run never claimed it).
    """

    def __init__(self, run: str, effect: str, state: str) -> None:
        said = _effect_state(state) if state else "was never claimed"
        super().__init__(run, f"its effect {effect!r} {said}; there is nothing to decide")
        self.args = (run, effect, state)
        self.effect = effect
        self.state = state


def _effect_state(state: str) -> str:
    """An effect's stored state in words (``journal/lua/effect_claim.lua`` names them)."""
    return {
        "done": "has happened; it will finish",
        "released": "did not happen",
        "ambiguous": "may have happened; it waits for a decision",
    }.get(state, "is under way; it will finish")


@dataclass(eq=False)
class _StoreError(JournalError):
    """A failure of the store itself, named by its URL (its password masked).

    Masked when built, not when shown: the arguments are what Celery's result backend stores
    and what a pickled copy carries.
    """

    url: str
    detail: str
    hint: str = Hints.store_down

    def __post_init__(self) -> None:
        self.url, self.detail = redact(self.url), redact(self.detail)
        super().__post_init__()


class StoreUnavailable(_StoreError):
    """Redis could not be reached or answered with a connection error."""

    def __str__(self) -> str:
        return f"cannot reach the journal store at {self.url} ({self.detail}); {self.hint}"


class StoreEvicts(_StoreError):
    """The server's ``maxmemory-policy`` evicts keys; refused at start, before any write.

    An evicted lease lets a second holder in, an evicted record is work done again, an
    evicted marker re-sends what was sent; none of it says so. ``detail`` is the policy.
    """

    def __str__(self) -> str:
        return (
            f"the journal store at {self.url} has maxmemory-policy {self.detail}: when its "
            "memory fills it deletes keys silently, leases and journal records included; set "
            "`maxmemory-policy noeviction` (a full store then refuses writes loudly) and start "
            "again"
        )


class StoreUnsupported(_StoreError):
    """The server cannot honour a setting; refused when the journal is created."""

    def __str__(self) -> str:
        return f"the journal store at {self.url} cannot be used as configured: {self.detail}"


@dataclass(eq=False)
class ClockSkewed(JournalError):
    """This process's wall clock disagrees with the store's by more than the bound."""

    url: str
    skew: float
    bound: float

    def __str__(self) -> str:
        side = "ahead of" if self.skew > 0 else "behind"
        return (
            f"this machine's clock is {abs(self.skew):.1f}s {side} the journal store at "
            f"{self.url} (at most {self.bound:g}s is allowed: due times, wake-ups and lease "
            "deadlines would be wrong); synchronise it (NTP) and start again"
        )


class NotDurable(_StepError):
    """WAITAOF or WAIT did not confirm a record in time; the run stops rather than trust it."""

    def __str__(self) -> str:
        return (
            f"run {self.run}: step {self.step!r} was written but its fsync or replication was "
            f"not confirmed ({self.detail}); check the Redis server's disk and replicas, then "
            "resume the run"
        )


class EmbeddedServerError(JournalError):
    """The embedded Valkey server could not be started or reached."""


@dataclass(eq=False)
class UnknownScriptStatus(JournalError):
    """A Lua script answered with a status this code does not know: a bug, never ignored."""

    script: str
    status: object

    def __str__(self) -> str:
        return f"script {self.script} returned unknown status {self.status!r}"
