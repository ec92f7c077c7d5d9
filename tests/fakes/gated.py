"""A fake Anthropic API that holds chosen calls open: for zombies and outages mid-call."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping

import pytest

from tests.fakes.anthropic_server import FakeAnthropic, default_reply


class GatedFake(FakeAnthropic):
    """The fake API, holding chosen calls open until their gate opens.

    A call is chosen by its arrival number, or as the first whose prompt names something (an
    item's title: with several calls in flight, arrival numbers do not say which item is
    which). Every answer names its call (``summary of Dark mode (call 1)``), so a record shows
    which attempt's answer it holds. Unlike ``hold()``, which holds every call, a gate holds one.
    """

    def __init__(self) -> None:
        super().__init__(reply=lambda request: f"{default_reply(request)} (call {request.number})")
        self._gates: dict[int, threading.Event] = {}
        self._first_gates: list[tuple[str, threading.Event]] = []

    def gate(self, number: int) -> threading.Event:
        """Hold call ``number`` (its answer already chosen) until the event is set."""
        event = threading.Event()
        self._gates[number] = event
        return event

    def gate_first(self, contains: str) -> threading.Event:
        """Hold the first call whose prompt contains ``contains`` until the event is set.

        Later calls containing it are answered at once: the call a resumed run makes again
        for the same item goes through.
        """
        event = threading.Event()
        with self._lock:
            self._first_gates.append((contains, event))
        return event

    def respond(
        self, path: str, headers: Mapping[str, str], raw: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        status, answer_headers, payload = super().respond(path, headers, raw)
        number = int(answer_headers.get("request-id", "req_fake_0").removeprefix("req_fake_"))
        gate = self._gates.get(number) or self._first_gate(number)
        if gate is not None:
            gate.wait(60)
        return status, answer_headers, payload

    def _first_gate(self, number: int) -> threading.Event | None:
        """The text gate call ``number`` is the first to match, taken so no later call does."""
        if number < 1:
            return None
        text = self.requests[number - 1].text
        with self._lock:
            for index, (contains, event) in enumerate(self._first_gates):
                if contains in text:
                    del self._first_gates[index]
                    self._gates[number] = event
                    return event
        return None

    def stop(self) -> None:
        for gate in list(self._gates.values()):
            gate.set()
        with self._lock:
            for _, event in self._first_gates:
                event.set()
        super().stop()


@pytest.fixture
def gated_fake() -> Iterator[GatedFake]:
    fake = GatedFake()
    fake.start()
    try:
        yield fake
    finally:
        fake.stop()
