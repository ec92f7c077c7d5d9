"""The campaign's Valkey faults: one server at a time, however the kills fall.

A kill that comes while Valkey is already down, its restart still due, must not schedule a
restart of its own: the second restart would start a second server on the same socket and
AOF while the first still serves the clients that reached it, and the deployment (and the
monitor) would read two diverging stores from then on.
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.chaos.campaign import Campaign, Timeline


class FakeProcess:
    """A server process: alive until killed."""

    def __init__(self) -> None:
        self.alive = True

    def poll(self) -> int | None:
        return None if self.alive else -9


class FakeValkey:
    """Counts the servers alive at once; the campaign's kill and restart act on it."""

    def __init__(self) -> None:
        self.process: FakeProcess | None = FakeProcess()
        self.servers = [self.process]

    def kill(self) -> None:
        if self.process is not None:
            self.process.alive = False

    def start(self) -> None:
        self.process = FakeProcess()
        self.servers.append(self.process)

    def alive(self) -> int:
        return sum(server.alive for server in self.servers)


def test_a_kill_while_valkey_is_down_does_not_start_a_second_server(tmp_path: Path) -> None:
    campaign = Campaign(61206, 60.0, tmp_path / "seed")
    valkey = FakeValkey()
    campaign.stack.valkey = valkey  # type: ignore[assignment]
    campaign.timeline = Timeline(tmp_path / "timeline.jsonl", time.time())
    try:
        campaign._on_kill_valkey(0.2)  # down for a while, its restart due later
        campaign._on_kill_valkey(0.05)  # while it is down: nothing more to kill
        deadline = time.time() + 5
        while campaign._later and time.time() < deadline:
            campaign._run_due(until=time.time())
            time.sleep(0.01)
        for pending in campaign._pending:
            pending.result(timeout=5)
    finally:
        campaign._pool.shutdown(wait=True)
        campaign.timeline.close()

    assert valkey.alive() == 1
    assert len(valkey.servers) == 2  # the first, and one restart
