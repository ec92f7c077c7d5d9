"""``DIGEST_ITEMS`` as an https:// URL: a JSON list or an Atom/RSS feed, fetched by ``select``.

A real HTTPS server on loopback, its certificate from a private CA the digest process trusts
through ``SSL_CERT_FILE``; the command line runs as a user runs it, and the test counts the
server's requests.
"""

from __future__ import annotations

import contextlib
import json
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.fakes.tls import PrivateCA
from tests.support import Deployment, wait_until

pytestmark = pytest.mark.slow

RUN = "2026-w42"
ATOM = """<?xml version="1.0" encoding="utf-8"?>
<feed xmlns="http://www.w3.org/2005/Atom">
  <title>Product updates</title>
  <id>urn:example:updates</id>
  <updated>2026-10-12T08:00:00Z</updated>
  <entry>
    <title>Dark mode</title>
    <id>urn:example:dark-mode</id>
    <updated>2026-10-12T08:00:00Z</updated>
    <summary type="html">&lt;p&gt;Dark mode is &lt;b&gt;now&lt;/b&gt; available.
      More below.&lt;/p&gt;</summary>
  </entry>
  <entry>
    <title>Faster search</title>
    <id>urn:example:search</id>
    <updated>2026-10-11T08:00:00Z</updated>
    <summary>Search results load in under 200 ms. Try it.</summary>
  </entry>
</feed>
"""
JSON_LIST = json.dumps([{"id": "u1", "title": "One update", "body": "It is here. Details."}])


class Site:
    """An HTTPS server on 127.0.0.1 answering fixed paths; it counts every request."""

    def __init__(self, ca: PrivateCA) -> None:
        self.requests: list[str] = []
        pages: dict[str, tuple[str, bytes]] = {
            "/feed.xml": ("application/atom+xml", ATOM.encode()),
            "/items.json": ("application/json", JSON_LIST.encode()),
            "/page.html": ("text/html", b"<html><body>Hello</body></html>"),
            "/huge.json": ("application/json", b"[" + b" " * 6_000_000 + b"]"),
        }
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                site.requests.append(self.path)
                if self.path == "/slow.json":
                    time.sleep(5)
                if self.path not in pages:
                    self.send_error(404)
                    return
                kind, body = pages[self.path]
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError, ssl.SSLError):
                    self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ca.server_context("127.0.0.1")
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.server.server_address[1]}{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    served = Site(PrivateCA(tmp_path / "ca"))
    yield served
    served.close()


@pytest.fixture
def feed_deployment(deployment: Deployment, tmp_path: Path) -> Deployment:
    deployment.env.pop("ANTHROPIC_API_KEY", None)
    deployment.env["SSL_CERT_FILE"] = str(tmp_path / "ca" / "private-ca.pem")
    deployment.env["DIGEST_ITEMS_TIMEOUT"] = "2"
    return deployment


def test_an_atom_feed_is_fetched_once_by_select_and_frozen_with_the_run(
    feed_deployment: Deployment, site: Site
) -> None:
    feed_deployment.env["DIGEST_ITEMS"] = site.url("/feed.xml")
    crashed = feed_deployment.cli("run", RUN, env={"CRASH": "after:select"})
    assert crashed.returncode == 137, crashed.stderr
    assert site.requests == ["/feed.xml"]
    wait_until(lambda: feed_deployment.view(RUN).lease_holder is None, 10, "the lease to expire")

    resumed = feed_deployment.cli("run", RUN)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.splitlines()[0] == "  replayed select"
    assert resumed.stdout.splitlines()[-1].startswith("sent: 2 items")
    assert site.requests == ["/feed.xml"]  # the frozen list, not a second fetch
    (sent,) = feed_deployment.outbox()
    body = json.loads(sent.read_text())["body"]
    assert "* Dark mode: Dark mode is now available." in body
    assert "* Faster search: Search results load in under 200 ms." in body


def test_a_json_list_at_an_https_url_is_read_like_the_file(
    feed_deployment: Deployment, site: Site
) -> None:
    feed_deployment.env["DIGEST_ITEMS"] = site.url("/items.json")
    done = feed_deployment.cli("run", RUN)
    assert done.stdout.splitlines()[-1].startswith("sent: 1 items"), done.stderr
    assert site.requests == ["/items.json"]


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("/page.html", "neither a JSON list of updates nor an Atom or RSS feed"),
        ("/missing.xml", "HTTP 404"),
        ("/huge.json", "larger than 5 MB"),
        ("/slow.json", "no answer within 2s"),
    ],
)
def test_a_bad_feed_is_one_line_and_no_email(
    feed_deployment: Deployment, site: Site, path: str, says: str
) -> None:
    url = site.url(path)
    feed_deployment.env["DIGEST_ITEMS"] = url
    refused = feed_deployment.cli("run", RUN)
    assert refused.returncode in (1, 2)
    (line,) = refused.stderr.splitlines()
    assert url in line and says in line, line
    assert feed_deployment.outbox() == []
