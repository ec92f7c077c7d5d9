"""The real journal under generated schedules: Hypothesis interleaves simulated workers.

The SPIN check (test_spin.py) proves the protocol; this runs the real scripts and the real
Python around them. Each simulated worker walks the phases ``Journal.execute`` walks (meta
read and acquire, announce and open, step ``s0``, step ``s1``, the fenced effect ``send``,
finish), one phase per rule, so any worker may be paused between any two phases while others
act; other rules expire the lease (its key runs out), crash a worker (its process is gone:
the lease stays), move the clock and sweep the due index from two sweepers. After every rule
the invariants are checked against what Redis holds and against the outbox the effect writes
to. A failure shrinks to a minimal schedule; each one found is kept below as a regression.

``DIGEST_HYPOTHESIS_PROFILE=long`` runs the long profile (the default, ``ci``, is sized for
the fast suite).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import fakeredis
import pytest
import redis
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from journal import Effect, Journal, Keyspace, ManualClock, Settings
from journal._clock import millis
from journal._lease import Found, Heartbeat, Lease
from journal._run import Run
from journal._schema.records import decode_fields
from journal.errors import LeaseBusy, LeaseLost
from tests.support import as_bytes, as_text, schedule_profiles

PROFILE = schedule_profiles("phases", ci=(1000, 30), long=(20_000, 60))

WORKERS = 3
PHASES = ("start", "s0", "s1", "send", "finish")
# Long enough that no confirmation runs out by itself (real time would make schedules flaky);
# the claim's timeout passes by the claim_times_out rule instead.
EFFECT_TIMEOUT = 3600.0
WORKFLOW, RUN_ID = "wf", "r1"


class Died(BaseException):
    """The process ended between the server's acceptance and the receipt (kill -9)."""


@dataclass
class Worker:
    """One delivery in flight: how far it got and what it holds."""

    phase: int = 0
    lease: Lease | None = None
    holder: str = ""
    fence: int = 0
    run: Run | None = None
    heartbeat: Heartbeat | None = None

    def stop(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
        vars(self).update(vars(Worker()))  # a new worker's fields: nothing in flight


@dataclass
class World:
    """What happened outside Redis: the emails accepted, and the windows that allow a repeat."""

    outbox: list[tuple[int, bool]] = field(default_factory=list)  # (fence, resumed)
    windows: int = 0  # acts whose receipt never reached Redis


class Schedules(RuleBasedStateMachine):
    """Workers sharing one store and one movable clock, in any order Hypothesis picks."""

    def __init__(self, client: redis.Redis) -> None:
        super().__init__()
        self.client = client
        self.clock = ManualClock()
        self.keyspace = Keyspace(f"h{uuid.uuid4().hex[:10]}")
        settings_ = Settings(lease_ttl=30.0, recovery_grace=5.0, rearm_after=60.0)
        self.journal = Journal(client, keyspace=self.keyspace, settings=settings_, clock=self.clock)
        self.sweepers = [
            Journal(client, keyspace=self.keyspace, settings=settings_, clock=self.clock)
            for _ in range(2)
        ]
        self.keys = self.journal.keys(WORKFLOW, RUN_ID)
        self.workers = [Worker() for _ in range(WORKERS)]
        self.world = World()
        self.steps: dict[bytes, bytes] = {}  # every record seen, as first seen
        self.status = ""
        self.actor = 0  # fence of the worker the last rule ran, 0 for none
        self.claims: set[tuple[float, str]] = set()

    # -- the workers -----------------------------------------------------------------------

    @rule(w=st.integers(0, WORKERS - 1), die_after_act=st.booleans())
    def advance(self, w: int, die_after_act: bool) -> None:
        """Worker ``w`` takes its next phase, as Journal.execute would."""
        worker = self.workers[w]
        self.actor = worker.fence
        try:
            getattr(self, f"_{PHASES[worker.phase]}")(worker, die_after_act)
        except LeaseLost:
            worker.stop()  # the delivery ends; its lease, if still live, runs out
        except LeaseBusy:
            worker.stop()  # the delivery retries later: a fresh one
        except Died:
            worker.stop()

    def _start(self, worker: Worker, _: bool) -> None:
        lease = self.journal.runner._lease(self.keys)
        taken = lease.open(millis(self.clock.now()), self.journal.runner._opening({}))
        if isinstance(taken, Found):
            return  # already-done: the opening found it ended and took nothing
        worker.lease, worker.holder, worker.fence = lease, taken.holder, taken.fence
        self.actor = taken.fence
        worker.run, worker.heartbeat = self.journal.runner._open(
            self.keys, taken, None, lease, None
        )
        worker.phase = 1

    def _s0(self, worker: Worker, _: bool) -> None:
        self._step(worker, "s0")

    def _s1(self, worker: Worker, _: bool) -> None:
        self._step(worker, "s1")

    def _step(self, worker: Worker, key: str) -> None:
        assert worker.run is not None
        worker.run.step(key, lambda: f"{key} by {worker.fence}")
        worker.phase += 1

    def _send(self, worker: Worker, die_after_act: bool) -> None:
        assert worker.run is not None
        claim = as_text(self.client.hget(self.keys.effects, "send") or b"")
        fence, _, rest = claim.partition(":")
        live = rest.endswith((":claimed", ":confirmed")) and not rest.startswith("1:")
        if live and int(fence) != worker.fence:
            return  # an earlier claimant may still act: Effect.claim waits for its timeout

        def deliver(effect: Effect) -> dict[str, Any]:
            if effect.earlier is not None:
                return dict(effect.earlier)
            effect.confirm()
            self.world.outbox.append((worker.fence, effect.resumed))
            if die_after_act:
                self.world.windows += 1
                raise Died()
            receipt = {"id": f"sent by {worker.fence}"}
            try:
                effect.accepted(receipt)
            except LeaseLost:
                saved = self.client.hget(self.keys.effects, "send:receipt")
                if saved is None or json.loads(saved) != receipt:
                    self.world.windows += 1  # accepted by the server, receipt refused
                raise
            return receipt

        # Repeatable: the outbox drops a repeat of the key, as a provider with keys does.
        worker.run.effect("send", deliver, timeout=EFFECT_TIMEOUT, repeatable=True)
        worker.phase += 1

    def _finish(self, worker: Worker, _: bool) -> None:
        assert worker.heartbeat is not None and worker.run is not None
        worker.heartbeat.stop()
        self.journal.runner._finish(self.keys, worker.holder, "done", worker.run.unwritten)
        worker.stop()

    @rule(w=st.integers(0, WORKERS - 1))
    def crash(self, w: int) -> None:
        """SIGKILL: the process is gone, its lease stays until it runs out."""
        self.actor = 0
        self.workers[w].stop()

    @rule()
    def expire(self) -> None:
        """The lease runs out (its holder paused past it, or died)."""
        self.actor = 0
        self.client.delete(self.keys.lease)

    @rule()
    def claim_times_out(self) -> None:
        """The effect's timeout passes for its claimant: its deadline is behind the server's time.

        Every send runs claim to receipt within one rule, so no live worker sits between its
        claim and its receipt here: the only claimant this frees is a dead one (the model
        checks the pauses inside the effect).
        """
        self.actor = 0
        claim = as_text(self.client.hget(self.keys.effects, "send") or b"")
        fence, state = claim.partition(":")[0], claim.rpartition(":")[2]
        if state in ("claimed", "confirmed"):
            self.client.hset(self.keys.effects, "send", f"{fence}:1:{state}")

    @rule(seconds=st.sampled_from([1.0, 30.0, 61.0]))
    def tick(self, seconds: float) -> None:
        self.actor = 0
        self.clock.advance(seconds)

    @rule(k=st.integers(0, 1))
    def sweep(self, k: int) -> None:
        self.actor = 0
        for keys in self.sweepers[k].claim_due():
            claim = (self.clock.now(), keys.run)
            assert claim not in self.claims, f"{keys.run} claimed twice at {claim[0]}"
            self.claims.add(claim)

    @precondition(lambda self: all(w.phase == 0 for w in self.workers))
    @rule()
    def settle_down(self) -> None:
        """Nobody is in flight: let the lease run out (no-op when none is held)."""
        self.actor = 0
        self.client.delete(self.keys.lease)

    # -- what must hold after every rule ---------------------------------------------------

    @invariant()
    def records_are_written_once_and_only_by_the_latest_holder(self) -> None:
        fence = int(self.client.get(self.keys.fence) or 0)
        stored = {as_bytes(k): as_bytes(v) for k, v in self.client.hgetall(self.keys.steps).items()}
        for name, raw in self.steps.items():
            assert stored.get(name) == raw, f"record {name!r} changed or vanished"
        for name, raw in stored.items():
            if name not in self.steps:
                record = decode_fields(self.keys.run, name.decode(), raw)
                assert record["fence"] == fence, f"{name!r} written by fence {record['fence']}"
                self.steps[name] = raw

    @invariant()
    def meta_moves_only_by_the_latest_holder_and_done_stays_done(self) -> None:
        status = self.journal.meta(self.keys).get("status", "")
        if status != self.status:
            assert self.status != "done", f"a done run went back to {status!r}"
            fence = int(self.client.get(self.keys.fence) or 0)
            assert self.actor == fence, f"status {status!r} written by fence {self.actor}"
            if status == "done":
                # Read now: a record may come with the closing (the send's, its receipt saved).
                steps = set(self.client.hkeys(self.keys.steps))
                assert {b"s0", b"s1", b"send"} <= steps, "done with a step missing"
            self.status = status

    @invariant()
    def one_email_but_for_the_window(self) -> None:
        outbox = self.world.outbox
        assert len(outbox) <= 1 + self.world.windows, f"{len(outbox)} emails: {outbox}"
        assert all(resumed for _, resumed in outbox[1:]), "a repeat without the same key"

    def teardown(self) -> None:
        event(f"status at the end: {self.status or 'new'}")
        event(f"emails: {len(self.world.outbox)}, windows: {self.world.windows}")
        for worker in self.workers:
            worker.stop()
        for key in self.client.scan_iter(match=f"{self.keyspace.prefix}:*"):
            self.client.delete(key)


def run_schedules(client: Callable[[], redis.Redis], share: float = 1.0) -> None:
    profile = settings.get_profile(PROFILE)
    examples = max(1, int(profile.max_examples * share))
    # Hypothesis types the factory as a class; its documentation takes any callable.
    run_state_machine_as_test(
        lambda: Schedules(client()),  # type: ignore[arg-type]
        settings=settings(profile, max_examples=examples),
    )


@pytest.mark.timeout(600)
def test_every_generated_schedule_keeps_the_invariants_on_fakeredis() -> None:
    server = fakeredis.FakeServer()
    run_schedules(lambda: fakeredis.FakeRedis(server=server))


@pytest.mark.timeout(600)
def test_every_generated_schedule_keeps_the_invariants_on_valkey(
    real_redis: redis.Redis,
) -> None:
    run_schedules(lambda: real_redis, share=0.5)  # a real server is slower per example
