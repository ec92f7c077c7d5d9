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
mid-call) lapses after the call's time limit and a margin.

A Message Batch is reserved as a whole before it is created (``reserve_batch``: its
requests' estimates at batch prices, under the creation's name, held until the batch could
have expired), and settled once from its results' journaled costs (``settle_batch``, which a
replay repeats harmlessly). Its items asked synchronously after all reserve call by call.

The spend lives in the run's usage hash, started from the journal's recorded costs the first
time a run reserves (a run begun before the hash existed, or a fork, counts what its journal
already paid for), then counted call by call: a call made again after a crash is paid again.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import cast

from journal import Client, Record, RunKeys
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


@dataclass
class Reservation:
    """One call's hold on the budget; ``settle`` replaces it with what the call cost."""

    budget: Budget
    usage_key: str
    id: str
    amount: float
    settled: bool = False

    def settle(self, cost: float) -> None:
        """Count ``cost`` as spent and let go of the hold (its estimate)."""
        self.settled = True
        pipe = self.budget.client.pipeline(transaction=True)
        pipe.hdel(self.usage_key, f"r:{self.id}")
        pipe.hincrby(self.usage_key, "spent", _nanodollars(cost))
        pipe.execute()


class Budget:
    """The budget of every run in this process: one limit, one price table, one store.

    Args:
        client: the journal's store (the usage hash lives in the run's slot).
        limit: ``DIGEST_MAX_COST_USD``; None reserves nothing.
        prices: the table estimates are priced with.
        call_timeout: how long one call may take, its wait for rate-limit room included, so
            a reservation lapses after it.
        sleep: how a call waits for others to settle (tests may pass their own).
    """

    def __init__(
        self,
        client: Client,
        limit: float | None,
        prices: PriceTable,
        call_timeout: float,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client = client
        self.limit = limit
        self.prices = prices
        self.lapse_ms = int((call_timeout + LAPSE_MARGIN_S) * 1000)
        self._sleep = sleep
        self._reserve = script(client, "budget_reserve")
        self._settle = script(client, "budget_settle")

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
        if self.limit is None:
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
        if self.limit is None:
            return False
        reply = self._settle(keys=[keys.usage], args=[step, f"batch-{step}-", _nanodollars(cost)])
        return bool(int(reply))

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
        if self.limit is None:
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
        assert self.limit is not None
        seed = ""
        while True:
            status, spent, _ = self._reserve(
                keys=[keys.usage],
                args=[
                    reservation.id,
                    _nanodollars(reservation.amount),
                    int(self.limit * NANO),
                    self.lapse_ms if lapse_ms is None else lapse_ms,
                    seed,
                ],
            )
            if status == 1:
                return
            if status == -1:
                raise BudgetExceeded(keys.run, int(spent) / NANO, self.limit, step)
            if status == -2:
                seed = str(_nanodollars(self.recorded_spend(keys)))
            elif status == 0:
                self._sleep(POLL_S)
            else:
                raise RuntimeError(f"budget_reserve.lua answered an unknown status {status!r}")

    def recorded_spend(self, keys: RunKeys) -> float:
        """The cost of every call the run's journal records (the start of its usage hash)."""
        steps = cast(dict[bytes, bytes], self.client.hgetall(keys.steps)).items()
        results = [Record.decode(keys.run, key.decode(), raw).result for key, raw in steps]
        return sum(
            float(r["cost_usd"]) for r in results if is_call(r) and r.get("cost_usd") is not None
        )
