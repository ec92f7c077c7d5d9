"""Secrets stay secret on every failure path: planted, driven through each, then searched for.

A deployment is configured with four distinctive secrets: the journal store's password, the
broker's (also the result backend), the SMTP password and the API key. Then every path that
used to echo one is driven for real:

- the SMTP server (STARTTLS, verified) rejects the login;
- the API answers 401 to every call, its error message echoing the key back, once through a
  worker and once through ``digest run``;
- ``digest show`` prints those failed runs;
- the journal's Redis is killed: ``digest run``, ``show`` and ``runs`` fail, and a delivery to a
  real worker retries (Celery keeps the retry's exception in the result backend).

Then every byte that left the processes is searched for each secret, raw and URL-encoded:
the CLI's output, the worker's log, every key and value of the journal store, and every key
and value of the broker and result backend.
"""

from __future__ import annotations

import base64
import re
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import redis

from journal.contrib.embedded import valkey_server_binary
from tests.fakes.anthropic_server import FakeAnthropic
from tests.fakes.smtp import Inbox, LoopbackController, start_server
from tests.fakes.tls import PrivateCA
from tests.support import Deployment, as_text, wait_until

pytestmark = pytest.mark.slow

JOURNAL_PASSWORD = "jrnl-PW-7f3Kq9"
BROKER_PASSWORD = "brkr-PW-2mX8vL"
SMTP_PASSWORD = "smtp-PW/9c@R4tZ"  # needs URL-encoding: both spellings are searched for
API_KEY = "sk-ant-api03-PLANTED-5hN1wQ"
SECRETS = (JOURNAL_PASSWORD, BROKER_PASSWORD, SMTP_PASSWORD, API_KEY)

_BODY = re.compile(r'"body": "([A-Za-z0-9+/=]+)"')


class PasswordValkey:
    """A Valkey on a TCP port that requires a password; killable."""

    def __init__(self, directory: Path, password: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.url = f"redis://:{quote(password, safe='')}@127.0.0.1:{port}/0"
        self.process = subprocess.Popen(
            [
                str(valkey_server_binary()),
                *("--port", str(port), "--bind", "127.0.0.1", "--requirepass", password),
                *("--save", "", "--appendonly", "no", "--dir", str(directory)),
            ],
            stdout=subprocess.DEVNULL,
        )
        self.client = redis.Redis.from_url(self.url)
        wait_until(self._answers, 10, f"valkey on port {port}")

    def _answers(self) -> bool:
        assert self.process.poll() is None, "valkey exited"
        try:
            return bool(self.client.ping())
        except redis.ConnectionError:
            return False

    def dump(self) -> str:
        """Every key and value, as text to search; message bodies decoded from base64."""
        lines = []
        for key in self.client.scan_iter(count=1000):
            kind = as_text(self.client.type(key))
            if kind == "none":  # gone between SCAN and TYPE: a broker key the worker removed
                continue
            readers: dict[str, Callable[[bytes | str], object]] = {
                "string": self.client.get,
                "hash": self.client.hgetall,
                "list": lambda k: self.client.lrange(k, 0, -1),
                "set": self.client.smembers,
                "zset": lambda k: self.client.zrange(k, 0, -1),
            }
            value = readers[kind](key)
            lines.append(f"{as_text(key)} {kind} {_text(value)}")
        text = "\n".join(lines)
        bodies = [base64.b64decode(body).decode() for body in _BODY.findall(text)]
        return "\n".join([text, *bodies])

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return " ".join(f"{_text(k)}={_text(v)}" for k, v in value.items())
    if isinstance(value, (list, set)):
        return " ".join(_text(v) for v in value)
    return str(value)


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[tuple[PasswordValkey, PasswordValkey]]:
    journal = PasswordValkey(tmp_path / "journal-valkey", JOURNAL_PASSWORD)
    broker = PasswordValkey(tmp_path / "broker-valkey", BROKER_PASSWORD)
    yield journal, broker
    journal.kill()
    broker.kill()


@pytest.fixture
def smtp(tmp_path: Path) -> Iterator[tuple[Inbox, PrivateCA, int]]:
    ca = PrivateCA(tmp_path / "ca")
    inbox = Inbox(login=(b"digest", b"the-right-one"))
    controller: LoopbackController = start_server(
        inbox, authenticator=inbox.authenticator, tls_context=ca.server_context("localhost")
    )
    yield inbox, ca, controller.port
    controller.stop()


def leaked(text: str) -> list[str]:
    return [s for s in SECRETS if s in text or quote(s, safe="") in text]


def test_no_secret_leaves_any_failure_path(
    deployment: Deployment,
    fake_anthropic: FakeAnthropic,
    servers: tuple[PasswordValkey, PasswordValkey],
    smtp: tuple[Inbox, PrivateCA, int],
) -> None:
    journal, broker = servers
    inbox, ca, smtp_port = smtp
    deployment.env.update(
        fake_anthropic.env(),
        ANTHROPIC_API_KEY=API_KEY,
        REDIS_URL=journal.url,
        CELERY_BROKER_URL=broker.url,
        DIGEST_SMTP_URL=f"smtp://digest:{quote(SMTP_PASSWORD, safe='')}@localhost:{smtp_port}",
        SSL_CERT_FILE=str(ca.file),
    )
    outputs: list[str] = []

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        done = deployment.cli(*args, timeout=30)
        outputs.append(f"$ digest {' '.join(args)}\n{done.stdout}{done.stderr}")
        return done

    def last_error(run_id: str) -> str:
        return deployment.view(run_id).meta.get("last_error", "")

    worker = deployment.worker("w", concurrency=1)

    # 1. SMTP rejects the login (over verified STARTTLS), through the worker.
    assert cli("enqueue", "2026-w42").returncode == 0
    wait_until(lambda: "rejected the login" in last_error("2026-w42"), 60, "the SMTP failure")
    assert {login for login, _ in inbox.logins} == {b"digest"}
    assert inbox.messages == []

    # 2. The API refuses the key and echoes it: through the worker, then the CLI. Each run
    # before is cancelled, so the next one takes its claimed items and reaches the model.
    fake_anthropic.fail_always(401, message=f"invalid x-api-key: {API_KEY}")
    assert cli("cancel", "2026-w42").returncode == 0
    assert cli("enqueue", "2026-w43").returncode == 0
    wait_until(lambda: "HTTP 401" in last_error("2026-w43"), 60, "the worker's 401 failure")
    assert cli("cancel", "2026-w43").returncode == 0
    by_cli = cli("run", "2026-w44")
    assert by_cli.returncode == 1
    assert "HTTP 401" in by_cli.stderr and "invalid x-api-key: ***" in by_cli.stderr

    # 3. What the journal shows of those runs.
    for run_id in ("2026-w42", "2026-w43", "2026-w44"):
        assert cli("show", run_id).returncode == 0
        assert cli("show", run_id, "--json").returncode == 0
    assert cli("runs").returncode == 0
    journal_keys = journal.dump()
    assert "invalid x-api-key: ***" in journal_keys  # the failures were recorded, masked

    # 4. The journal's Redis dies: the CLI fails with one line, a worker's delivery retries.
    journal.kill()
    for args in (("run", "2026-w45"), ("show", "2026-w42"), ("runs",)):
        down = cli(*args)
        assert down.returncode == 1
        [line] = down.stderr.splitlines()
        assert line.startswith("failed: cannot reach the journal store at redis://:***@127.0.0.1:")
    assert cli("enqueue", "2026-w46").returncode == 0
    # The backend holds a delivery's retry (with its exception) until the next one starts.
    snapshots: list[str] = []

    def retry_stored() -> bool:
        snapshots.append(broker.dump())
        return '"status": "RETRY"' in snapshots[-1]

    wait_until(retry_stored, 30, "a retry stored while the journal's Redis is down", every=0.02)
    assert '"exc_type": "StoreUnavailable"' in snapshots[-1]
    assert '"exc_message": ["redis://:***@127.0.0.1:' in snapshots[-1]
    wait_until(
        lambda: worker.text().count("cannot reach the journal store") >= 2,
        30,
        "two deliveries retried while the journal's Redis is down",
    )
    backend = "\n".join([*snapshots, broker.dump()])

    worker_log = worker.text()
    for evidence in ("rejected the login", "HTTP 401", "invalid x-api-key: ***", "redis://:**"):
        assert evidence in worker_log, evidence

    searched = {
        "CLI output": "\n".join(outputs),
        "worker log": worker_log,
        "journal store": journal_keys,
        "broker and result backend": backend,
    }
    found = {where: leaked(text) for where, text in searched.items() if leaked(text)}
    assert found == {}, f"secrets leaked: {found}"
