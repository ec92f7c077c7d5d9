"""This week's updates, validated in full before a run journals anything.

The ``select`` step freezes the items it loads, so a bad file caught later would already be
part of the run's history. Every check therefore happens here, up front, and every problem is
one ``BadInput`` line naming the file, the entry, what is wrong and how to fix it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.errors import BadInput
from tasks.job import feeds

MAX_BODY_CHARS = 100_000
MAX_TITLE_CHARS = 500
FIELDS = ("id", "title", "body")

# Ids become step keys (`summarize:<id>`) and file names, so they stay short and plain.
_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
# Titles are one line of the email. Bodies may hold tabs and newlines, but not characters that
# XML (the prompts' markup) forbids or that cannot be encoded as UTF-8 (lone surrogates).
_BAD_TITLE_CHAR = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff\ufffe\uffff]")
_BAD_BODY_CHAR = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


@dataclass(frozen=True)
class Item:
    """One product update: the unit the digest summarizes."""

    id: str
    title: str
    body: str

    def to_json(self) -> dict[str, str]:
        """The form a step records, so ``select`` can replay the frozen list."""
        return {"id": self.id, "title": self.title, "body": self.body}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Item:
        """Rebuild an item from a recorded ``select`` result."""
        return cls(id=data["id"], title=data["title"], body=data["body"])


def load_items(source: str | Path, timeout: float = 10.0) -> list[Item]:
    """Read and check this week's updates.

    Args:
        source: A JSON file holding a list of ``{"id", "title", "body"}`` objects, or an
            https:// URL of such a list or of an Atom/RSS feed (``tasks.job.feeds``).
        timeout: Seconds a URL may take to answer.

    Returns:
        The items in their order.

    Raises:
        BadInput: The file or URL is missing, unreadable, not UTF-8, not JSON, not a feed, or
            an entry breaks a rule; the message is one line that says where and what to do.
    """
    name = str(source)
    if feeds.is_url(name):
        fetched = feeds.fetch(name, timeout)
        raw = fetched.body
        if not raw.lstrip().startswith((b"[", b"\xef\xbb\xbf[")):
            entries = feeds.feed_entries(name, raw, fetched.content_type)
            if entries is None:
                raise BadInput(
                    f"{name}: neither a JSON list of updates nor an Atom or RSS feed; point "
                    "DIGEST_ITEMS at one"
                )
            return _check_list(name, entries)
        return _parse(name, raw)
    try:
        raw = Path(source).read_bytes()
    except FileNotFoundError:
        raise BadInput(
            f"{name}: file not found; create it or set DIGEST_ITEMS to this week's updates file"
        ) from None
    except IsADirectoryError:
        raise BadInput(f"{name}: is a directory; point DIGEST_ITEMS at a JSON file") from None
    except OSError as exc:
        raise BadInput(f"{name}: cannot be read ({exc.strerror}); check its permissions") from None
    return _parse(name, raw)


def _parse(name: str, raw: bytes) -> list[Item]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(
            f"{name}: not valid UTF-8 at byte offset {exc.start} (byte 0x{raw[exc.start]:02x}); "
            "save the file as UTF-8"
        ) from None
    # Editors on some systems add a byte-order mark; it is not part of the JSON.
    text = text.removeprefix("\ufeff")

    try:
        data = json.loads(text, object_pairs_hook=_no_duplicate_fields)
    except json.JSONDecodeError as exc:
        raise BadInput(
            f"{name}: not valid JSON at line {exc.lineno} column {exc.colno} ({exc.msg}); "
            "fix the syntax"
        ) from None
    except _DuplicateField as exc:
        raise BadInput(
            f'{name}: an entry has the field "{exc.args[0]}" twice; keep one of them'
        ) from None
    except RecursionError:
        raise BadInput(
            f"{name}: nested too deeply to be a list of updates; fix its structure"
        ) from None

    if not isinstance(data, list):
        raise BadInput(
            f"{name}: expected a JSON list of updates, found {_kind(data)}; "
            'wrap the entries in [ ] as [{"id": ..., "title": ..., "body": ...}]'
        )
    return _check_list(name, data)


def _check_list(name: str, data: list[Any]) -> list[Item]:
    items: list[Item] = []
    first_index: dict[str, int] = {}
    for index, entry in enumerate(data):
        item = _check_entry(name, index, entry)
        if item.id in first_index:
            raise BadInput(
                f'{name}: entry {index} (id "{item.id}"): duplicate id, also used by entry '
                f"{first_index[item.id]}; give each update its own id"
            )
        first_index[item.id] = index
        items.append(item)
    return items


def _check_entry(name: str, index: int, entry: object) -> Item:
    where = f"{name}: entry {index}"
    if not isinstance(entry, dict):
        raise BadInput(
            f'{where}: expected an object with "id", "title" and "body", found {_kind(entry)}'
        )

    ident = entry.get("id")
    if not isinstance(ident, str) or not _ID.fullmatch(ident):
        found = "nothing" if "id" not in entry else _show(ident)
        raise BadInput(
            f'{where}: "id" must be 1-64 characters of letters, digits, ".", "_" or "-" '
            f"(it becomes a step key), found {found}"
        )
    where = f'{where} (id "{ident}")'

    unknown = sorted(set(entry) - set(FIELDS))
    if unknown:
        raise BadInput(
            f'{where}: unknown field "{unknown[0]}"; the digest uses only "id", "title" and "body"'
        )

    title = _text_field(where, entry, "title", MAX_TITLE_CHARS, _BAD_TITLE_CHAR, "shorten it")
    body = _text_field(
        where, entry, "body", MAX_BODY_CHARS, _BAD_BODY_CHAR, "shorten it or split the update"
    )
    return Item(id=ident, title=title, body=body)


def _text_field(
    where: str, entry: dict[str, Any], field: str, limit: int, bad: re.Pattern[str], fix: str
) -> str:
    value = entry.get(field)
    if not isinstance(value, str) or not value.strip():
        raise BadInput(f'{where}: "{field}" must be a non-empty string')
    if len(value) > limit:
        raise BadInput(
            f'{where}: "{field}" is {len(value):,} characters, over the {limit:,} limit; {fix}'
        )
    hit = bad.search(value)
    if hit:
        raise BadInput(
            f'{where}: "{field}" holds the control or invalid character '
            f"U+{ord(hit.group()):04X} at position {hit.start()}; remove it"
        )
    return value


class _DuplicateField(Exception):
    """Raised from inside the JSON parser, which would otherwise keep the last value silently."""


def _no_duplicate_fields(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateField(key)
        result[key] = value
    return result


def _kind(value: object) -> str:
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return kinds.get(type(value), "a number")


def _show(value: object) -> str:
    """A short, one-line rendering of a bad value for an error message."""
    shown = json.dumps(value, ensure_ascii=True)
    return shown if len(shown) <= 40 else shown[:37] + "..."
