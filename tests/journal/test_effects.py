"""Fenced effects: claimed before they start, confirmed before the irreversible moment,
settled through fenced scripts, and resolved by a later holder only once the claimant can no
longer act. Contract tests on both backends; real SIGSTOPped workers against a real SMTP
server are in ``tests/failure/test_frozen_send.py``.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis

from journal import Effect, Journal, Run
from journal._holder import ProcessIdentity
from journal._redis.scripts import Client, KeyOrArg, Script
from journal.errors import LeaseLost
from tests.conftest import MakeJournal
from tests.support import as_text, execute, only_index

PID_MAX = int(Path("/proc/sys/kernel/pid_max").read_text())


class AfterReply(Script):
    """``script`` as it was, but ``then()`` runs once each reply is back, before it returns."""

    def __init__(self, script: Script, then: Callable[[], None]) -> None:
        super().__init__(script.client, script.script)
        self.then = then

    def __call__(
        self,
        keys: Sequence[KeyOrArg] = (),
        args: Sequence[KeyOrArg] = (),
        client: Client | None = None,
    ) -> Any:
        reply = super().__call__(keys, args, client)
        self.then()
        return reply


class Sink:
    """An external system: counts what passed its irreversible moment, by idempotency key."""

    def __init__(self) -> None:
        self.delivered: list[str] = []

    def send(self, key: str, effect: Effect) -> dict[str, Any]:
        if effect.earlier is not None:
            return {"key": key, "sent": False}
        effect.confirm()
        self.delivered.append(key)
        receipt = {"key": key, "sent": True}
        effect.accepted(receipt)
        return receipt


def effects_hash(journal: Journal, run_id: str = "r1") -> dict[str, str]:
    keys = journal.keys("wf", run_id)
    return {as_text(k): as_text(v) for k, v in journal.client.hgetall(keys.effects).items()}


def test_an_effect_runs_once_and_a_replay_does_not_call_it(make_journal: MakeJournal) -> None:
    journal = make_journal()
    sink = Sink()
    seen: list[tuple[bool, Any]] = []

    def body(run: Run) -> Any:
        def act(effect: Effect) -> Any:
            seen.append((effect.resumed, effect.earlier))
            return sink.send(run.idempotency_key("send"), effect)

        return run.effect("send", act, timeout=5)

    assert execute(journal, "wf", "r1", body).result == {"key": "wf-r1-send", "sent": True}
    journal.client.hset(journal.keys("wf", "r1").meta, "status", "running")  # deliver again
    assert execute(journal, "wf", "r1", body).result == {"key": "wf-r1-send", "sent": True}
    assert sink.delivered == ["wf-r1-send"]
    assert seen == [(False, None)]
    assert effects_hash(journal)["send"] == "1:0:done"


def zombie_then_winner(
    make_journal: MakeJournal,
    act_as_zombie: Callable[[Sink, Effect], object],
    *,
    timeout: float,
    vanish: bool = False,
    released_before: bool = False,
) -> tuple[list[str], list[Any], float, list[BaseException]]:
    """A holder starts the effect, loses its lease mid-effect; a second holder resolves it.

    ``released_before``: an earlier holder released a claim of it, so the zombie claims it
    before calling the function, not at its confirmation.
    """
    first = make_journal(lease_ttl=0.3)
    second = make_journal(lease_ttl=5.0)
    keys = first.keys("wf", "r1")
    sink = Sink()
    errors: list[BaseException] = []
    outcome: list[Any] = []
    took: list[float] = []

    def winner(run: Run) -> Any:
        return run.effect("send", lambda e: sink.send("k", e), timeout=timeout)

    def zombie(run: Run) -> Any:
        def act(effect: Effect) -> Any:
            first.client.delete(keys.lease)  # the expiry a frozen process would suffer
            if vanish:  # as if this process were gone: a pid that cannot exist
                dead = dataclasses.replace(ProcessIdentity.current(), pid=PID_MAX + 1)
                first.client.hset(keys.effects, "send:process", dead.encode())
            started = time.monotonic()
            outcome.append(execute(second, "wf", "r1", winner).result)
            took.append(time.monotonic() - started)
            return act_as_zombie(sink, effect)

        return run.effect("send", act, timeout=timeout)

    if released_before:
        first.client.hset(keys.effects, "send", "0:0:released")
    try:
        execute(first, "wf", "r1", zombie)
    except LeaseLost as lost:
        errors.append(lost)
    return sink.delivered, outcome, took[0], errors


def test_a_zombie_before_its_irreversible_moment_is_stopped_by_confirm(
    make_journal: MakeJournal,
) -> None:
    delivered, outcome, took, errors = zombie_then_winner(
        make_journal, lambda sink, effect: sink.send("k", effect), timeout=0.5
    )
    assert delivered == ["k"]  # the winner's only
    assert outcome == [{"key": "k", "sent": True}]
    # The zombie never confirmed, so it never claimed: the winner had nothing to wait for.
    assert took < 0.3
    assert len(errors) == 1  # the zombie stopped with LeaseLost


def test_a_zombies_live_claim_is_waited_for_and_the_zombie_stopped_by_confirm(
    make_journal: MakeJournal,
) -> None:
    delivered, outcome, took, errors = zombie_then_winner(
        make_journal,
        lambda sink, effect: sink.send("k", effect),
        timeout=0.5,
        released_before=True,
    )
    assert delivered == ["k"]  # the winner's only
    assert outcome == [{"key": "k", "sent": True}]
    assert 0.3 < took < 3  # the winner waited for the zombie's claim to time out
    assert len(errors) == 1  # the zombie stopped with LeaseLost


def test_a_zombie_past_its_moment_cannot_save_its_receipt(make_journal: MakeJournal) -> None:
    def delivered_then_frozen(sink: Sink, effect: Effect) -> None:
        sink.delivered.append("k")  # accepted by the server before the freeze: the window
        effect.accepted({"key": "k", "sent": True})

    delivered, _, _, errors = zombie_then_winner(make_journal, delivered_then_frozen, timeout=0.2)
    assert delivered == ["k", "k"]  # the documented window: repeated under the same key
    assert len(errors) == 1  # the zombie stopped with LeaseLost


def test_a_provably_dead_claimant_is_not_waited_for(make_journal: MakeJournal) -> None:
    _, outcome, took, _ = zombie_then_winner(
        make_journal, lambda sink, effect: None, timeout=30, vanish=True
    )
    assert outcome == [{"key": "k", "sent": True}]
    assert took < 2  # not the 30 s timeout


def test_a_saved_receipt_is_handed_to_the_next_holder_and_not_repeated(
    make_journal: MakeJournal,
) -> None:
    journal = make_journal()
    sink = Sink()
    crashed = RuntimeError("the process died after the receipt, before the record")

    def body(run: Run) -> Any:
        def act(effect: Effect) -> Any:
            receipt = sink.send("k", effect)
            if effect.earlier is None:
                raise crashed
            return receipt

        return run.effect("send", act, timeout=30)

    with pytest.raises(RuntimeError):
        execute(journal, "wf", "r1", body)
    assert execute(journal, "wf", "r1", body).result == {"key": "k", "sent": False}
    assert sink.delivered == ["k"]


def test_an_effect_that_failed_is_released_and_retried_at_once(make_journal: MakeJournal) -> None:
    journal = make_journal()
    calls: list[bool] = []

    def body(run: Run) -> Any:
        def act(effect: Effect) -> Any:
            calls.append(effect.resumed)
            if len(calls) == 1:
                raise ConnectionError("server unreachable")
            effect.confirm()
            return "ok"

        return run.effect("send", act, timeout=30)

    with pytest.raises(ConnectionError):
        execute(journal, "wf", "r1", body)
    assert effects_hash(journal) == {}  # it failed before its confirmation, which claims
    started = time.monotonic()
    assert execute(journal, "wf", "r1", body).result == "ok"
    assert time.monotonic() - started < 2  # not the 30 s timeout
    assert calls == [False, False]  # released: it did not happen, so the retry is no repeat


def test_confirm_after_the_claims_timeout_refuses_to_act(make_journal: MakeJournal) -> None:
    journal = make_journal(lease_ttl=5.0)
    acted: list[str] = []

    def act(effect: Effect) -> None:
        time.sleep(0.3)
        effect.confirm()
        acted.append("late")

    with pytest.raises(LeaseLost, match=r"passed its 0\.2s timeout"):
        execute(journal, "wf", "r1", lambda run: run.effect("send", act, timeout=0.2))
    assert acted == []


def test_a_lease_is_trusted_from_before_its_request_not_after_the_reply(
    make_journal: MakeJournal,
) -> None:
    """A pause between acquiring and the first step outlives the lease: the step finds out."""
    journal = make_journal(lease_ttl=0.4)
    ran: list[str] = []

    def late_reply() -> None:
        threading.Event().wait(0.5)  # the lease (0.4 s) expires while the reply is late

    slow_opening = AfterReply(journal.backend.scripts.open, late_reply)
    journal.backend.scripts = dataclasses.replace(journal.backend.scripts, open=slow_opening)
    with pytest.raises(LeaseLost):
        execute(journal, "wf", "r1", lambda run: run.step("a", lambda: ran.append("a")))
    assert ran == []


def test_a_holder_that_lost_its_lease_never_re_arms_a_run_another_finished(
    make_journal: MakeJournal, store: redis.Redis
) -> None:
    """Paused right after its opening, while its lease expired and another finished the run."""
    first = make_journal(lease_ttl=30.0)
    keys = first.keys("wf", "r1")
    paused: list[bool] = []

    def pause_once() -> None:
        if not paused:
            paused.append(True)
            store.delete(keys.lease)  # the lease expired during the pause
            other = make_journal(lease_ttl=30.0)
            assert execute(other, "wf", "r1", lambda run: run.step("a", lambda: "B")).status == (
                "done"
            )

    first.backend.scripts = dataclasses.replace(
        first.backend.scripts, open=AfterReply(first.backend.scripts.open, pause_once)
    )
    with pytest.raises(LeaseLost):
        execute(first, "wf", "r1", lambda run: run.step("a", lambda: "A"))
    assert paused
    assert store.zscore(only_index(first).due, keys.run) is None  # not re-armed: never swept again
    assert first.meta(keys)["status"] == "done"
