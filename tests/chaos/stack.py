"""The deployment the campaign starts and breaks: Valkey on its AOF, workers, beat, the fakes.

Everything runs on this machine: Valkey on a unix socket of the campaign's directory (so a
restart finds the same address and no other process can take it), the fake Anthropic API and
the SMTP server on 127.0.0.1. Every process is started in a process group of its own and
killed, group and all, by :meth:`Stack.close`, whatever stopped the campaign.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from tests.failure.test_unseen_holder import HIDDEN_PROC, NOBODY
from tests.fakes.anthropic_server import FakeAnthropic, message_text
from tests.fakes.smtp import Inbox, LoopbackController, start_server
from tests.support import ROOT, AofValkey, Deployment, Worker

# Phases an SMTP session can be held at (``Inbox.hold``), in the order a session reaches them.
SMTP_PHASES = ("EHLO", "RCPT", "DATA-COMMAND", "DATA")
HIDING_TOOLS = ("unshare", "setpriv", "mount")
FAKETIME_LIBRARY = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


def hidden_workers_available() -> bool:
    """Whether a worker can run as another user behind a hidepid ``/proc`` (root, tools)."""
    return os.geteuid() == 0 and all(shutil.which(tool) for tool in HIDING_TOOLS)


def faketime_available() -> bool:
    """Whether clock skew can be injected: ``faketime`` on PATH and its library present."""
    return shutil.which("faketime") is not None and FAKETIME_LIBRARY.exists()


class ChaosInbox(Inbox):
    """The SMTP fake's inbox, plus the faults the campaign needs that it does not have.

    ``drop_after_marker``: the next session's message is taken (it counts as delivered) and
    the connection is closed instead of answering the end-of-data marker, as a relay that
    crashed right after queueing would. ``slow``: every reply waits that many seconds.
    """

    def __init__(self) -> None:
        super().__init__()
        self.drop_after_marker = False
        self.slow = 0.0
        self.received_at: list[float] = []

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, options: list[str]
    ) -> str:
        if self.slow:
            await asyncio.sleep(self.slow)
        answer: str = await super().handle_RCPT(server, session, envelope, address, options)
        return answer

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        if self.slow:
            await asyncio.sleep(self.slow)
        self.received_at.append(time.time())  # before the hold at DATA: it is taken now
        answer: str = await super().handle_DATA(server, session, envelope)
        if self.drop_after_marker:
            self.drop_after_marker = False
            server.transport.close()  # taken, never answered
        return answer


@dataclass(frozen=True)
class ApiCall:
    """One call the fake model API answered: when it came and went, its prompt, its status."""

    started: float
    ended: float
    text: str
    status: int


class TimedAnthropic(FakeAnthropic):
    """The fake Anthropic API, remembering when each call arrived and was answered.

    The paid-calls check needs each call's window, to tell a call repeated because a fault hit
    it while it was in flight from one repeated for no reason.
    """

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.timed: list[ApiCall] = []
        self._timed_lock = threading.Lock()

    def respond(
        self, path: str, headers: Mapping[str, str], raw: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        started = time.time()
        status, answer_headers, payload = super().respond(path, headers, raw)
        if path.partition("?")[0] == "/v1/messages":
            try:
                body = json.loads(raw)
            except ValueError:
                body = {}
            call = ApiCall(started, time.time(), message_text(body), status)
            with self._timed_lock:
                self.timed.append(call)
        return status, answer_headers, payload

    def in_flight(self, contains: str) -> bool:
        """Whether a call whose prompt holds ``contains`` has arrived and is not answered yet."""
        arrived = sum(contains in request.text for request in self.requests)
        with self._timed_lock:
            answered = sum(contains in call.text for call in self.timed)
        return arrived > answered

    def in_flight_texts(self) -> list[str]:
        """The prompts of the calls that have arrived and are not answered yet."""
        waiting = Counter(request.text for request in self.requests)
        with self._timed_lock:
            waiting.subtract(call.text for call in self.timed)
        return [text for text, count in waiting.items() for _ in range(max(0, count))]

    def stop_delaying(self, contains: str) -> None:
        """Undo ``delay_when(contains, ...)``: the fake has no way of its own to."""
        with self._lock:
            self._delays = [(needle, s) for needle, s in self._delays if needle != contains]


@dataclass
class Stack:
    """The whole deployment; ``close`` ends every process it started.

    Attributes:
        directory: the campaign's files for this seed (Valkey's AOF, logs, items, timeline).
        items_path: the items file, grown week by week by the workload.
    """

    directory: Path
    env_overrides: dict[str, str] = field(default_factory=dict)
    valkey: AofValkey = field(init=False)
    api: TimedAnthropic = field(init=False)
    inbox: ChaosInbox = field(init=False)
    smtp: LoopbackController = field(init=False)
    deployment: Deployment = field(init=False)
    workers: dict[str, Worker] = field(default_factory=dict)
    beat: subprocess.Popen[bytes] | None = None
    items_path: Path = field(init=False)
    _helpers: list[subprocess.Popen[str]] = field(default_factory=list)

    def start(self) -> None:
        """Start Valkey, the fakes and beat; the deployment's env points at them.

        Workers are started by the caller, each with its own settings (``start_worker``).
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        self.items_path = self.directory / "items.json"
        self.items_path.write_text("[]")
        self.valkey = AofValkey(self.directory / "valkey")
        self.valkey.start()
        self.api = TimedAnthropic()
        self.api.start()
        self.api.batch_processing_time = 1.0
        self.inbox = ChaosInbox()
        self.smtp = start_server(self.inbox)
        env = {
            **self.api.env(),
            "REDIS_URL": self.valkey.url,
            "CELERY_BROKER_URL": f"redis+socket://{self.valkey.socket}",
            "DIGEST_ITEMS": str(self.items_path),
            "DIGEST_SMTP_URL": f"smtp://127.0.0.1:{self.smtp.port}",
            "DIGEST_SMTP_TIMEOUT": "3",
            "DIGEST_MODEL_TIMEOUT": "4",
            "DIGEST_LEASE_TTL": "2",
            # Weeks last seconds here, so a run of dispatcher faults outlasts the default four
            # weeks of catch-up, past which a missed week is dropped as documented: the checker
            # judges faults, not that bound.
            "DIGEST_CATCH_UP_WEEKS": "52",
            "DIGEST_SWEEP_INTERVAL": "1",
            # A week whose message is lost before it opens (a worker killed with it reserved) is
            # sent again this long after; the default (300 s) outlasts a short campaign.
            "DIGEST_REDELIVER_AFTER": "10",
            "DIGEST_RUN_RETRY_DELAY": "1",
            "DIGEST_RUN_RETRY_MAX_DELAY": "4",
            "DIGEST_APPROVAL_TIMEOUT": "25",
            "DIGEST_BATCH_FIRST_LOOK": "0.5",
            "DIGEST_BATCH_MAX_LOOK": "1",
            # A batch processes in a second here; one the batch-deadline fault slows down is
            # cancelled at this deadline and its items asked synchronously.
            "DIGEST_BATCH_DEADLINE": "8s",
            "DIGEST_CONCURRENCY": "3",
            **self.env_overrides,
        }
        self.deployment = Deployment(self.directory / "state", **env)
        self.start_beat()

    @property
    def env(self) -> dict[str, str]:
        """The environment every process of the deployment gets."""
        return self.deployment.env

    def start_worker(
        self,
        name: str,
        clock_offset: str | None = None,
        env: Mapping[str, str] | None = None,
        hidden: bool = False,
    ) -> Worker:
        """A worker of 2 prefork processes; its clock shifted by libfaketime when given one.

        The library is preloaded through the environment rather than by the ``faketime``
        wrapper, which would stand between the campaign and the worker's own pid.

        Args:
            hidden: run it as another user behind a ``/proc`` mounted ``hidepid=invisible``
                (a hardened host's ``ProtectProc=invisible``), in the same pid namespace: the
                other worker's processes are absent from its ``/proc`` while alive, so only
                ``kill(pid, 0)`` can tell it they are gone (``hidden_workers_available``).
        """
        extra = dict(env or {})
        if clock_offset is not None:
            extra |= {
                "LD_PRELOAD": str(FAKETIME_LIBRARY),
                "FAKETIME": clock_offset,
                "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            }
        on = None
        if hidden:

            def on(*command: str) -> list[str]:
                return ["unshare", "-m", "sh", "-c", HIDDEN_PROC, "sh", *NOBODY, *command]

        worker = self.deployment.worker(name, concurrency=2, env=extra, on=on)
        self.workers[name] = worker
        return worker

    def start_beat(self) -> None:
        """Beat: the due sweep every second (its weekly entries never fire in a campaign)."""
        self.beat = self.deployment.beat()

    def helper(self, *args: str, env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
        """A short-lived Python process of the deployment (a dispatcher, a producer)."""
        process = subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            env={**self.env, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self._helpers.append(process)
        return process

    def messages(self) -> list[EmailMessage]:
        """Every message the SMTP server took, in order."""
        return list(self.inbox.messages)

    def resume_everything(self) -> None:
        """SIGCONT every process group (a frozen one must finish), let SMTP and the API go."""
        for process in self._groups():
            if process.poll() is None:  # a reaped one's pid may be another process's
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGCONT)
        self.inbox.slow = 0.0
        self.inbox.drop_after_marker = False
        self.inbox.release_all()
        self.api.release()
        self.api.release_batch_creates()
        self.api.clear_faults()
        self.api.delay = 0.0

    def _groups(self) -> list[subprocess.Popen[Any]]:
        groups: list[subprocess.Popen[Any]] = [*self.deployment.processes, *self._helpers]
        if self.valkey.process is not None:
            groups.append(self.valkey.process)
        return groups

    def close(self) -> None:
        """Kill every process group started here, then stop the fakes; never raises."""
        if not hasattr(self, "valkey"):
            return  # start() never got as far as the first process
        for process in self._groups():
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGCONT)
                    os.killpg(process.pid, signal.SIGKILL)
        for process in self._groups():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
        with contextlib.suppress(Exception):
            self.inbox.release_all()
            self.smtp.stop()
        with contextlib.suppress(Exception):
            self.api.stop()
