"""A real SMTP server on loopback (aiosmtpd) that keeps what it accepts."""

from __future__ import annotations

import asyncio
import email
import email.policy
from email.message import EmailMessage
from typing import Any

from aiosmtpd.controller import Controller


class Inbox:
    """An SMTP handler that keeps every message it accepts."""

    def __init__(self, refuse: frozenset[str] = frozenset()) -> None:
        self.refuse = refuse
        self.messages: list[EmailMessage] = []

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, options: list[str]
    ) -> str:
        if address in self.refuse:
            return "550 5.1.1 no such user"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        parsed = email.message_from_bytes(envelope.content, policy=email.policy.default)
        assert isinstance(parsed, EmailMessage)
        self.messages.append(parsed)
        return "250 Message accepted for delivery"


class LoopbackController(Controller):
    """aiosmtpd on a port the kernel picks: it probes `self.port`, so learn it first."""

    def _trigger_server(self) -> None:
        assert isinstance(self.server, asyncio.Server)
        self.port = self.server.sockets[0].getsockname()[1]
        super()._trigger_server()  # type: ignore[no-untyped-call]


def start_server(inbox: Inbox, **kwargs: Any) -> LoopbackController:
    controller = LoopbackController(inbox, hostname="127.0.0.1", port=0, **kwargs)
    controller.start()
    return controller
