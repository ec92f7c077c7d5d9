"""The replay cursor: what earlier attempts recorded, what this attempt has taken, and drift.

A resumed run asks for its steps in the order the code asks; the cursor hands back each
recorded step once, decoded when asked for, and notices drift: a new step key asked for while
steps recorded earlier (outside a map group still open) have not been replayed means the code
changed under a running run, which must stop rather than run a step twice.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from journal._schema.records import decode_fields
from journal.errors import ReplayMismatch


class ReplayCursor:
    """One attempt's view of a run's records; shared by the threads of a map.

    Threads share it and replay takes no lock, so no loop ever walks a dict another thread
    changes: loops walk ``recorded``, which nothing changes, and look the others up one key at
    a time.
    """

    def __init__(
        self,
        run: str,
        recorded: dict[str, bytes],
        exempt: Callable[[str], bool] | None = None,
    ) -> None:
        self.run = run
        self._exempt = exempt  # keys that run afresh though later records wait (a replay's)
        self.lock = threading.Lock()
        self._recorded = recorded  # raw JSON recorded by earlier attempts; never changed
        self._pending = dict(recorded)  # of those, not taken yet; shrinks one pop at a time
        self._known: dict[str, dict[str, Any]] = {}  # replayed or recorded in this attempt
        self._open_groups: set[str] = set()
        self._next_seq: int | None = None

    @property
    def seen(self) -> int:
        """Distinct steps this attempt replayed or recorded."""
        return len(self._known)

    def has(self, key: str) -> bool:
        """Whether ``key`` was recorded by an earlier attempt or this one."""
        with self.lock:
            return key in self._recorded or key in self._known

    def take_next(self, key: str) -> dict[str, Any] | None:
        """The hot path of a resumed run: the record of ``key`` if nobody took it yet.

        One atomic dict operation, no lock: one taker per record. None says nothing: the
        caller falls back to ``take``.
        """
        raw = self._pending.pop(key, None)
        if raw is None:
            return None
        record = self._known[key] = decode_fields(self.run, key, raw)
        return record

    def take(self, key: str, *, drift_check: bool = True) -> dict[str, Any] | None:
        """The recorded step, counted as replayed; or None after checking for drift.

        Raises:
            ReplayMismatch: ``key`` is new while earlier records wait to be replayed.
        """
        with self.lock:
            record = self.consume(key)
            if record is None and drift_check:
                self.check_drift(key)
            return record

    def consume(self, key: str) -> dict[str, Any] | None:
        """The record of ``key`` if the journal holds it, marking it replayed (lock held)."""
        raw = self._pending.pop(key, None)  # the common case first: replaying a past attempt
        if raw is None:
            record = self._known.get(key)
            if record is not None or key not in self._recorded:
                return record
            raw = self._recorded[key]  # another thread took it and has not decoded it yet
        record = self._known[key] = decode_fields(self.run, key, raw)
        return record

    def check_drift(self, requested: str) -> None:
        """Refuse ``requested`` while older records are still to be replayed (lock held).

        Raises:
            ReplayMismatch: naming the first record the code no longer asked for.
        """
        if self._pending and (self._exempt is None or not self._exempt(requested)):
            pending = self._pending_outside_groups()
            if pending:
                seq, recorded = min(pending)
                raise ReplayMismatch(self.run, recorded, requested, seq)

    def older_history(self) -> bool:
        """Whether records of an earlier attempt are still to be replayed, outside open maps."""
        with self.lock:
            return bool(self._pending) and bool(self._pending_outside_groups())

    def open_group(self, prefix: str) -> None:
        """A map is running: its records count as one position for drift (lock held)."""
        self._open_groups.add(prefix)

    def close_group(self, prefix: str) -> None:
        """The map ``prefix`` has ended."""
        with self.lock:
            self._open_groups.discard(prefix)

    def recorded(self, key: str, record: dict[str, Any]) -> None:
        """``key`` was recorded by this attempt (lock held)."""
        self._known[key] = record

    def next_seq(self, count: int = 1) -> int:
        """The next sequence number, or the first of ``count`` in a row handed out at once.

        A map takes one per item it runs, in item order, before any is recorded: its items
        are recorded as they answer, and their numbers still follow the items, so a listing by
        number and a fork's cut read a map in item order. Found once, at the first record of
        this attempt.
        """
        with self.lock:
            if self._next_seq is None:
                # Nothing of this attempt is recorded yet: the earlier attempts hold the highest.
                seqs = (
                    int((self._known.get(key) or decode_fields(self.run, key, raw))["seq"])
                    for key, raw in self._recorded.items()
                )
                self._next_seq = max(seqs, default=0) + 1
            seq = self._next_seq
            self._next_seq += count
            return seq

    def _pending_outside_groups(self) -> list[tuple[int, str]]:
        """(seq, key) of recorded steps not replayed yet, other than open map groups'."""
        pending = []
        for key, raw in self._recorded.items():
            if key not in self._pending:
                continue
            record = decode_fields(self.run, key, raw)
            if record.get("group") not in self._open_groups:
                pending.append((int(record["seq"]), key))
        return pending
