"""This week's updates from the web: an https:// URL of a JSON list or an Atom/RSS feed.

Fetched once, by the ``select`` step, whose record freezes the list: a resumed run never
fetches again, so the feed may change or go down without changing a run in flight. The fetch
has a timeout and a size limit, and every failure is one ``BadInput`` line naming the URL.
Feeds are read by ``feedparser``, which copes with the Atom and RSS found in the wild.
"""

from __future__ import annotations

import hashlib
import html
import re
import urllib.error
import urllib.request
from typing import Any

from tasks.errors import BadInput

MAX_FEED_BYTES = 5 * 1024 * 1024
_TAG = re.compile(r"<[^>]+>")


def is_url(source: str) -> bool:
    """Whether ``DIGEST_ITEMS`` names a URL rather than a file."""
    return source.startswith(("https://", "http://"))


def fetch(url: str, timeout: float) -> bytes:
    """The body at ``url``, at most ``MAX_FEED_BYTES``; verified TLS (``SSL_CERT_FILE``).

    Raises:
        BadInput: not https, no answer in time, an HTTP error, or a body over the limit.
    """
    if not url.startswith("https://"):
        raise BadInput(f"{url}: only https:// URLs are fetched; serve the updates over TLS")
    request = urllib.request.Request(url, headers={"User-Agent": "durable-digest"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            body = bytes(answer.read(MAX_FEED_BYTES + 1))
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
    return body


def feed_entries(url: str, body: bytes) -> list[dict[str, str]] | None:
    """The entries of an Atom or RSS feed as ``{"id", "title", "body"}``; None if not a feed.

    An entry's id is derived from the feed's own (its id, else its link), so the same entry
    keeps the same id every week and is summarized once; the body is its text without markup.
    """
    import feedparser  # only a run reading a feed pays for it

    parsed: Any = feedparser.parse(body)
    if not parsed.get("version"):
        return None
    entries = []
    for entry in parsed.entries:
        origin = entry.get("id") or entry.get("link") or entry.get("title", "")
        content = entry.get("content")
        text = content[0].get("value", "") if content else entry.get("summary", "")
        entries.append(
            {
                "id": "f" + hashlib.sha256(origin.encode()).hexdigest()[:16],
                "title": " ".join(_plain(entry.get("title", "")).split()),
                "body": _plain(text).strip(),
            }
        )
    return entries


def _plain(markup: str) -> str:
    return html.unescape(_TAG.sub("", markup))
