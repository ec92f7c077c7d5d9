"""The second workflow of docs/journal.md, run as printed: if the example breaks, this fails.

The block is taken from the page and executed, then driven the way the page says to drive it
(``fulfil``, then ``sweep``) through three kills, on Valkey and on fakeredis. A kill is a
``BaseException`` raised where the process would die: no handler of the journal's runs, so the
lease and any effect claim stay behind exactly as a kill -9 leaves them. A movable clock stands
in for the cooling-off day; leases and effect claims expire in real time, as on a server.

The slow test kills real processes running the block (SIGKILL, mid-map and after the provider
took the money) with the page's own 30 s lease and charge timeout: each resume starts at once,
because the dead holder is provably gone.
"""

from __future__ import annotations

import ast
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

import journal as journal_package
from journal import Effect, Journal, Keyspace, ManualClock, Settings
from journal._schema.keys import RunKeys
from journal.errors import LeaseBusy
from tests.support import ROOT, ThrowawayValkeys, as_text

PAGE = ROOT / "docs" / "journal.md"
HEADING = "## A second workflow: order fulfilment"
T0 = 1_800_000_000.0
LEASE_TTL = 0.5
GRACE = 0.5
CHARGE_TIMEOUT = 0.5
ORDER = "A-1001"
LINES = [{"sku": "mug", "qty": 2}, {"sku": "tea", "qty": 1}, {"sku": "lid", "qty": 1}]


def example_source() -> str:
    """The first python block under the example's heading in docs/journal.md."""
    page = PAGE.read_text(encoding="utf-8")
    assert f"\n{HEADING}\n" in page, f"docs/journal.md has no {HEADING!r} section"
    section = page.split(f"\n{HEADING}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    assert blocks, f"the {HEADING!r} section of docs/journal.md has no python block"
    return str(blocks[0])


def load_example() -> dict[str, Any]:
    """The example's names, after running its block as a module of its own."""
    namespace: dict[str, Any] = {"__name__": "docs_journal_example"}
    exec(compile(example_source(), str(PAGE), "exec"), namespace)
    return namespace


class Crash(BaseException):
    """The process dies here."""


class Provider:
    """A payment provider with idempotency keys: one charge per key, the first receipt after."""

    def __init__(self) -> None:
        self.requests: list[tuple[int, str]] = []
        self.charges: dict[str, str] = {}

    def charge(self, cents: int, idempotency_key: str) -> str:
        self.requests.append((cents, idempotency_key))
        return self.charges.setdefault(idempotency_key, f"ch_{len(self.charges) + 1}")


class FakeShop:
    """The example's ``Shop``, counting every call; ``crash_at`` names where the next kill is."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.provider = Provider()
        self.crash_at: str | None = None
        self._lock = threading.Lock()  # the map reserves from two threads

    def _called(self, name: str) -> None:
        with self._lock:
            self.calls[name] += 1
            crash = self.crash_at == name
            if crash:
                self.crash_at = None
        if crash:
            raise Crash(name)

    def load(self, order_id: str) -> dict[str, Any]:
        self._called("load")
        return {"id": order_id, "lines": LINES, "cents": 3150}

    def reserve(self, line: dict[str, Any]) -> str:
        self._called(f"reserve:{line['sku']}")
        return f"res_{line['sku']}"

    def charge(self, cents: int, *, idempotency_key: str) -> str:
        receipt = self.provider.charge(cents, idempotency_key)
        self._called("charge")  # a kill here: the provider took the money, no receipt saved
        return receipt

    def ship(self, order_id: str, reservations: list[str]) -> str:
        self._called("ship")
        return f"trk_{order_id}_{len(reservations)}"


@pytest.fixture
def example() -> dict[str, Any]:
    loaded = load_example()
    loaded["CHARGE_TIMEOUT"] = CHARGE_TIMEOUT  # the page's 30 s, shortened: waited in real time
    return loaded


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def shop_journal(store: redis.Redis, prefix: str, clock: ManualClock) -> Journal:
    settings = Settings(lease_ttl=LEASE_TTL, recovery_grace=GRACE)
    return Journal(store, keyspace=Keyspace(prefix), settings=settings, clock=clock)


@pytest.fixture
def crash_after_accepted(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], None]]:
    """Arms one kill right after an effect's receipt is saved, before its step is recorded."""
    armed = {"on": False}
    accepted = Effect.accepted

    def accept_then_die(self: Effect, receipt: Any) -> None:
        accepted(self, receipt)
        if armed["on"]:
            armed["on"] = False
            raise Crash("after accepted")

    monkeypatch.setattr(Effect, "accepted", accept_then_die)
    yield lambda: armed.update(on=True)


def recorded(journal: Journal, keys: RunKeys) -> list[str]:
    return sorted(as_text(key) for key in journal.client.hkeys(keys.steps))


def after_the_lease_expires(journal: Journal, keys: RunKeys, clock: ManualClock) -> None:
    """Wait out the dead holder's lease on the server, and move the clock past its grace."""
    deadline = time.monotonic() + 10 * LEASE_TTL
    while journal.client.exists(keys.lease):
        assert time.monotonic() < deadline, "the dead holder's lease never expired"
        time.sleep(0.05)
    clock.advance(LEASE_TTL + GRACE + 1)


def test_the_example_uses_only_the_journal_public_api() -> None:
    tree = ast.parse(example_source())
    public = set(journal_package.__all__)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("journal"):
            assert node.module in ("journal", "journal.errors"), f"{node.module} is internal"
            if node.module == "journal":
                names = {alias.name for alias in node.names}
                assert names <= public, f"not in journal.__all__: {sorted(names - public)}"
        elif isinstance(node, ast.ImportFrom):
            assert node.module, "a relative import"
            assert node.module.split(".")[0] in sys.stdlib_module_names, node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                assert alias.name.split(".")[0] in sys.stdlib_module_names, alias.name


def test_the_example_survives_three_kills_and_charges_once(
    example: dict[str, Any],
    shop_journal: Journal,
    clock: ManualClock,
    crash_after_accepted: Callable[[], None],
) -> None:
    fulfil, sweep = example["fulfil"], example["sweep"]
    journal, shop = shop_journal, FakeShop()
    keys = journal.keys(example["WORKFLOW"], ORDER)

    # Killed with the third reservation in flight: the first two were recorded in item order.
    shop.crash_at = "reserve:lid"
    with pytest.raises(Crash):
        fulfil(journal, shop, ORDER)
    assert recorded(journal, keys) == ["load", "reserve:mug", "reserve:tea"]
    assert journal.meta(keys)["status"] == "running"
    with pytest.raises(LeaseBusy):  # the holder is this very process: alive, so it is waited for
        fulfil(journal, shop, ORDER)
    assert sweep(journal, shop) == []  # not due before its lease expiry plus the grace

    # The sweep resumes it; killed again after the provider took the money, before the receipt.
    after_the_lease_expires(journal, keys, clock)
    shop.crash_at = "charge"
    with pytest.raises(Crash):
        sweep(journal, shop)
    assert shop.provider.charges == {"order-A-1001-charge": "ch_1"}

    # The next holder repeats the charge under the same key; killed right after the receipt.
    after_the_lease_expires(journal, keys, clock)
    crash_after_accepted()
    with pytest.raises(Crash):
        sweep(journal, shop)
    assert "charge" not in recorded(journal, keys)

    # The receipt is handed over: no request to the provider; the run sleeps for a day.
    after_the_lease_expires(journal, keys, clock)
    slept_at = clock.now()
    [waiting] = sweep(journal, shop)
    assert (waiting.status, waiting.wait.kind if waiting.wait else None) == ("waiting", "sleep")
    assert waiting.wait is not None and waiting.wait.until == slept_at + example["COOLING_OFF"]
    assert journal.client.exists(keys.lease) == 0  # no worker holds it while it sleeps
    assert sweep(journal, shop) == []  # nothing due before the wake-up

    clock.advance(example["COOLING_OFF"])
    [done] = sweep(journal, shop)
    assert (done.status, done.result) == ("done", {"payment": "ch_1", "tracking": "trk_A-1001_3"})
    assert fulfil(journal, shop, ORDER).status == "already-done"

    assert shop.calls == {
        "load": 1,
        "reserve:mug": 1,
        "reserve:tea": 1,
        "reserve:lid": 2,  # the one in flight at the first kill
        "charge": 2,  # the one the second kill interrupted, and its repeat
        "ship": 1,
    }
    assert shop.provider.requests == [(3150, "order-A-1001-charge")] * 2
    assert shop.provider.charges == {"order-A-1001-charge": "ch_1"}
    assert recorded(journal, keys) == [
        "charge",
        "load",
        "reserve:lid",
        "reserve:mug",
        "reserve:tea",
        "ship",
        "sleep:cooling-off",
    ]


class RedisShop:
    """The example's ``Shop`` for processes: calls and charges kept in Redis, so they outlive a
    kill; at the call named ``kill_at`` the process SIGKILLs itself."""

    def __init__(self, client: redis.Redis, prefix: str, kill_at: str = "") -> None:
        self.client = client
        self.calls = f"{prefix}:shop:calls"
        self.charges = f"{prefix}:shop:charges"
        self.requests = f"{prefix}:shop:requests"
        self.kill_at = kill_at

    def _called(self, name: str) -> None:
        self.client.hincrby(self.calls, name, 1)
        if name == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def load(self, order_id: str) -> dict[str, Any]:
        self._called("load")
        return {"id": order_id, "lines": LINES, "cents": 3150}

    def reserve(self, line: dict[str, Any]) -> str:
        self._called(f"reserve:{line['sku']}")
        return f"res_{line['sku']}"

    def charge(self, cents: int, *, idempotency_key: str) -> str:
        self.client.rpush(self.requests, f"{cents}:{idempotency_key}")
        self.client.hsetnx(self.charges, idempotency_key, f"ch_{os.getpid()}")
        self._called("charge")
        return as_text(self.client.hget(self.charges, idempotency_key))

    def ship(self, order_id: str, reservations: list[str]) -> str:
        self._called("ship")
        return f"trk_{order_id}_{len(reservations)}"


# One process running the page's block until the shop kills it.
HOLDER = """
import sys
import redis
from journal import Journal, Keyspace
from tests.journal.test_docs_example import RedisShop, load_example
socket, prefix, kill_at, order = sys.argv[1:]
client = redis.Redis(unix_socket_path=socket)
example = load_example()
shop = RedisShop(client, prefix, kill_at)
example["fulfil"](Journal(client, keyspace=Keyspace(prefix)), shop, order)
sys.exit("not killed")
"""


@pytest.mark.slow
def test_killed_processes_are_taken_over_at_once_with_the_page_s_own_timeouts(
    throwaway_valkeys: ThrowawayValkeys, prefix: str
) -> None:
    sock = throwaway_valkeys.start("--appendonly", "no")
    client = redis.Redis(unix_socket_path=str(sock))
    example = load_example()
    assert (example["CHARGE_TIMEOUT"], Settings().lease_ttl) == (30.0, 30.0)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    for kill_at in ("reserve:lid", "charge"):
        holder = subprocess.run(
            [sys.executable, "-c", HOLDER, str(sock), prefix, kill_at, ORDER],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert holder.returncode == -signal.SIGKILL, holder.stderr
    clock = ManualClock(time.time())
    journal = Journal(client, keyspace=Keyspace(prefix), clock=clock)
    shop = RedisShop(client, prefix)
    waiting = example["fulfil"](journal, shop, ORDER)
    # Two leases of 30 s and a charge claim of 30 s left behind, none waited for.
    assert time.monotonic() - started < 20
    assert waiting.status == "waiting"
    clock.advance(example["COOLING_OFF"])
    [done] = example["sweep"](journal, shop)
    assert done.status == "done"
    [charge] = client.hvals(shop.charges)
    assert done.result == {"payment": as_text(charge), "tracking": "trk_A-1001_3"}
    calls = {as_text(k): int(v) for k, v in client.hgetall(shop.calls).items()}
    # tea is recorded after mug, once its turn comes: it may still be on its way to Redis when
    # lid, started on mug's freed thread, kills the process (a map loses at most `concurrency`).
    assert calls.pop("reserve:tea") in (1, 2)
    assert calls == {"load": 1, "reserve:mug": 1, "reserve:lid": 2, "charge": 2, "ship": 1}
    assert client.lrange(shop.requests, 0, -1) == [b"3150:order-A-1001-charge"] * 2
