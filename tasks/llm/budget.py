"""A run's model budget (``DIGEST_MAX_COST_USD``), reserved before each call, settled after.

Before a call, its estimated cost (the prompt's estimated tokens at the input price, plus
``max_tokens`` at the output price) is reserved in the run's usage hash by one script that
reads the spend and the reservations in flight and adds its own only if all of them fit the
budget. After the call, the reservation is replaced by the call's priced usage. Calls in
flight together therefore cannot all count on the same money: a run's spend exceeds its
budget only by what the calls in flight cost beyond their estimates, and the output part of an
estimate is an upper bound (the API never writes more than ``max_tokens``), so only the input
estimate can be short (a prompt that tokenizes denser than ``prompts.estimated_tokens``
reckons).

A call that does not fit while others are in flight waits for them to settle (they usually
cost far less than they reserved), then asks again; one that does not fit even if they cost
nothing stops the run with ``BudgetExceeded``. A reservation nobody settles (its process died
mid-call) lapses after the call's time limit and a margin, unless its process is proved gone
sooner: each reservation records its process (``journal.ProcessIdentity``), and a call that
finds no room asks whether the holders of the others still exist; the money of one that is
provably gone (on this host: no such process, a zombie, a reused pid) is returned at once, as
the journal hands a dead holder's lease over at once.

A Message Batch is reserved as a whole before it is created (``reserve_batch``: its
requests' estimates at batch prices, under the creation's name, held until the batch could
have expired), and settled once from its results' journaled costs (``settle_batch``, which a
replay repeats harmlessly). Its items asked synchronously after all reserve call by call.

The spend lives in the run's usage hash (``StoreLedger``), started from the journal's recorded
costs the first time a run reserves (a run begun before the hash existed, or a fork, counts
what its journal already paid for), then counted call by call: a call made again after a crash
is paid again. A rehearsal (``digest fork --dry-run``) counts in a ``Tally`` in memory instead:
its calls are checked against the budget the fork would have and their cost is reported, but
nothing that lasts is charged, so previews never use up the run's budget.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol, cast

from journal import Client, ProcessIdentity, Record, RunKeys, send_with_record
from tasks.config.prices import PriceTable
from tasks.llm.cost import BudgetExceeded, is_call
from tasks.scripts import script

NANO = 1_000_000_000
# How often a call that waits for others to settle asks again.
POLL_S = 0.05
# A reservation outlives its call's time limit by this much before it lapses.
LAPSE_MARGIN_S = 30.0
# A batch's reservation holds until the batch could have expired (24 h), and a margin.
BATCH_LAPSE_S = 25 * 3600.0


def _nanodollars(amount: float) -> int:
    return math.ceil(amount * NANO)


def journaled_spend(run: str, steps: Mapping[bytes, bytes] | Mapping[str, bytes]) -> float:
    """The cost of every call a run's steps hash records (where a run's spend starts)."""
    total = 0.0
    for key, raw in steps.items():
        result = Record.decode(run, key if isinstance(key, str) else key.decode(), raw).result
        if is_call(result) and result.get("cost_usd") is not None:
            total += float(result["cost_usd"])
    return total


class Ledger(Protocol):
    """Where a budget keeps its spend and its holds, in nanodollars."""

    def reserve(
        self, usage: str, hold: str, amount: int, limit: int | None, lapse_ms: int, seed: str
    ) -> tuple[int, int]:
        """Hold ``amount`` as ``hold`` if it fits ``limit``: (status, spent), as the script's."""
        ...

    def settle(self, usage: str, hold: str, cost: int, *, with_record: bool = False) -> None:
        """Let go of ``hold`` and count ``cost`` as spent (with the step's record, if asked)."""
        ...

    def settle_batch(self, usage: str, step: str, cost: int) -> bool:
        """Turn the holds of ``step``'s batches into ``cost`` spent, once; whether it did."""
        ...


class StoreLedger:
    """The run's usage hash: shared by every process working on the run, lasting with it."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._reserve = script(client, "budget_reserve")
        self._settle = script(client, "budget_settle")
        self._settle_call = script(client, "budget_settle_call")

    def reserve(
        self, usage: str, hold: str, amount: int, limit: int | None, lapse_ms: int, seed: str
    ) -> tuple[int, int]:
        """One reservation script; when it finds no room, again without holders proved gone."""
        assert limit is not None, "the store counts only under a budget"
        me = ProcessIdentity.current()
        args: list[str | int | bytes] = [hold, amount, limit, lapse_ms, seed, me.encode()]
        status, spent, _ = self._reserve(keys=[usage], args=args)
        if int(status) == 0:
            gone = self._gone_holds(usage, me)
            if gone:
                status, spent, _ = self._reserve(keys=[usage], args=[*args, *gone])
        return int(status), int(spent)

    def _gone_holds(self, usage: str, me: ProcessIdentity) -> list[bytes]:
        """The values of the holds whose processes ``me`` can prove have ended.

        Read only when a call finds no room: a run that fits its budget never pays for it.
        The script drops a hold only while it still has the value read here, so a hold taken
        over meanwhile (a batch's, reserved again under its name by a live process) stays.
        """
        held = cast(dict[bytes, bytes], self.client.hgetall(usage))
        gone = []
        for name, value in held.items():
            parts = value.split(b":", 2)
            if name.startswith(b"r:") and len(parts) == 3:
                holder = ProcessIdentity.decode(parts[2])
                if holder is not None and holder.provably_gone(me):
                    gone.append(value)
        return gone

    def settle(self, usage: str, hold: str, cost: int, *, with_record: bool = False) -> None:
        """``budget_settle_call.lua``: the hold dropped and the cost counted, together.

        ``with_record``: in the round trip of the record of the step that made the call (at
        once if no step's body is running); else at once.
        """
        if with_record:
            send_with_record(self._settle_call, [usage], [hold, cost])
        else:
            self._settle_call(keys=[usage], args=[hold, cost])

    def settle_batch(self, usage: str, step: str, cost: int) -> bool:
        """``budget_settle.lua``: once per step, and only over holds of its batches."""
        return bool(int(self._settle(keys=[usage], args=[step, f"batch-{step}-", cost])))


@dataclass
class Tally:
    """A rehearsal's ledger, in this process only, reported and then forgotten.

    Attributes:
        spent: what the rehearsed run has spent, nanodollars: its kept steps' calls, then
            the rehearsal's.
        charged: what the rehearsal's own calls cost, nanodollars.
    """

    spent: int
    charged: int = 0
    holds: dict[str, int] = field(default_factory=dict)
    settled: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def starting_at(cls, dollars: float) -> Tally:
        """A tally whose run has spent ``dollars`` already."""
        return cls(_nanodollars(dollars))

    @property
    def charged_usd(self) -> float:
        """What the rehearsal's calls cost, in dollars."""
        return self.charged / NANO

    def reserve(
        self, usage: str, hold: str, amount: int, limit: int | None, lapse_ms: int, seed: str
    ) -> tuple[int, int]:
        """The script's answer, from memory: nothing lapses, every hold is this process's."""
        with self.lock:
            others = sum(held for name, held in self.holds.items() if name != hold)
            if limit is not None and self.spent + amount > limit:
                return -1, self.spent
            if limit is not None and self.spent + others + amount > limit:
                return 0, self.spent
            self.holds[hold] = amount
            return 1, self.spent

    def settle(self, usage: str, hold: str, cost: int, *, with_record: bool = False) -> None:
        """Count the cost, in memory."""
        with self.lock:
            self.holds.pop(hold, None)
            self.spent += cost
            self.charged += cost

    def settle_batch(self, usage: str, step: str, cost: int) -> bool:
        """As ``budget_settle.lua`` does: once per step, and only over holds of its batches."""
        prefix = f"batch-{step}-"
        with self.lock:
            held = [name for name in self.holds if name.startswith(prefix)]
            if step in self.settled or not held:
                return False
            for name in held:
                del self.holds[name]
            self.settled.add(step)
            self.spent += cost
            self.charged += cost
            return True


@dataclass
class Reservation:
    """One call's hold on the budget; ``settle`` replaces it with what the call cost."""

    budget: Budget
    usage_key: str
    id: str
    amount: float
    settled: bool = False

    def settle(self, cost: float, *, with_record: bool = False) -> None:
        """Count ``cost`` as spent and let go of the hold (its estimate).

        ``with_record`` defers it to the step's record round trip: for the call's answer, not
        for a failed call's release, which a fallback's reservation in the same step must see.
        """
        self.settled = True
        self.budget.ledger.settle(
            self.usage_key, self.id, _nanodollars(cost), with_record=with_record
        )


class Budget:
    """The budget of every run in this process: one limit, one price table, one ledger.

    Args:
        ledger: where the spend and the holds are kept: the run's usage hash
            (``StoreLedger``), or a rehearsal's ``Tally``.
        limit: ``DIGEST_MAX_COST_USD``; None reserves nothing (a tally still counts).
        prices: the table estimates are priced with.
        call_timeout: how long one call may take, its wait for rate-limit room included, so
            a reservation lapses after it.
        sleep: how a call waits for others to settle (tests may pass their own).
    """

    def __init__(
        self,
        ledger: Ledger,
        limit: float | None,
        prices: PriceTable,
        call_timeout: float,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.ledger = ledger
        self.limit = limit
        self.prices = prices
        self.lapse_ms = int((call_timeout + LAPSE_MARGIN_S) * 1000)
        self._sleep = sleep
        # A tally counts with no limit too: a rehearsal reports what its calls cost.
        self.counting = limit is not None or isinstance(ledger, Tally)

    def estimate(
        self, model: str, input_tokens: int, max_tokens: int, *, batch: bool = False
    ) -> float:
        """What a call may cost at most, give or take the input estimate; 0 if unpriced.

        An unpriced model cannot be budgeted; the configuration refuses a budget over one.
        """
        return self.prices.cost(model, input_tokens, max_tokens, batch=batch) or 0.0

    def reserve_batch(self, keys: RunKeys, name: str, estimate: float) -> None:
        """Hold ``estimate`` for the batch created as ``name`` until ``settle_batch``.

        Held again under the same name (a creation repeated after a crash), it is replaced.

        Raises:
            BudgetExceeded: the batch does not fit even if every call in flight is free.
        """
        if not self.counting:
            return
        held = Reservation(self, keys.usage, name, estimate)
        self._wait_for_room(keys, name, held, lapse_ms=int(BATCH_LAPSE_S * 1000))

    def settle_batch(self, keys: RunKeys, step: str, cost: float) -> bool:
        """Replace the holds of ``step``'s batches by what their results cost, once.

        With no hold to replace (a fork replaying batches its source paid for: its spend was
        started from the journal, those costs included) nothing is counted.

        Returns:
            Whether it settled now (False: settled before, nothing held, or no budget).
        """
        if not self.counting:
            return False
        return self.ledger.settle_batch(keys.usage, step, _nanodollars(cost))

    @contextmanager
    def hold(self, keys: RunKeys, step: str, estimate: float) -> Iterator[Reservation | None]:
        """Reserve ``estimate`` for one call; the caller settles it with the call's cost.

        A call that ends in an error is released at no cost (an error answer is not billed),
        unless it was settled before the error.

        Yields:
            The reservation, or None when the run has no budget.

        Raises:
            BudgetExceeded: the estimate does not fit even if every call in flight is free.
        """
        if not self.counting:
            yield None
            return
        reservation = Reservation(self, keys.usage, uuid.uuid4().hex, estimate)
        self._wait_for_room(keys, step, reservation)
        try:
            yield reservation
        finally:
            if not reservation.settled:
                reservation.settle(0.0)

    def _wait_for_room(
        self, keys: RunKeys, step: str, reservation: Reservation, lapse_ms: int | None = None
    ) -> None:
        limit = None if self.limit is None else int(self.limit * NANO)
        seed = ""
        while True:
            status, spent = self.ledger.reserve(
                keys.usage,
                reservation.id,
                _nanodollars(reservation.amount),
                limit,
                self.lapse_ms if lapse_ms is None else lapse_ms,
                seed,
            )
            if status == 1:
                return
            if status == -1 and self.limit is not None:
                raise BudgetExceeded(keys.run, spent / NANO, self.limit, step)
            if status == -2:
                seed = str(_nanodollars(self.recorded_spend(keys)))
            elif status == 0:
                self._sleep(POLL_S)
            else:
                raise RuntimeError(f"budget_reserve.lua answered an unknown status {status!r}")

    def recorded_spend(self, keys: RunKeys) -> float:
        """The cost of every call the run's journal records (the start of its usage hash)."""
        assert isinstance(self.ledger, StoreLedger), "a tally starts from its own spend"
        steps = cast(dict[bytes, bytes], self.ledger.client.hgetall(keys.steps))
        return journaled_spend(keys.run, steps)
