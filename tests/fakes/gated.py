"""A fake Anthropic API that holds chosen calls open: for zombies and outages mid-call."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping

import pytest

from tests.fakes.anthropic_server import FakeAnthropic, default_reply


class GatedFake(FakeAnthropic):
    """The fake API, holding chosen calls (by arrival number) open until their gate opens.

    Every answer names its call (``summary of Dark mode (call 1)``), so a record shows which
    attempt's answer it holds. Unlike ``hold()``, which holds every call, a gate holds one.
    """

    def __init__(self) -> None:
        super().__init__(reply=lambda request: f"{default_reply(request)} (call {request.number})")
        self._gates: dict[int, threading.Event] = {}

    def gate(self, number: int) -> threading.Event:
        """Hold call ``number`` (its answer already chosen) until the event is set."""
        event = threading.Event()
        self._gates[number] = event
        return event

    def respond(
        self, path: str, headers: Mapping[str, str], raw: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        status, answer_headers, payload = super().respond(path, headers, raw)
        number = int(answer_headers.get("request-id", "req_fake_0").removeprefix("req_fake_"))
        gate = self._gates.get(number)
        if gate is not None:
            gate.wait(60)
        return status, answer_headers, payload

    def stop(self) -> None:
        for gate in self._gates.values():
            gate.set()
        super().stop()


@pytest.fixture
def gated_fake() -> Iterator[GatedFake]:
    fake = GatedFake()
    fake.start()
    try:
        yield fake
    finally:
        fake.stop()
