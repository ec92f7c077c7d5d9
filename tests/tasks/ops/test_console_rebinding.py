"""DNS rebinding against a real ``digest console``: a foreign name reads and approves nothing.

A web page the operator visits while the console runs can point its own name at 127.0.0.1:
the browser then sends the page's requests to the console as same-origin ones, with the
page's name in ``Host`` and ``Origin`` and ``Sec-Fetch-Site: same-origin``. Over real HTTP to
a real console process, such requests must be refused before anything is read: no page, no
CSRF token, no approval stored; the console's own names still work.
"""

from __future__ import annotations

import http.client
import re
from urllib.parse import urlencode

import pytest

from tests.support import RUN, Deployment
from tests.tasks.ops.test_console_browser import console, free_port

pytestmark = pytest.mark.slow

TOKEN = re.compile(r'name="csrf" value="([^"]+)"')


def ask(
    port: int, method: str, path: str, host: str, form: dict[str, str] | None = None, **headers: str
) -> tuple[int, str]:
    """One request to the console on 127.0.0.1, naming ``host`` as the browser would."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        sent = {"Host": host, **{name.replace("_", "-"): value for name, value in headers.items()}}
        if form is not None:
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        connection.request(method, path, body=urlencode(form) if form else None, headers=sent)
        answer = connection.getresponse()
        return answer.status, answer.read().decode(errors="replace")
    finally:
        connection.close()


def test_a_rebound_name_reads_nothing_and_approves_nothing(deployment: Deployment) -> None:
    assert deployment.cli("run", RUN, "--approval").returncode == 0  # waits for approval
    port = free_port()
    console(deployment, port)
    foreign = f"rebound.example:{port}"
    same_site = {"Origin": f"http://{foreign}", "Sec_Fetch_Site": "same-origin"}

    # The attacker's page, its name now pointing at 127.0.0.1: read the run, then approve it
    # with whatever token the page showed.
    listing, _ = ask(port, "GET", "/", foreign)
    read, page = ask(port, "GET", f"/runs/{RUN}", foreign)
    shown = TOKEN.search(page)
    stolen = {"csrf": shown.group(1) if shown else ""}
    approved, _ = ask(port, "POST", f"/runs/{RUN}/approve", foreign, stolen, **same_site)
    # Even the real token (read by the operator's own tab) approves nothing under that name.
    own, own_page = ask(port, "GET", f"/runs/{RUN}", f"127.0.0.1:{port}")
    real = TOKEN.search(own_page)
    assert own == 200 and real is not None
    forged, _ = ask(
        port, "POST", f"/runs/{RUN}/approve", foreign, {"csrf": real.group(1)}, **same_site
    )

    assert (listing, read, approved, forged) == (421, 421, 421, 421)
    assert shown is None and RUN not in page and "draft" not in page.lower()
    view = deployment.view(RUN)
    assert (view.status, view.signals) == ("waiting", {})

    # Its own names answer; a foreign Origin under its own name is still refused.
    for name in (f"localhost:{port}", f"127.0.0.1:{port}"):
        assert ask(port, "GET", "/", name)[0] == 200
    cross, _ = ask(
        port,
        "POST",
        f"/runs/{RUN}/approve",
        f"127.0.0.1:{port}",
        {"csrf": real.group(1)},
        Origin=f"http://{foreign}",
        Sec_Fetch_Site="same-origin",
    )
    assert cross == 403
    assert deployment.view(RUN).signals == {}
