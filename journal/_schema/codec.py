"""JSON in and out of the journal, never pickle.

A journal may outlive the code that wrote it, and a pickle read back from a shared store is a
remote-code risk. orjson is used because replaying a long journal is dominated by decoding:
it keeps the replay of 10,000 steps close to the cost of the HGETALL itself.
"""

from __future__ import annotations

from typing import Any

import orjson

from journal.errors import CorruptJournal


class EncodeError(ValueError):
    """A value JSON cannot hold; callers turn it into a typed error that names the step."""


def dumps(value: Any) -> bytes:
    """Encode strictly: no default hook, so an unknown type fails here, not at replay."""
    try:
        return orjson.dumps(value)
    except TypeError as exc:
        raise EncodeError(str(exc)) from exc


def loads(data: bytes | str) -> Any:
    """Decode one stored value; raises ``orjson.JSONDecodeError`` (a ValueError) when corrupt."""
    return orjson.loads(data)


def loads_field(run: str, field: str, data: bytes | str) -> Any:
    """Decode one stored field of a run; a value that is not JSON was not written by us.

    Raises:
        CorruptJournal: naming the run and the field, so that one field can be repaired.
    """
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise CorruptJournal(run, field, f"not valid JSON: {exc}") from None


DecodeError = orjson.JSONDecodeError
