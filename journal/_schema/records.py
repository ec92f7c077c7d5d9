"""Step records: how a finished step is written to the steps hash, and read back.

One record per step key, a JSON object holding the result and what replay, drift detection
and an operator need (its order, attempt, fence, timings, kind and map group). Writing and
reading live together so the two can never disagree on a field.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from journal._schema import codec
from journal.errors import CorruptJournal, UnserializableResult


def encode(
    run: str,
    key: str,
    result: Any,
    *,
    seq: int,
    attempt: int,
    fence: int,
    started_at: int,
    finished_at: int,
    kind: str,
    group: str | None,
) -> bytes:
    """One step's record, as the record script stores it.

    Raises:
        UnserializableResult: ``result`` is not something JSON can hold.
    """
    stored: dict[str, Any] = {
        "result": result,
        "seq": seq,
        "attempt": attempt,
        "fence": fence,
        "started_at": started_at,
        "finished_at": finished_at,
        "kind": kind,
    }
    if group is not None:
        stored["group"] = group
    try:
        return codec.dumps(stored)
    except codec.EncodeError as exc:
        raise UnserializableResult(run, key, str(exc)) from None


@dataclass(frozen=True)
class Record:
    """One completed step, as stored in the steps hash."""

    key: str
    result: Any
    seq: int
    attempt: int
    fence: int
    started_at: int
    finished_at: int
    kind: str = "step"
    group: str | None = None

    @classmethod
    def decode(cls, run: str, key: str, raw: bytes) -> Record:
        """Read one stored record, refusing anything this library did not write.

        Raises:
            CorruptJournal: a record that is not JSON or lacks its fields. Never treated as a
                missing step: silently running it again could repeat a paid call.
        """
        try:
            data = codec.loads(raw)
            return cls(
                key=key,
                result=data["result"],
                seq=int(data["seq"]),
                attempt=int(data["attempt"]),
                fence=int(data["fence"]),
                started_at=int(data["started_at"]),
                finished_at=int(data["finished_at"]),
                kind=str(data.get("kind", "step")),
                group=data.get("group"),
            )
        except codec.DecodeError as exc:
            raise CorruptJournal(run, key, f"not valid JSON: {exc}") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptJournal(run, key, f"not a step record: {exc!r}") from None


def decode_fields(run: str, key: str, raw: bytes) -> dict[str, Any]:
    """One stored record as a dict, checked for the fields replay needs.

    Replay decodes each record once, when the workflow asks for it, with one ``orjson.loads``
    and no object per record: that keeps replaying 10,000 steps close to the HGETALL itself.

    Raises:
        CorruptJournal: not JSON, or not a step record. Never treated as a missing step.
    """
    try:
        data = codec.loads(raw)
    except codec.DecodeError as exc:
        raise CorruptJournal(run, key, f"not valid JSON: {exc}") from None
    if not isinstance(data, dict) or "result" not in data or not isinstance(data.get("seq"), int):
        raise CorruptJournal(run, key, "not a step record: it lacks 'result' or an integer 'seq'")
    return data


def decode_journal(run: str, raw: dict[bytes, bytes]) -> dict[str, Record]:
    """Decode a whole HGETALL reply."""
    records: dict[str, Record] = {}
    for field, value in raw.items():
        key = field.decode("utf-8", errors="replace")
        records[key] = Record.decode(run, key, value)
    return records


def ordered(records: Iterable[Record]) -> list[Record]:
    """Records in the order they were written."""
    return sorted(records, key=lambda r: r.seq)


def decode_effects(raw: Mapping[bytes, bytes]) -> tuple[dict[str, str], dict[str, str]]:
    """The effects hash as ``(states, details)``, each by effect step key.

    The hash holds ``KEY -> "<fence>:<deadline_ms>:<state>"`` (see ``effect_claim.lua``)
    beside each claimant's process, receipt and, while it is ambiguous, why (``KEY:detail``).
    """
    states: dict[str, str] = {}
    details: dict[str, str] = {}
    for field, value in raw.items():
        name, text = field.decode(errors="replace"), value.decode(errors="replace")
        parts = text.split(":")
        if len(parts) == 3 and parts[0].isdigit() and ":" not in name:
            states[name] = parts[2]
        elif name.endswith(":detail"):
            details[name.removesuffix(":detail")] = text
    return states, details
