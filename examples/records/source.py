"""The records a batch processes, what processing one does, and the sink it writes to.

The records stand for any few thousand rows from elsewhere: generated here from their number,
so every process (and every test) sees the same ones. Record ``r00042`` is number 42. Every
``BAD_EVERY``-th record has no amount, a defect in the data that fails its processing every
time until someone fixes the data; a fixed id is read with its amount.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Collection
from typing import Any

from journal import Client

BAD_EVERY = 97
_ID = re.compile(r"r(\d{5})")


def record_id(number: int) -> str:
    """The stable id of record ``number``: what its step, status and document are keyed by."""
    return f"r{number:05d}"


def load(rid: str, fixed: Collection[str] = ()) -> dict[str, Any]:
    """Record ``rid`` as the source holds it, or as fixed when ``rid`` is in ``fixed``.

    Raises:
        ValueError: not an id of this source.
    """
    match = _ID.fullmatch(rid)
    if match is None:
        raise ValueError(f"{rid!r} is not a record id (r00001 to r99999)")
    number = int(match[1])
    broken = number % BAD_EVERY == 0 and rid not in fixed
    return {"id": rid, "amount": None if broken else number * 7919 % 10_000, "currency": "EUR"}


def render(record: dict[str, Any]) -> dict[str, Any]:
    """The document made of one record: the work a batch does, once per record.

    Raises:
        ValueError: the record cannot be processed (it has no amount).
    """
    if record["amount"] is None:
        raise ValueError(f"record {record['id']} has no amount")
    cents = int(record["amount"])
    return {"id": record["id"], "net": cents, "vat": cents * 20 // 100, "currency": "EUR"}


class Sink:
    """Where one batch's documents go, and how many times each record was processed.

    The document is written under the record's id, so a record processed twice (it was in
    flight when its worker died) still leaves one document; the call counter shows it. Both
    keys carry the batch in a hash tag, so they stay in one slot of a cluster.
    """

    def __init__(self, client: Client, prefix: str, batch: str) -> None:
        self.client = client
        self.calls_key = f"{prefix}-sink:{{{batch}}}:calls"
        self.documents_key = f"{prefix}-sink:{{{batch}}}:documents"

    def process(self, rid: str, fixed: Collection[str], work_ms: int = 0) -> dict[str, Any]:
        """Process one record: count the call, render the document, write it under the id.

        Raises:
            ValueError: the record's data is bad; the call is counted all the same.
        """
        self.client.hincrby(self.calls_key, rid, 1)
        if work_ms:
            time.sleep(work_ms / 1000)
        document = render(load(rid, fixed))
        self.client.hset(self.documents_key, rid, json.dumps(document))
        return document

    def calls(self) -> dict[str, int]:
        """How many times each record was processed, by id."""
        raw: dict[Any, Any] = self.client.hgetall(self.calls_key)
        return {_text(k): int(v) for k, v in raw.items()}

    def documents(self) -> dict[str, dict[str, Any]]:
        """The documents written, by record id."""
        raw: dict[Any, Any] = self.client.hgetall(self.documents_key)
        return {_text(k): json.loads(v) for k, v in raw.items()}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
