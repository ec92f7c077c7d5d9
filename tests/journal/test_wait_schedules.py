"""Durable waits, signals and the store's restarts under generated schedules, through ``execute``.

``test_schedules.py`` pauses workers between the phases of a run; this machine drives whole
deliveries of the public ``Journal.execute`` and interrupts them at any Redis command instead:
before the k-th command of a delivery, a hook sends the signal the run waits for, starts a
duplicate delivery, lets the lease run out, sweeps, moves the clock, restarts the store from its
append-only file, or kills the delivery there (an exception no handler catches, like SIGKILL:
the lease stays). Between deliveries, other rules send signals, move time, sweep, expire leases
and restart the server. The workflow sleeps, waits for an approval with a timeout, records the
answer and, when approved, sends an email through a fenced effect.

Invariants are checked after every Redis command of every client (a record appears only under
the latest fence and never changes; a signal's first payload wins and is the one the run saw;
a timed-out wait saw no signal and had reached its deadline; nothing after the sleep ran before
its wake-up time), and after every rule (a waiting run is in the due index, and due already
when what it waits for has come; a done run stays done, with every step; one email, and a
repeat only after an act whose receipt never reached Redis, under the same key). At the end,
every schedule is driven to its end: the run must finish.
"""

from __future__ import annotations

import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis
from hypothesis import currently_in_test_context, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from journal import Effect, Journal, Keyspace, ManualClock, Run, Settings
from journal._clock import millis
from journal._schema import codec
from journal._schema.meta import Wait
from journal._schema.records import decode_fields
from journal._schema.status import RunStatus, may_follow
from journal.contrib.embedded import valkey_server_binary
from journal.errors import LeaseBusy, LeaseLost, StoreUnavailable
from tests.support import as_bytes, as_text, execute, only_index, schedule_profiles, wait_until

PROFILE = schedule_profiles("waits", ci=(150, 20), long=(5_000, 40))

T0 = 1_800_000_000.0
WORKFLOW, RUN_ID = "wf", "r1"
NAP, APPROVAL_TIMEOUT = 60.0, 120.0
# Real time never runs an effect's claim out here; the claim_times_out rule does.
EFFECT_TIMEOUT = 3600.0
HOOKS = ("signal", "duplicate", "expire", "sweep", "tick", "restart", "kill")
ALL_STEPS = {b"a", b"sleep:nap", b"wait:approve", b"signal:approve", b"b"}


def note(what: str) -> None:
    """Count ``what`` in Hypothesis's statistics, when Hypothesis is the one running."""
    if currently_in_test_context():
        event(what)


class Killed(BaseException):
    """The delivery's process died here: nothing of it runs on, no handler cleans up."""


class Interrupts:
    """Before each Redis command of one delivery, whether something happens, and what."""

    def pick(self) -> str | None:
        raise NotImplementedError


@dataclass
class Drawn(Interrupts):
    """Hypothesis picks, at every command: most go uninterrupted, each kind is drawn alike."""

    data: st.DataObject
    left: int = 2  # interruptions still allowed in this delivery

    def pick(self) -> str | None:
        if self.left == 0:
            return None
        drawn = self.data.draw(st.integers(0, 3 * len(HOOKS) - 1), label="interrupt")
        if drawn >= len(HOOKS):
            return None
        self.left -= 1
        return HOOKS[drawn]


@dataclass
class AtCommand(Interrupts):
    """``kind`` before the ``at``-th command, and nothing else: for the exhaustive sweep."""

    kind: str
    at: int
    commands: int = 0

    def pick(self) -> str | None:
        self.commands += 1
        return self.kind if self.commands == self.at else None


@dataclass
class Seen:
    """What the checks have seen of the store so far, and what happened outside it."""

    steps: dict[bytes, bytes] = field(default_factory=dict)
    status: str = ""
    sent: list[str] = field(default_factory=list)  # signal payloads, in the order sent
    arrived: float | None = None  # when the first signal was stored
    outbox: list[tuple[int, bool]] = field(default_factory=list)  # (fence, resumed) per email
    last_claim: float | None = None  # when a sweep last claimed the run (it re-arms it)


class Watched(redis.Redis):
    """A client mixin: the machine's hook before each command, its checks after each one.

    A Redis itself, so that its overrides are checked against Redis's; ahead of FakeRedis in
    a subclass's bases, its ``super()`` is FakeRedis. redis-py leaves ``execute_command`` and
    the pipeline's ``watch`` unannotated.
    """

    machine: WaitSchedules

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.machine.before_command()
        reply = super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        self.machine.check_store()
        return reply

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        """A pipeline interrupted before its WATCH and its EXEC, checked after the EXEC."""
        pipe = super().pipeline(transaction, shard_hint)
        machine, watch, execute = self.machine, pipe.watch, pipe.execute

        def watched_watch(*names: Any) -> Any:
            machine.before_command()
            return watch(*names)  # type: ignore[no-untyped-call]

        def watched_execute(raise_on_error: bool = True) -> Any:
            machine.before_command()
            replies = execute(raise_on_error)
            machine.check_store()
            return replies

        setattr(pipe, "watch", watched_watch)  # noqa: B010 - an instance's own method
        setattr(pipe, "execute", watched_execute)  # noqa: B010
        return pipe


class WatchedRedis(Watched, redis.Redis):
    pass


class WatchedFakeRedis(Watched, fakeredis.FakeRedis):
    pass


class Store:
    """The store the machine runs on: how to connect, watched or not, and how to restart it."""

    def client(self, machine: WaitSchedules | None = None) -> redis.Redis:
        raise NotImplementedError

    @property
    def restarts(self) -> bool:
        return False

    def restart(self) -> None:
        raise NotImplementedError


class FakeStore(Store):
    def __init__(self) -> None:
        self.server = fakeredis.FakeServer()

    def client(self, machine: WaitSchedules | None = None) -> redis.Redis:
        if machine is None:
            return fakeredis.FakeRedis(server=self.server)
        watched = WatchedFakeRedis(server=self.server)
        watched.machine = machine
        return watched


class ValkeyOnAof(Store):
    """A throwaway Valkey with ``appendfsync always``, killed -9 and restarted on its AOF."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.socket = directory / "valkey.sock"
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                str(valkey_server_binary()),
                *("--port", "0", "--unixsocket", str(self.socket), "--dir", str(self.directory)),
                *("--save", "", "--appendonly", "yes", "--appendfsync", "always"),
            ],
            stdout=subprocess.DEVNULL,
        )
        probe = redis.Redis(unix_socket_path=str(self.socket))

        def answers() -> bool:
            assert self.process is not None and self.process.poll() is None, "valkey exited"
            try:
                return bool(probe.ping())
            except redis.ConnectionError:
                return False
            except redis.ResponseError:  # LOADING: still reading its AOF
                return False

        wait_until(answers, 10, f"valkey on {self.socket} to answer PING", every=0.005)
        probe.close()

    def client(self, machine: WaitSchedules | None = None) -> redis.Redis:
        if machine is None:
            return redis.Redis(unix_socket_path=str(self.socket))
        watched = WatchedRedis(unix_socket_path=str(self.socket))
        watched.machine = machine
        return watched

    @property
    def restarts(self) -> bool:
        return True

    def restart(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self.start()

    def close(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()


class WaitSchedules(RuleBasedStateMachine):
    """Deliveries of one waiting run, interrupted anywhere, on one store and one movable clock."""

    def __init__(self, store: Store) -> None:
        super().__init__()
        self.store = store
        self.clock = ManualClock(T0)
        self.keyspace = Keyspace(f"w{uuid.uuid4().hex[:10]}")
        self.settings = Settings(lease_ttl=30.0, recovery_grace=5.0, rearm_after=60.0)
        self.plain = Journal(store.client(), keyspace=self.keyspace, settings=self.settings)
        # A script the server has not cached costs an EVAL after the EVALSHA: one command more
        # for the hook to draw at. Every example starts cold, so that count depends on the
        # example alone, not on what earlier ones loaded or which of them restarted the server.
        self.plain.client.script_flush()
        self.keys = self.plain.keys(WORKFLOW, RUN_ID)
        self.seen = Seen()
        self.interrupts: Interrupts | None = None
        self.checking = False

    # -- what a delivery runs ----------------------------------------------------------------

    def body(self, run: Run) -> Any:
        run.step("a", lambda: "a")
        run.sleep("nap", NAP)
        answer = run.wait_for_signal("approve", APPROVAL_TIMEOUT)
        run.step("b", lambda: {"received": answer.received, "payload": answer.payload})
        if answer.received:
            run.effect(
                "send",
                lambda effect: self.send(run, effect),
                timeout=EFFECT_TIMEOUT,
                repeatable=True,
            )
        return answer.payload

    def send(self, run: Run, effect: Effect) -> dict[str, int]:
        if effect.earlier is not None:
            return dict(effect.earlier)
        effect.confirm()
        self.seen.outbox.append((run.fence, effect.resumed))
        receipt = {"by": run.fence}
        effect.accepted(receipt)
        return receipt

    def journal(self, watched: bool = True) -> Journal:
        client = self.store.client(self if watched else None)
        return Journal(client, keyspace=self.keyspace, settings=self.settings, clock=self.clock)

    def deliver(self) -> str:
        """One delivery to its end; how it ended."""
        try:
            return execute(self.journal(), WORKFLOW, RUN_ID, self.body).status
        except LeaseBusy:
            return "busy"
        except LeaseLost:
            return "lost"
        except StoreUnavailable:
            return "store-down"
        except Killed:
            return "killed"

    # -- the hook, and the checks after every command ------------------------------------------

    def before_command(self) -> None:
        if self.checking:
            return
        if self.interrupts is None:
            return
        kind = self.interrupts.pick()
        if kind is None:
            return
        note(f"interrupt: {kind}")
        if kind == "kill":
            raise Killed()
        interrupts, self.interrupts = self.interrupts, None  # an interruption is not interrupted
        try:
            self.interrupt(kind)
        finally:
            self.interrupts = interrupts

    def interrupt(self, kind: str) -> None:
        if kind == "signal":
            self.signal("yes")
        elif kind == "duplicate":
            note(f"duplicate: {self.deliver()}")
        elif kind == "expire":
            self.expire()
        elif kind == "sweep":
            self.sweep()
        elif kind == "tick":
            self.tick(61.0)
        elif kind == "restart" and self.store.restarts:
            self.restart()

    def check_store(self) -> None:
        if self.checking:
            return
        self.checking = True
        try:
            self._check_store()
        finally:
            self.checking = False

    def _check_store(self) -> None:
        client = self.plain.client
        fence = int(client.get(self.keys.fence) or 0)
        stored = {as_bytes(k): as_bytes(v) for k, v in client.hgetall(self.keys.steps).items()}
        for name, raw in self.seen.steps.items():
            assert stored.get(name) == raw, f"record {name!r} changed or vanished"
        signal_raw = client.hget(self.keys.signals, "approve")
        if self.seen.sent:
            assert signal_raw is not None, "a sent signal is missing"
            assert decode(as_bytes(signal_raw)) == self.seen.sent[0], (
                "a later signal overwrote the first"
            )
        for name, raw in stored.items():
            if name in self.seen.steps:
                continue
            record = decode_fields(self.keys.run, name.decode(), raw)
            assert record["fence"] == fence, f"{name!r} written by fence {record['fence']}"
            self.new_record(name, record["result"])
            self.seen.steps[name] = raw
        status = self.plain.meta(self.keys).get("status", "")
        if status != self.seen.status:
            before = RunStatus(self.seen.status) if self.seen.status else None
            assert may_follow(before, RunStatus(status)), f"{before} became {status}"
            if status == "done":
                missing = ALL_STEPS - set(stored)
                assert not missing, f"done without {missing}"
            self.seen.status = status

    def new_record(self, name: bytes, result: Any) -> None:
        """What must hold at the moment a record first appears."""
        now = self.clock.now()
        if name == b"wait:approve":
            wake = decode_fields(self.keys.run, "sleep:nap", self.seen.steps[b"sleep:nap"])
            assert now >= wake["result"], f"the wait began at {now}, before the nap ended"
        if name == b"signal:approve":
            if result["received"]:
                assert result["payload"] == self.seen.sent[0], f"saw {result}, not the first"
            else:
                deadline = self.record(b"wait:approve")
                assert now >= deadline, f"timed out at {now}, before the deadline {deadline}"
                arrived = self.seen.arrived
                assert arrived is None or arrived >= deadline, "timed out, the signal was in time"

    def record(self, name: bytes) -> Any:
        return decode_fields(self.keys.run, name.decode(), self.seen.steps[name])["result"]

    # -- the rules --------------------------------------------------------------------------

    # A delivery that finds an earlier claimant that may still act waits out its claim on the
    # run's clock (this machine's: it moves at once), never in real time.
    @rule()
    def delivery(self) -> None:
        note(f"delivery: {self.deliver()}")

    @rule(data=st.data())
    def interrupted_delivery(self, data: st.DataObject) -> None:
        note(f"interrupted delivery: {self.deliver_with(Drawn(data))}")

    def deliver_with(self, interrupts: Interrupts) -> str:
        self.interrupts = interrupts
        try:
            return self.deliver()
        finally:
            self.interrupts = None

    @rule(payload=st.sampled_from(["yes", "no", "later"]))
    def send_signal(self, payload: str) -> None:
        self.signal(payload)

    def signal(self, payload: str) -> None:
        # Unwatched: the checks expect what was sent to be noted before they look.
        if self.journal(watched=False).send_signal(WORKFLOW, RUN_ID, "approve", payload):
            self.seen.sent.append(payload)
            if self.seen.arrived is None:
                self.seen.arrived = self.clock.now()

    @rule(seconds=st.sampled_from([1.0, 30.0, 61.0, 121.0]))
    def tick(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule()
    def sweep(self) -> None:
        for keys in self.journal().claim_due():
            # Claimed is re-armed in the same script: no other sweeper can claim it until then.
            now = self.clock.now()
            score = self.plain.client.zscore(only_index(self).due, keys.run)
            assert score == millis(now + self.settings.rearm_after), "claimed, not re-armed"
            self.seen.last_claim = now

    @rule()
    def expire(self) -> None:
        """The lease runs out: its holder froze past it, or its process died."""
        self.plain.client.delete(self.keys.lease)

    @rule()
    def claim_times_out(self) -> None:
        """The effect's timeout passes for its claimant: its deadline is behind the server's."""
        claim = as_text(self.plain.client.hget(self.keys.effects, "send") or b"")
        fence, state = claim.partition(":")[0], claim.rpartition(":")[2]
        if state in ("claimed", "confirmed"):
            self.plain.client.hset(self.keys.effects, "send", f"{fence}:1:{state}")

    @precondition(lambda self: self.store.restarts)
    @rule()
    def restart(self) -> None:
        """kill -9 the server and start it on its AOF: everything acknowledged is there."""
        note("restart")
        before = self.snapshot()
        self.store.restart()
        self.plain = Journal(self.store.client(), keyspace=self.keyspace, settings=self.settings)
        after = self.snapshot()
        assert after == before, "the restart lost or changed acknowledged data"

    def snapshot(self) -> dict[str, Any]:
        client = self.plain.client
        return {
            "steps": client.hgetall(self.keys.steps),
            "meta": client.hgetall(self.keys.meta),
            "signals": client.hgetall(self.keys.signals),
            "effects": client.hgetall(self.keys.effects),
            "fence": client.get(self.keys.fence),
            "due": client.zscore(only_index(self).due, self.keys.run),
        }

    # -- what must hold between rules ---------------------------------------------------------

    def check_between_rules(self) -> None:
        self.a_waiting_run_is_due_when_its_wait_is_over()
        self.one_email_and_a_repeat_only_after_a_lost_receipt()

    @invariant()
    def a_waiting_run_is_due_when_its_wait_is_over(self) -> None:
        meta = self.plain.meta(self.keys)
        if meta.get("status") != "waiting":
            return
        wait = Wait.from_meta(self.keys.run, meta["wait"])
        score = self.plain.client.zscore(only_index(self).due, self.keys.run)
        assert score is not None, f"waiting for {wait.step} and in no index: it never wakes"
        # A sweep's claim re-arms the entry (its delivery may be lost; the re-arm is the safety
        # net), so due means due by the later of that and the time the wait ends: now, if what
        # it waits for has come, else its timeout.
        claimed = self.seen.last_claim
        rearmed = 0 if claimed is None else millis(claimed + self.settings.rearm_after)
        now = millis(self.clock.now())
        arrived = wait.signal is not None and self.client_has_signal(wait.signal)
        if arrived or (wait.until is not None and millis(wait.until) <= now):
            assert score <= max(now, rearmed), f"{wait.step} is over, yet the run is not due"
        elif wait.until is not None:
            assert score <= max(millis(wait.until), rearmed), "due later than its wake-up"

    def client_has_signal(self, name: str) -> bool:
        return bool(self.plain.client.hexists(self.keys.signals, name))

    @invariant()
    def one_email_and_a_repeat_only_after_a_lost_receipt(self) -> None:
        outbox = self.seen.outbox
        receipt = self.plain.client.hget(self.keys.effects, "send:receipt")
        saved_by = None if not receipt else decode(as_bytes(receipt))["by"]
        for fence, _ in outbox[:-1]:
            assert fence != saved_by, f"sent again after fence {fence}'s receipt was saved"
        assert all(resumed for _, resumed in outbox[1:]), "a repeat without the same key"
        if outbox and self.seen.steps.get(b"b") is not None and not self.record(b"b")["received"]:
            raise AssertionError("an email for a run that was not approved")

    def teardown(self) -> None:
        try:
            self.finish_the_run()
        finally:
            for key in self.plain.client.scan_iter(match=f"{self.keyspace.prefix}:*"):
                self.plain.client.delete(key)

    def finish_the_run(self) -> None:
        """Whatever the schedule did, the run can still be driven to its end."""
        for _ in range(8):
            self.expire()
            self.claim_times_out()
            self.tick(121.0)
            if self.deliver() == "done" or self.seen.status == "done":
                break
        assert self.seen.status == "done", f"the run did not finish: {self.seen.status!r}"
        approved = self.record(b"b")["received"]
        assert len(self.seen.outbox) >= (1 if approved else 0), "approved, and nothing was sent"
        note(f"emails: {len(self.seen.outbox)}, approved: {approved}")


def decode(raw: bytes) -> Any:
    return codec.loads(raw)


def run_schedules(store: Store) -> None:
    # Hypothesis types the factory as a class; its documentation takes any callable.
    run_state_machine_as_test(
        lambda: WaitSchedules(store),  # type: ignore[arg-type]
        settings=settings.get_profile(PROFILE),
    )


@pytest.mark.timeout(600)
def test_waits_signals_and_interruptions_keep_the_invariants_on_fakeredis() -> None:
    run_schedules(FakeStore())


# Where a delivery can be, each reached by the rules it takes to get there.
STAGES: dict[str, tuple[Callable[[WaitSchedules], object], ...]] = {
    "new": (),
    "napping, the nap over": (WaitSchedules.delivery, lambda m: m.tick(61.0)),
    "waiting for the approval": (
        WaitSchedules.delivery,
        lambda m: m.tick(61.0),
        WaitSchedules.delivery,
    ),
    "approved, about to send": (
        WaitSchedules.delivery,
        lambda m: m.tick(61.0),
        WaitSchedules.delivery,
        lambda m: m.send_signal("yes"),
    ),
    "the approval timed out": (
        WaitSchedules.delivery,
        lambda m: m.tick(61.0),
        WaitSchedules.delivery,
        lambda m: m.tick(121.0),
    ),
}


def sweep_every_interruption(store: Store) -> int:
    """Each stage, each kind of interruption before each command of the delivery from there.

    A schedule Hypothesis would have to be lucky to draw (a signal landing between a wait's
    status write and its index write) is one of these. Returns how many were run.
    """
    swept = 0
    for rules in STAGES.values():
        for kind in HOOKS:
            at = 1
            while True:
                machine = WaitSchedules(store)
                for step in rules:
                    step(machine)
                interrupts = AtCommand(kind, at)
                try:
                    machine.deliver_with(interrupts)
                    machine.check_between_rules()
                finally:
                    machine.teardown()
                swept += 1
                if interrupts.commands < at:  # the delivery ended before the point: all done
                    break
                at += 1
    return swept


@pytest.mark.timeout(300)
def test_one_interruption_before_any_command_keeps_the_invariants_on_fakeredis() -> None:
    assert sweep_every_interruption(FakeStore()) > 150


@pytest.fixture
def valkey_on_aof(tmp_path: Path) -> Iterator[ValkeyOnAof]:
    store = ValkeyOnAof(tmp_path)
    yield store
    store.close()


@pytest.mark.slow  # it kills and restarts a server process
@pytest.mark.timeout(600)
def test_waits_signals_and_restarts_keep_the_invariants_on_valkey(
    valkey_on_aof: ValkeyOnAof,
) -> None:
    run_schedules(valkey_on_aof)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_one_interruption_before_any_command_keeps_the_invariants_on_valkey(
    valkey_on_aof: ValkeyOnAof,
) -> None:
    assert sweep_every_interruption(valkey_on_aof) > 150
