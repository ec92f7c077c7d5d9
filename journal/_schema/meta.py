"""A run's meta hash, parsed once into one value: every field read through one parser.

The meta hash is the run's state as operators and the delivery read it: status, counters,
the frozen options, the wait, the outcome. Its bytes are decoded when it is read, and each
field that holds more than text (JSON, a count, a wait) has its one parser here, which names
the field when it is not what the journal writes (``CorruptJournal``), so an operator can
repair or delete just that one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from journal._schema import codec
from journal.errors import CorruptJournal


@dataclass(frozen=True)
class Wait:
    """What a suspended run waits for, as stored in its meta and shown by inspection.

    Attributes:
        kind: ``sleep``, ``signal`` or ``retry``.
        step: the step key that waits.
        until: wake-up time in seconds since the epoch, or None for a signal with no timeout.
        signal: the signal name, for signal waits.
        attempt: attempts already made, for retry waits (the count survives the suspension).
        reason: a human line (the error behind a retry, for example).
    """

    kind: str
    step: str
    until: float | None = None
    signal: str | None = None
    attempt: int = 0
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict for the run's meta."""
        return {
            "kind": self.kind,
            "step": self.step,
            "until": self.until,
            "signal": self.signal,
            "attempt": self.attempt,
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Wait:
        """Read back what ``to_json`` stored."""
        return cls(
            kind=str(data["kind"]),
            step=str(data["step"]),
            until=None if data.get("until") is None else float(data["until"]),
            signal=data.get("signal"),
            attempt=int(data.get("attempt", 0)),
            reason=str(data.get("reason", "")),
        )

    @classmethod
    def from_meta(cls, run: str, raw: str) -> Wait:
        """Read a run's ``meta.wait`` back.

        Raises:
            CorruptJournal: the field is not JSON, or not a wait this library wrote.
        """
        data = codec.loads_field(run, "meta.wait", raw)
        try:
            return cls.from_json(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptJournal(run, "meta.wait", f"not a wait: {exc!r}") from None


class RunMeta(Mapping[str, str]):
    """A run's meta as text, field by field, with the typed fields parsed on first use.

    A mapping, so a view shows every field as stored; the typed readers are the only parsers
    of their fields. A field is parsed when first read, not all at once: a corrupt outcome
    must not stop an operator from reading the status.

    Args:
        run: the run's full id, for the errors to name.
        fields: the hash as text.
    """

    def __init__(self, run: str, fields: Mapping[str, str]) -> None:
        self.run = run
        self._fields = dict(fields)

    @classmethod
    def parse(cls, run: str, raw: Mapping[bytes, bytes]) -> RunMeta:
        """The hash as Redis returns it; a field that is not UTF-8 was not written by us.

        Raises:
            CorruptJournal: naming the field.
        """
        fields: dict[str, str] = {}
        for name, value in raw.items():
            field = name.decode("utf-8", errors="replace")
            try:
                fields[field] = value.decode()
            except UnicodeDecodeError as exc:
                raise CorruptJournal(run, f"meta.{field}", f"not UTF-8: {exc}") from None
        return cls(run, fields)

    @classmethod
    def from_flat(cls, run: str, flat: Sequence[bytes]) -> RunMeta:
        """The hash as a script returns it: a flat field, value, field, value list."""
        return cls.parse(run, dict(zip(flat[::2], flat[1::2], strict=True)))

    def __getitem__(self, name: str) -> str:
        return self._fields[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __repr__(self) -> str:
        return f"RunMeta({self.run!r}, {self._fields!r})"

    @property
    def status(self) -> str | None:
        """``running``, ``waiting``, ``done``, ``failed``, ``cancelled``; None before a start."""
        return self._fields.get("status")

    def json(self, name: str) -> Any:
        """A JSON field, decoded; None when absent.

        Raises:
            CorruptJournal: it is not JSON.
        """
        raw = self._fields.get(name)
        return None if raw is None else codec.loads_field(self.run, f"meta.{name}", raw)

    @cached_property
    def args(self) -> dict[str, Any] | None:
        """The options the run's first start froze; None before it started.

        Raises:
            CorruptJournal: they are not a JSON object.
        """
        return self._object("args")

    @cached_property
    def sent_args(self) -> dict[str, Any] | None:
        """The options the run's first send carried, kept until a start freezes its own.

        Not the frozen options: a start adds the workflow's defaults, read where it runs.
        The due sweep sends a run that no delivery has opened with these.

        Raises:
            CorruptJournal: they are not a JSON object.
        """
        return self._object("sent_args")

    def _object(self, name: str) -> dict[str, Any] | None:
        value = self.json(name)
        if value is not None and not isinstance(value, dict):
            raise CorruptJournal(self.run, f"meta.{name}", "not a JSON object")
        return value

    @cached_property
    def wait(self) -> Wait | None:
        """What the run waits for (or waited for, before its last start cleared it)."""
        raw = self._fields.get("wait")
        return Wait.from_meta(self.run, raw) if raw else None

    def count(self, name: str) -> int:
        """A counter; 0 when absent.

        Raises:
            CorruptJournal: it is not a count.
        """
        raw = self._fields.get(name, "0")
        if not raw.isdigit():
            raise CorruptJournal(self.run, f"meta.{name}", f"{raw[:40]!r} is not a count")
        return int(raw)

    def created(self, now: float) -> float:
        """When the run was created (seconds); ``now`` for a run that is new or unreadable."""
        try:
            return int(self._fields["created_at"]) / 1000
        except (KeyError, ValueError):
            return now
