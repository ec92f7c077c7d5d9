"""Read-only views of runs for operators: what ran, when, how often, and who holds it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from journal import codec
from journal.steps import Record, decode_journal, ordered
from journal.store import Journal, decode_meta
from journal.waits import Wait


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
    """

    run: str
    meta: dict[str, str]
    steps: list[Record]
    lease_holder: str | None
    lease_ttl_ms: int | None
    wait: Wait | None
    signals: dict[str, Any]

    @property
    def status(self) -> str:
        """``new`` for a run never started, else the stored status."""
        return self.meta.get("status", "new")

    def step(self, key: str) -> Record | None:
        """The record of one step, if present."""
        return next((r for r in self.steps if r.key == key), None)


def inspect_run(journal: Journal, workflow: str, run_id: str) -> RunView:
    """One consistent read of a run (a MULTI of reads: one round trip, one snapshot)."""
    keys = journal.keys(workflow, run_id)
    pipe = journal.client.pipeline(transaction=True)
    pipe.hgetall(keys.meta)
    pipe.hgetall(keys.steps)
    pipe.get(keys.lease)
    pipe.pttl(keys.lease)
    pipe.hgetall(keys.signals)
    raw_meta, raw_steps, holder, ttl, raw_signals = journal.call(pipe.execute)
    meta = decode_meta(keys.run, raw_meta)
    wait = Wait.from_meta(keys.run, meta["wait"]) if meta.get("wait") else None
    return RunView(
        run=keys.run,
        meta=meta,
        steps=ordered(decode_journal(keys.run, raw_steps).values()),
        lease_holder=holder.decode(errors="replace") if holder else None,
        lease_ttl_ms=int(ttl) if holder and ttl > 0 else None,
        wait=wait,
        signals={
            name: codec.loads_field(keys.run, f"signals.{name}", value)
            for name, value in ((k.decode(errors="replace"), v) for k, v in raw_signals.items())
        },
    )


def recent_runs(journal: Journal, limit: int = 20) -> list[tuple[str, int]]:
    """The most recently updated runs, newest first, from the index (no SCAN)."""
    rows: list[tuple[bytes, float]] = journal.call(
        journal.client.zrevrange, journal.keyspace.runs, 0, limit - 1, withscores=True
    )
    return [(member.decode(), int(score)) for member, score in rows]
