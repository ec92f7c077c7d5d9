"""The engine of ``Run.batch``: a provider batch as one durable step (see ``journal.batch``).

Apart from the operators' views of ``journal.batch`` so that the run, which offers the step,
and the handle, which those views take, are not imported by the engine they both use.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from journal._batch_state import (
    UNANSWERED,
    BatchApi,
    BatchEntry,
    BatchPolicy,
    BatchState,
    cancel_key,
    custom_id,
    effect_key,
    look_key,
    plan_key,
)
from journal._cancel import Cancelled
from journal._clock import Clock
from journal._effects import Effect
from journal._redis.backend import StepStore
from journal._replay import ReplayCursor
from journal._retry import RetryPolicy
from journal._retry import attempt as retry_loop
from journal._schema.keys import RunKeys
from journal._schema.meta import Wait
from journal._schema.steps import StepKey
from journal._waits import Suspend
from journal.errors import one_line

log = logging.getLogger(__name__)

X = TypeVar("X")
T = TypeVar("T")


class BatchRun(Protocol):
    """What a batch step uses of its run (``journal._run.Run``, which passes itself).

    Named here so that the run, which offers ``Run.batch``, and this engine need not import
    each other: the engine replays and records through the run's own cursor and steps.
    """

    keys: RunKeys
    clock: Clock
    _cursor: ReplayCursor
    _backend: StepStore
    _retry_state: Wait | None

    def effect(
        self,
        key: str,
        fn: Callable[[Effect], T],
        *,
        timeout: float,
        repeatable: bool = False,
        revocable: bool = False,
    ) -> T: ...

    def map(
        self,
        prefix: str,
        items: Sequence[X],
        fn: Callable[[X], T],
        *,
        key: Callable[[X], str],
        concurrency: int = 3,
        retry: RetryPolicy | None = None,
    ) -> list[T]: ...

    def check_lease(self) -> None: ...

    def _replay(self, key: str, record: dict[str, Any]) -> Any: ...

    def _execute(
        self,
        key: str,
        fn: Callable[[], T],
        retry: RetryPolicy | None,
        kind: str,
        group: str | None,
        seq: int | None = None,
        report: Callable[[Any], object] | None = None,
    ) -> T: ...


@dataclass(eq=False)
class BatchStep(Generic[X, T]):
    """One ``Run.batch`` call: its batches one after another, then the synchronous rest.

    Its working state (the step keys, what is answered) is derived from the arguments once.
    """

    run: BatchRun
    prefix: str
    items: Sequence[X]
    request: Callable[[X], Mapping[str, Any]]
    _: KW_ONLY
    key: Callable[[X], str]
    api: BatchApi
    settle: Callable[[X, BatchEntry], T]
    fallback: Callable[[X], T]
    policy: BatchPolicy
    retry: RetryPolicy | None
    concurrency: int
    reserve: Callable[[str, Sequence[X]], None] | None
    ids: list[str] = field(init=False)
    custom: list[str] = field(init=False)
    index: dict[str, int] = field(init=False)
    by_custom: dict[str, int] = field(init=False)
    steps: list[str] = field(init=False)
    results: list[Any] = field(init=False)
    done: set[int] = field(init=False, default_factory=set)
    first_at: float | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.ids = [self.key(item) for item in self.items]
        self.custom = [custom_id(item_key) for item_key in self.ids]
        if len(set(self.custom)) != len(self.custom):
            raise ValueError(f"batch {self.prefix!r}: item keys are not unique")
        self.index = {item_key: n for n, item_key in enumerate(self.ids)}
        self.by_custom = {custom: n for n, custom in enumerate(self.custom)}
        self.steps = [f"{self.prefix}:{item_key}" for item_key in self.ids]
        self.results = [None] * len(self.items)

    def __call__(self) -> list[T]:
        run = self.run
        with run._cursor.lock:
            recorded = [run._cursor.consume(step) for step in self.steps]
            run._cursor.open_group(self.prefix)
        try:
            for index, record in enumerate(recorded):
                if record is not None:
                    self.results[index] = record["result"]
                    self.done.add(index)
                    run._replay(self.steps[index], record)
            unanswered: list[int] = []
            remaining = [i for i in range(len(self.items)) if i not in self.done]
            n = 1
            while remaining or run._cursor.has(plan_key(self.prefix, n)):
                chunk = self._batch(n, remaining)
                unanswered += [i for i in chunk if i not in self.done]
                remaining = [i for i in remaining if i not in chunk]
                n += 1
            if unanswered:
                self._ask(sorted(unanswered))
        finally:
            run._cursor.close_group(self.prefix)
        return self.results

    # -- one batch ---------------------------------------------------------------------------

    def _batch(self, n: int, remaining: list[int]) -> list[int]:
        """Plan, create, await and record batch ``n``; the items it was for, by index."""
        policy = self.policy

        def plan() -> dict[str, Any]:
            now = self.run.clock.now()
            first = now if self.first_at is None else self.first_at
            late = now >= self._give_up_at(first)
            keys = [self.ids[i] for i in remaining[: policy.max_requests]]
            return {"at": now, "keys": keys, "create": not late, "first_at": first}

        planned = self._step(plan_key(self.prefix, n), plan)
        if self.first_at is None:
            self.first_at = float(planned["first_at"])
        chunk = [self.index[custom_id] for custom_id in planned["keys"]]
        if not planned["create"]:
            return chunk  # the deadline passed before it was made: asked synchronously
        state = self._create(n, planned, [i for i in chunk if i not in self.done])
        try:
            ending = self._await(n, state)
            if ending == "results" and any(i not in self.done for i in chunk):
                self._record_results(n, state, chunk)
        except Cancelled:
            self._cancel_quietly(state.id, "the run was cancelled")
            raise
        return chunk

    def _create(self, n: int, planned: Mapping[str, Any], todo: list[int]) -> BatchState:
        """The creation effect, tried again (durably) after an answer that created nothing."""
        run = self.run
        key = effect_key(self.prefix, n)
        requests = [
            {"custom_id": self.custom[i], "params": dict(self.request(self.items[i]))} for i in todo
        ]
        count = len(requests)
        since = float(planned["at"]) - self.policy.skew

        def create(effect: Effect) -> dict[str, Any]:
            if effect.earlier is not None:
                return dict(effect.earlier)
            if self.reserve is not None:
                self.reserve(key, [self.items[i] for i in todo])
            state = self._adopt(since, count) if effect.resumed else None
            if state is None:
                effect.confirm()  # the last check before a batch exists: a stale holder stops
                effect.last_moment()
                try:
                    state = self.api.create(requests)
                except Exception as error:
                    if self.api.answered(error):
                        effect.release()  # the provider refused it: nothing was created
                    raise
                run._backend.own_batch(state.id, run.keys.run, first=False)
            if effect.resumed:
                self._cancel_duplicates(since, count, state.id)
            receipt = state.to_json()
            effect.accepted(receipt)
            return receipt

        def claimed() -> dict[str, Any]:
            timeout = self.policy.create_timeout
            return run.effect(key, create, timeout=timeout, repeatable=True, revocable=True)

        _, receipt = retry_loop(
            key, claimed, self.retry, run._retry_state, run.clock, run.check_lease
        )
        return BatchState.from_json(receipt)

    def _adopt(self, since: float, count: int) -> BatchState | None:
        """The batch an earlier holder of this claim created, if one can be told: adopted."""
        run = self.run
        candidates = self._unclaimed(since, count, include_own=True)
        if not candidates:
            return None
        owners = run._backend.batch_owners([state.id for state in candidates])
        own = [state for state in candidates if owners.get(state.id) == run.keys.run]
        chosen = own[0] if own else min(candidates, key=lambda state: state.created_at)
        if run._backend.own_batch(chosen.id, run.keys.run, first=True) != run.keys.run:
            return None  # another run took it meanwhile: it was its own
        log.info("run %s: adopted batch %s, created before a crash", run.keys.run, chosen.id)
        return chosen

    def _cancel_duplicates(self, since: float, count: int, kept: str) -> None:
        """Cancel every other batch of this size since the plan that no run owns."""
        for state in self._unclaimed(since, count, include_own=False):
            if state.id != kept and not state.ended:
                self._cancel_quietly(state.id, "a duplicate of a creation that was repeated")

    def _unclaimed(self, since: float, count: int, *, include_own: bool) -> list[BatchState]:
        """Batches of ``count`` requests since ``since`` no other run owns (nor this, unless)."""
        run = self.run
        found = [
            state
            for state in self.api.recent(since)
            if state.created_at >= since and state.requests == count
        ]
        owners = run._backend.batch_owners([state.id for state in found])
        allowed = (None, run.keys.run) if include_own else (None,)
        return [state for state in found if owners.get(state.id) in allowed]

    def _await(self, n: int, state: BatchState) -> str:
        """Look until the batch has ended or been given up; how: ``results`` or ``give-up``."""
        policy = self.policy
        cancelled_at: float | None = None
        delay = policy.first_look
        k = 1
        while True:
            if cancelled_at is None:
                delay = self._before_deadline(delay)
            self._sleep(look_key(self.prefix, n, k), delay)

            def look(k: int = k, cancelled_at: float | None = cancelled_at) -> dict[str, Any]:
                return self._look(state.id, k, cancelled_at)

            looked = self._step(look_key(self.prefix, n, k), look)
            then = looked["then"]
            if then in ("results", "give-up"):
                return str(then)
            if then == "cancel":
                cancelled = self._step(
                    cancel_key(self.prefix, n), lambda: self._deadline_cancel(state.id)
                )
                cancelled_at = float(cancelled["at"])
                delay = policy.cancel_look
            else:
                delay = float(looked["delay"])
            k += 1

    def _give_up_at(self, first: float) -> float:
        """When a batch still processing is given up: the policy's deadline or ``until``."""
        policy = self.policy
        at = math.inf if policy.deadline is None else first + policy.deadline
        return at if policy.until is None else min(at, policy.until)

    def _before_deadline(self, delay: float) -> float:
        """``delay``, or less so that the run looks again as the deadline passes."""
        if self.first_at is None:
            return delay
        left = self._give_up_at(self.first_at) - self.run.clock.now()
        return max(0.0, min(delay, left))

    def _look(self, batch_id: str, k: int, cancelled_at: float | None) -> dict[str, Any]:
        """Ask the provider how the batch is; record that and what the run does next."""
        policy = self.policy
        now = self.run.clock.now()
        backoff = min(policy.first_look * 2.0**k, policy.max_look)
        try:
            state = self.api.retrieve(batch_id)
        except Exception as error:
            if self.retry is None or not self.retry.retryable(error):
                raise
            hint = self.retry.retry_after(error)
            wait = backoff if hint is None else max(backoff, min(hint, self.retry.max_retry_after))
            return {"state": None, "error": one_line(error), "then": "wait", "delay": wait}
        look: dict[str, Any] = {"state": state.to_json(), "at": now}
        if state.ended:
            return look | {"then": "results"}
        if cancelled_at is not None:
            if now >= cancelled_at + policy.cancel_grace:
                return look | {"then": "give-up"}
            return look | {"then": "wait", "delay": policy.cancel_look}
        first = self.first_at if self.first_at is not None else now
        if now >= self._give_up_at(first):
            return look | {"then": "cancel"}
        return look | {"then": "wait", "delay": backoff}

    def _deadline_cancel(self, batch_id: str) -> dict[str, Any]:
        """Cancel the batch at its deadline; what it said, and when."""
        at = self.run.clock.now()
        state = self.api.cancel(batch_id)
        return {"state": state.to_json(), "at": at}

    def _record_results(self, n: int, state: BatchState, chunk: list[int]) -> None:
        """Read the ended batch's results and record each item's, in item order."""
        run = self.run

        def read() -> dict[int, BatchEntry]:
            entries = self.api.results(state.id)
            return {self.by_custom[e.key]: e for e in entries if e.key in self.by_custom}

        _, entries = retry_loop(
            f"results:{self.prefix}-{n}",
            read,
            self.retry,
            run._retry_state,
            run.clock,
            run.check_lease,
        )
        for index in sorted(chunk):
            entry = entries.get(index)
            if index in self.done or entry is None or entry.type in UNANSWERED:
                continue  # recorded already, or asked synchronously after every batch

            def settled(item: X = self.items[index], entry: BatchEntry = entry) -> T:
                return self.settle(item, entry)

            self.results[index] = run._execute(
                self.steps[index], settled, self.retry, "batch", self.prefix
            )
            self.done.add(index)

    def _ask(self, indexes: list[int]) -> None:
        """Ask synchronously what no batch answered: a map of the rest."""
        items = [self.items[i] for i in indexes]
        answers = self.run.map(
            self.prefix,
            items,
            self.fallback,
            key=self.key,
            concurrency=self.concurrency,
            retry=self.retry,
        )
        for index, answer in zip(indexes, answers, strict=True):
            self.results[index] = answer
            self.done.add(index)

    # -- recorded steps of the group -------------------------------------------------------

    def _step(self, key: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """A step of the batch's own, in its group: replayed, or run and recorded."""
        run = self.run
        recorded = run._cursor.take(key)
        if recorded is not None:
            return run._replay(key, recorded)  # type: ignore[no-any-return]
        return run._execute(key, fn, None, "batch", self.prefix)

    def _sleep(self, key: str, seconds: float) -> None:
        """``Run.sleep`` in the batch's group: the wake time recorded once, then suspended."""
        run = self.run
        step = StepKey.SLEEP.of(key)
        recorded = run._cursor.take(step)
        if recorded is not None:
            wake_at = float(run._replay(step, recorded))
        else:
            wake_at = run._execute(
                step, lambda: run.clock.now() + seconds, None, "sleep", self.prefix
            )
        if run.clock.now() < wake_at:
            raise Suspend(Wait(kind="sleep", step=step, until=wake_at))

    def _cancel_quietly(self, batch_id: str, why: str) -> None:
        try:
            self.api.cancel(batch_id)
            log.info("run %s: cancelled batch %s: %s", self.run.keys.run, batch_id, why)
        except Exception as error:
            log.warning(
                "run %s: could not cancel batch %s (%s): %s",
                self.run.keys.run,
                batch_id,
                why,
                one_line(error),
            )
