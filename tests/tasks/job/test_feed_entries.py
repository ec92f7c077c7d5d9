"""A feed's entries as the digest reads them: its declared charset kept, phantom entries named.

``feed_entries`` is given what the HTTPS fetch answered, its ``Content-Type`` included; the
real fetch over TLS is in ``test_feeds.py``.
"""

from __future__ import annotations

import logging

import pytest

from tasks.errors import BadInput
from tasks.job.feeds import feed_entries

URL = "https://updates.example/feed.xml"
RSS = """<?xml version="1.0"?>
<rss version="2.0"><channel><title>t</title>
<item><title>{title}</title><link>https://updates.example/{slug}</link>
<description>{body}</description></item>
</channel></rss>"""


def test_the_charset_the_content_type_declares_is_the_one_read() -> None:
    body = RSS.format(title="Жук", slug="beetle", body="Новый жук.").encode("koi8-r")
    entries = feed_entries(URL, body, "application/rss+xml; charset=koi8-r")
    assert entries is not None
    assert [(e["title"], e["body"]) for e in entries] == [("Жук", "Новый жук.")]


def test_an_entry_with_no_id_link_or_title_is_skipped_and_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    good = RSS.format(title="Dark mode", slug="dark", body="Dark mode is here.")
    truncated = good.replace("</channel></rss>", "<item><description>cut")
    with caplog.at_level(logging.WARNING, logger="tasks.job.feeds"):
        entries = feed_entries(URL, truncated.encode(), "application/rss+xml")
    assert entries is not None
    assert [e["title"] for e in entries] == ["Dark mode"]
    assert "entry 2 has no id, link or title: skipped" in caplog.text


def test_a_feed_with_no_usable_entry_is_refused_in_one_line() -> None:
    phantom = '<?xml version="1.0"?><rss version="2.0"><channel><title>t</title><item>'
    with pytest.raises(BadInput) as refused:
        feed_entries(URL, phantom.encode(), "application/rss+xml")
    assert str(refused.value) == (
        f"{URL}: a feed with no usable entry (each lacks an id, a link and a title); "
        "check the feed, or point DIGEST_ITEMS at this week's updates"
    )
