"""A real SMTP server on loopback (aiosmtpd) that keeps what it accepts.

It also records what a client revealed: every login attempt, password included (as the
server sees it, after TLS), and whether each accepted message came over TLS.
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import socket
import threading
from collections.abc import Iterator
from email.message import EmailMessage
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, LoginPassword, syntax


class Inbox:
    """An SMTP handler that keeps every message it accepts.

    Args:
        refuse: recipients answered with 550.
        login: the one (user, password) accepted; with it, pass ``authenticator=inbox.login``
            to ``start_server``.
        dedup_header: as a deduplicating relay (Resend's, on ``Resend-Idempotency-Key``): a
            message whose value of this header was seen before is answered 250 and dropped.
    """

    def __init__(
        self,
        refuse: frozenset[str] = frozenset(),
        login: tuple[bytes, bytes] | None = None,
        dedup_header: str | None = None,
    ) -> None:
        self.refuse = refuse
        self.dedup_header = dedup_header
        self.dropped: list[EmailMessage] = []
        self.messages: list[EmailMessage] = []
        self.over_tls: list[bool] = []
        self.logins: list[tuple[bytes, bytes]] = []
        self.recipients: list[str] = []
        self._login = login
        self._holds: dict[str, tuple[threading.Event, threading.Event]] = {}

    def hold(self, phase: str) -> tuple[threading.Event, threading.Event]:
        """Hold the next session's reply at ``phase`` until released: (reached, release).

        ``EHLO``: the client is connected, its session not yet started; ``RCPT``: the
        recipient is taken, DATA not yet begun; ``DATA-COMMAND``: the client asked to send the
        content (it has confirmed its lease), not yet told to go on; ``DATA``: the message is
        taken (it counts as delivered), the client not yet told. Later sessions pass freely.
        """
        held = (threading.Event(), threading.Event())
        self._holds[phase] = held
        return held

    def release_all(self) -> None:
        """Let every held reply go."""
        for _, release in self._holds.values():
            release.set()

    async def pause(self, phase: str) -> None:
        held = self._holds.get(phase)
        if held is None or held[0].is_set():
            return
        reached, release = held
        reached.set()
        while not release.is_set():  # polled: a blocking wait would stall every session
            await asyncio.sleep(0.01)

    async def handle_EHLO(
        self, server: Any, session: Any, envelope: Any, hostname: str, responses: list[str]
    ) -> list[str]:
        await self.pause("EHLO")
        session.host_name = hostname
        return responses

    def authenticator(
        self, server: Any, session: Any, envelope: Any, mechanism: str, data: Any
    ) -> AuthResult:
        assert isinstance(data, LoginPassword)
        self.logins.append((data.login, data.password))
        # handled=False: the server, not this callback, answers 535 on a failure.
        return AuthResult(success=(data.login, data.password) == self._login, handled=False)

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, options: list[str]
    ) -> str:
        if address in self.refuse:
            return "550 5.1.1 no such user"
        envelope.rcpt_tos.append(address)
        self.recipients.append(address)
        await self.pause("RCPT")
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        parsed = email.message_from_bytes(envelope.content, policy=email.policy.default)
        assert isinstance(parsed, EmailMessage)
        header = self.dedup_header
        key = None if header is None else parsed[header]
        if header is not None and key is not None and any(m[header] == key for m in self.messages):
            self.dropped.append(parsed)
            await self.pause("DATA")
            return "250 Message accepted for delivery"
        self.messages.append(parsed)
        # session.ssl is set by STARTTLS; an implicit TLS transport says so itself.
        implicit = server.transport.get_extra_info("ssl_object") is not None
        self.over_tls.append(session.ssl is not None or implicit)
        await self.pause("DATA")
        return "250 Message accepted for delivery"


class _HoldingSMTP(SMTP):
    """aiosmtpd's session, able to hold its answer to the DATA command itself."""

    @syntax("DATA")
    async def smtp_DATA(self, arg: str) -> None:
        handler = self.event_handler
        if isinstance(handler, Inbox):
            await handler.pause("DATA-COMMAND")
        await super().smtp_DATA(arg)


class LoopbackController(Controller):
    """aiosmtpd on a port the kernel picks, or on a socket the test holds (``sock=``).

    It probes ``self.port`` once started, so the port is learnt from the server first.
    """

    def __init__(self, *args: Any, sock: socket.socket | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sock = sock

    def factory(self) -> SMTP:
        return _HoldingSMTP(self.handler, **self.SMTP_kwargs)

    def _create_server(self) -> Any:
        if self._sock is None:
            return super()._create_server()
        return self.loop.create_server(self._factory_invoker, sock=self._sock, ssl=self.ssl_context)

    def _trigger_server(self) -> None:
        assert isinstance(self.server, asyncio.Server)
        self.port = self.server.sockets[0].getsockname()[1]
        super()._trigger_server()  # type: ignore[no-untyped-call]  # aiosmtpd: unannotated


def start_server(inbox: Inbox, **kwargs: Any) -> LoopbackController:
    """Serve ``inbox`` on 127.0.0.1; ``ssl_context=`` for implicit TLS, ``tls_context=`` for
    STARTTLS, ``authenticator=inbox.authenticator`` for logins (other aiosmtpd options too)."""
    controller = LoopbackController(inbox, hostname="127.0.0.1", port=0, **kwargs)
    controller.start()
    return controller


@pytest.fixture
def inbox() -> Iterator[tuple[Inbox, str]]:
    """A real SMTP server on loopback and its URL; it refuses ``nobody@example.com``."""
    handler = Inbox(refuse=frozenset({"nobody@example.com"}))
    controller = start_server(handler)
    yield handler, f"smtp://127.0.0.1:{controller.port}"
    handler.release_all()
    controller.stop()
