"""This week's updates from the web: an https:// URL of a JSON list or an Atom/RSS feed.

Fetched once, by the ``select`` step, whose record freezes the list: a resumed run never
fetches again, so the feed may change or go down without changing a run in flight. The fetch
has a timeout and a size limit, and every failure is one ``BadInput`` line naming the URL.
Feeds are read by ``feedparser``, which copes with the Atom and RSS found in the wild.
"""

from __future__ import annotations

import hashlib
import html
import logging
import re
from dataclasses import dataclass
from typing import Any

from tasks.errors import BadInput

MAX_FEED_BYTES = 5 * 1024 * 1024
_TAG = re.compile(r"<[^>]+>")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Fetched:
    """A URL's answer: its body, and the ``Content-Type`` that says how to read it."""

    body: bytes
    content_type: str


def is_url(source: str) -> bool:
    """Whether ``DIGEST_ITEMS`` names a URL rather than a file."""
    return source.startswith(("https://", "http://"))


def fetch(url: str, timeout: float) -> Fetched:
    """The answer at ``url``, at most ``MAX_FEED_BYTES``; verified TLS (``SSL_CERT_FILE``).

    Raises:
        BadInput: not https, no answer in time, an HTTP error, or a body over the limit.
    """
    if not url.startswith("https://"):
        raise BadInput(f"{url}: only https:// URLs are fetched; serve the updates over TLS")
    import urllib.error  # here: every command imports this module, only a URL fetches
    import urllib.request

    request = urllib.request.Request(url, headers={"User-Agent": "durable-digest"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            body = bytes(answer.read(MAX_FEED_BYTES + 1))
            content_type = str(answer.headers.get("Content-Type", ""))
    except urllib.error.HTTPError as status:
        raise BadInput(f"{url}: HTTP {status.code} {status.reason}; check DIGEST_ITEMS") from None
    except TimeoutError:
        raise BadInput(f"{url}: no answer within {timeout:g}s (DIGEST_ITEMS_TIMEOUT)") from None
    except (urllib.error.URLError, OSError) as failed:
        reason = getattr(failed, "reason", failed)
        if isinstance(reason, TimeoutError):
            raise BadInput(f"{url}: no answer within {timeout:g}s (DIGEST_ITEMS_TIMEOUT)") from None
        raise BadInput(f"{url}: cannot be fetched ({reason}); check DIGEST_ITEMS") from None
    if len(body) > MAX_FEED_BYTES:
        raise BadInput(
            f"{url}: larger than {MAX_FEED_BYTES // (1024 * 1024)} MB; serve this week's "
            "updates only"
        )
    return Fetched(body, content_type)


def feed_entries(url: str, body: bytes, content_type: str = "") -> list[dict[str, str]] | None:
    """The entries of an Atom or RSS feed as ``{"id", "title", "body"}``; None if not a feed.

    An entry's id is derived from the feed's own (its id, else its link), so the same entry
    keeps the same id every week and is summarized once; the body is its text without markup.
    The charset the server declares is the one read (a KOI8-R feed stays KOI8-R). An entry
    with no id, link or title (a truncated feed's last) is skipped and named: it could be
    told from no other, week after week.

    Raises:
        BadInput: a feed none of whose entries can be used.
    """
    import feedparser  # only a run reading a feed pays for it

    headers = {"content-type": content_type} if content_type else None
    parsed: Any = feedparser.parse(body, response_headers=headers)
    if not parsed.get("version"):
        return None
    entries = []
    for position, entry in enumerate(parsed.entries, start=1):
        origin = entry.get("id") or entry.get("link") or entry.get("title", "")
        if not origin:
            log.warning("%s: entry %d has no id, link or title: skipped", url, position)
            continue
        content = entry.get("content")
        text = content[0].get("value", "") if content else entry.get("summary", "")
        entries.append(
            {
                "id": "f" + hashlib.sha256(origin.encode()).hexdigest()[:16],
                "title": " ".join(_plain(entry.get("title", "")).split()),
                "body": _plain(text).strip(),
            }
        )
    if parsed.entries and not entries:
        raise BadInput(
            f"{url}: a feed with no usable entry (each lacks an id, a link and a title); "
            "check the feed, or point DIGEST_ITEMS at this week's updates"
        )
    return entries


def _plain(markup: str) -> str:
    return html.unescape(_TAG.sub("", markup))
