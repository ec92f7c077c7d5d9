"""Read-only views of runs for operators: what ran, when, how often, and who holds it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Any

from journal._cancel import CANCEL_FIELD
from journal._schema import codec
from journal._schema.meta import RunMeta, Wait
from journal._schema.records import Record, decode_effects, decode_journal, ordered
from journal._schema.status import RunStatus

if TYPE_CHECKING:  # a view reads a journal it is given: `digest --help` lists the states alone
    from journal._journal import Journal
    from journal._redis.backend import Snapshot
    from journal._schema.keys import RunKeys

# What an operator filters on: the stored status, refined where one word would mislead.
STATES = (
    "new",
    RunStatus.RUNNING,
    "cancelling",
    RunStatus.WAITING,
    RunStatus.RETRYING,
    RunStatus.FAILED,
    "parked",
    RunStatus.DONE,
    RunStatus.CANCELLED,
)


def state_of(meta: Mapping[str, str]) -> str:
    """The run's state as an operator reads it.

    Its status, but ``parked`` for a parked run (stored as failed, so that it is retried only
    deliberately) and ``cancelling`` for a running run asked to stop.
    """
    status = meta.get("status", "new")
    if meta.get("parked"):
        return "parked"
    if status == RunStatus.RUNNING and CANCEL_FIELD in meta:
        return "cancelling"
    return status


@dataclass(frozen=True)
class RunView:
    """Everything stored about one run, decoded.

    Attributes:
        run: the full id (``digest:2026-w42``).
        meta: the meta hash as text.
        steps: recorded steps in the order they were written.
        lease_holder: ``<fence>:<token>`` of the live holder, if any.
        lease_ttl_ms: the holder's remaining time, if any.
        wait: what a waiting run waits for.
        signals: signals delivered to the run, by name.
        effects: each claimed effect's state, by name: ``claimed``, ``confirmed`` (at its
            irreversible moment), ``done``, ``released``, ``ambiguous`` (it may have
            happened: the run waits for a decision) or ``resend`` (decided: repeat it).
        effect_details: why an ambiguous effect may have happened, by name.
        in_flight: the steps the live holder runs now, by key, with when each started (ms),
            as its last renewal published them; none without a holder, and none recorded.
    """

    run: str
    meta: RunMeta
    steps: list[Record]
    lease_holder: str | None
    lease_ttl_ms: int | None
    wait: Wait | None
    signals: dict[str, Any]
    effects: dict[str, str]
    effect_details: dict[str, str]
    in_flight: dict[str, int] = field(default_factory=dict)

    @property
    def status(self) -> str:
        """``new`` for a run never started, else the stored status."""
        return self.meta.get("status", "new")

    @property
    def state(self) -> str:
        """The status an operator reads (see ``state_of``)."""
        return state_of(self.meta)

    def step(self, key: str) -> Record | None:
        """The record of one step, if present."""
        return next((r for r in self.steps if r.key == key), None)


@dataclass
class Prefetch:
    """A run's read, asked in the start-up checks' transaction (``connect_checked``).

    A command line reads a run before it opens it, to refuse bad input before any write:
    asked with the start-up checks, that read costs no round trip of its own. A store checked
    apart (a cluster) leaves it unread, and ``inspect_run`` reads as usual.

    Attributes:
        keys: the run's, from ``Keyspace.run``.
        snapshot: what the transaction read; ``inspect_run`` takes it once.
    """

    keys: RunKeys
    snapshot: Snapshot | None = None


def inspect_run(
    journal: Journal, workflow: str, run_id: str, *, prefetched: Prefetch | None = None
) -> RunView:
    """One consistent read of a run (a MULTI of reads: one round trip, one snapshot).

    ``prefetched``: the same run read in the start-up checks' transaction, used instead of a
    read of its own when it holds one; it is taken, so a later view reads afresh.
    """
    keys = journal.keys(workflow, run_id)
    seen = None
    if prefetched is not None and prefetched.keys == keys:
        seen, prefetched.snapshot = prefetched.snapshot, None  # taken: never read stale
    if seen is None:
        seen = journal.backend.snapshot(keys)
    holder, ttl = seen.holder, seen.lease_ttl_ms
    meta = RunMeta.parse(keys.run, seen.meta)
    wait = meta.wait
    effects, details = decode_effects(seen.effects)
    steps = ordered(decode_journal(keys.run, seen.steps).values())
    recorded = {record.key for record in steps}
    flight = ((key.decode(errors="replace"), started) for key, started in seen.flight.items())
    return RunView(
        run=keys.run,
        meta=meta,
        steps=steps,
        lease_holder=holder.decode(errors="replace") if holder else None,
        lease_ttl_ms=int(ttl) if holder and ttl > 0 else None,
        wait=wait,
        signals={
            name: codec.loads_field(keys.run, f"signals.{name}", value)
            for name, value in ((k.decode(errors="replace"), v) for k, v in seen.signals.items())
        },
        effects=effects,
        effect_details=details,
        in_flight={
            key: int(started)
            for key, started in flight
            if holder and key not in recorded and started.isdigit()
        },
    )


@dataclass(frozen=True)
class RunRow:
    """One run as a listing shows it.

    Attributes:
        run: the full id; run_id its run id part.
        state: see ``state_of``.
        updated_ms: its score in the runs index.
        meta: the meta hash as text.
        steps: its records in order, when the listing asked for them.
    """

    run: str
    run_id: str
    state: str
    updated_ms: int
    meta: RunMeta
    steps: list[Record]

    @property
    def result(self) -> Any:
        """What the run returned, once it has ended with a result; None before or without."""
        try:
            return codec.loads(self.meta["outcome"])
        except (KeyError, codec.DecodeError):
            return None

    @property
    def cursor(self) -> Cursor:
        """Where a page ending with this row ends (``list_runs(before=...)``)."""
        return Cursor(self.run, self.updated_ms)


# The most runs one page of a listing holds: the CLI's and the console's bound alike.
MAX_PAGE = 1000


def page_size(text: str) -> int:
    """A page size as an operator writes it (``--limit``, ``?limit=``).

    Raises:
        ValueError: ``text`` is not a whole number of runs from 1 to ``MAX_PAGE``.
    """
    if not text.isdigit() or not 1 <= int(text) <= MAX_PAGE:
        raise ValueError(f"{text!r} is not a number of runs from 1 to {MAX_PAGE}")
    return int(text)


@dataclass(frozen=True)
class Cursor:
    """Where a page of the listing ended: its last run and that run's place in the index.

    Written ``<run>@<updated_ms>`` (``digest:2026-w42@1764745893123``): the next page starts
    after that run, at that time, so a run updated meanwhile (moved to the front) does not
    shift the pages, and one that ties it to the millisecond is not skipped.
    """

    run: str
    updated_ms: int

    def __str__(self) -> str:
        return f"{self.run}@{self.updated_ms}"

    @classmethod
    def parse(cls, text: str) -> Cursor:
        """The cursor ``str`` wrote.

        Raises:
            ValueError: ``text`` is not one.
        """
        run, at, ms = text.rpartition("@")
        if not (run and at and ms.isdigit()):
            raise ValueError(f"{text!r} is not a listing cursor (RUN@MILLISECONDS)")
        return cls(run, int(ms))


@dataclass(frozen=True)
class Wanted:
    """What a listing keeps: a state, an outcome (its result's ``status``), a piece of id.

    The id is matched on the index's members before any meta is read, so a search over the
    whole index costs the index, not every run.
    """

    state: str | None = None
    outcome: str | None = None
    id_part: str | None = None

    def keeps(self, row: RunRow) -> bool:
        """Whether ``row`` is one the listing shows."""
        if self.state is not None and row.state != self.state:
            return False
        if self.outcome is None:
            return True
        result = row.result
        return isinstance(result, dict) and result.get("status") == self.outcome


def list_runs(
    journal: Journal,
    *,
    state: str | None = None,
    limit: int = 50,
    steps: bool = False,
    before: Cursor | None = None,
    wanted: Wanted | None = None,
) -> list[RunRow]:
    """Runs newest first from the runs index (no SCAN), optionally only those in ``state``.

    Reads the index a page at a time, with each page's metas (and step journals, if asked)
    in one pipelined round trip, until ``limit`` runs matched or the index ends. ``before``
    starts after the row a previous page ended with (``Cursor``); ``wanted`` narrows further.
    """
    wanted = wanted or Wanted(state)
    if state is not None:
        wanted = Wanted(state, wanted.outcome, wanted.id_part)
    return list(islice(_rows(journal, wanted, steps, before), limit))


def holders_gone(journal: Journal, rows: list[RunRow]) -> set[str]:
    """The rows stored as running whose holder's lease is gone: a crashed delivery's runs.

    Such a run is not running: the due sweep starts it again from its last recorded step.
    """
    live = [row for row in rows if row.state in (RunStatus.RUNNING, "cancelling")]
    keys = [journal.keyspace.parse_run(row.run) for row in live]
    held = journal.backend.leases_held(keys) if keys else []
    return {row.run for row, alive in zip(live, held, strict=True) if not alive}


def _after(
    journal: Journal, members: Iterator[tuple[bytes, float]], cursor: Cursor
) -> Iterator[tuple[bytes, float]]:
    """The index's members that come after ``cursor`` in its newest-first order.

    Those newer than the cursor's time are skipped; at its very time, those up to the cursor's
    own run (ties come in the same order every time). Should that run have moved since, every
    tie is skipped rather than one shown twice.
    """
    for member, score in members:
        if score > cursor.updated_ms:
            continue
        if score == cursor.updated_ms:
            if journal.keyspace.parse_run(member.decode()).run == cursor.run:
                break
            continue
        yield member, score
        break
    yield from members


def _rows(
    journal: Journal,
    wanted: Wanted,
    with_steps: bool,
    before: Cursor | None = None,
    page: int = 100,
) -> Iterator[RunRow]:
    members = journal.backend.runs_newest(page, before.updated_ms if before else None)
    if before is not None:
        members = _after(journal, members, before)
    if wanted.id_part:
        part = wanted.id_part.encode()
        members = (entry for entry in members if part in entry[0].partition(b":")[2])
    while chunk := list(islice(members, page)):
        keys = [journal.keyspace.parse_run(member.decode()) for member, _ in chunk]
        replies = iter(journal.backend.metas(keys, with_steps))
        for run_keys, (_, score) in zip(keys, chunk, strict=True):
            meta = RunMeta.parse(run_keys.run, next(replies))
            records = (
                ordered(decode_journal(run_keys.run, next(replies)).values()) if with_steps else []
            )
            row_state = state_of(meta)
            row = RunRow(run_keys.run, run_keys.run_id, row_state, int(score), meta, records)
            if wanted.keeps(row):
                yield row
