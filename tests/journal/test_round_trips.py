"""What a run costs in client round trips, counted by the server itself with MONITOR.

A run of S new steps is one opening script, one record script per step and one closing
script: S + 2. Every extra round trip is a wait on the network and, under ``appendfsync
always``, often an fsync, so the counts are exact: a test here fails when one is added.

MONITOR sees the whole server, so these run on the session's own Valkey (never a server of
someone else's) and count only between two markers this test sends; commands a script runs
are the script's, not round trips, and a MULTI ... EXEC is one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis

from journal import (
    Effect,
    Journal,
    Keyspace,
    RetryPolicy,
    Run,
    Script,
    SystemClock,
    send_with_record,
)
from journal.contrib.checks import connect_checked
from journal.ops.views import Prefetch, RunView, inspect_run
from tests.support import execute, returning, round_trips

STEPS = 10


@pytest.fixture
def own_client(own_redis_url: str, prefix: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(own_redis_url)
    yield client
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        client.delete(key)
    client.close()


def steps(count: int) -> Callable[[Run], str]:
    def body(run: Run) -> str:
        for i in range(count):
            run.step(f"s{i}", returning(i))
        return "ok"

    return body


@pytest.fixture
def journal(own_client: redis.Redis, prefix: str) -> Journal:
    journal = Journal(own_client, keyspace=Keyspace(prefix))
    execute(journal, "wf", "warm-up", steps(1))  # a warm process: its scripts are loaded
    return journal


def test_a_run_of_new_steps_costs_one_round_trip_per_step_plus_two(journal: Journal) -> None:
    sent = round_trips(journal.client, lambda: execute(journal, "wf", "r1", steps(STEPS)))
    assert len(sent) == STEPS + 2, sent
    assert [command.split()[0] for command in sent] == ["EVALSHA"] * (STEPS + 2)


def test_a_repeatable_step_costs_no_round_trip_of_its_own(journal: Journal) -> None:
    def body(run: Run) -> int:
        run.step("a", returning(1))
        run.step("b", returning(2), repeatable=True)
        run.step("c", returning(3))
        run.step("d", returning(4), repeatable=True)
        return run.step("e", returning(5), repeatable=True)

    sent = round_trips(journal.client, lambda: execute(journal, "wf", "r1", body))
    # The opening, the records of a and c (b's with c's), the closing (d's and e's with it).
    assert len(sent) == 4, sent
    steps_hash = journal.client.hkeys(journal.keys("wf", "r1").steps)
    assert sorted(steps_hash) == [b"a", b"b", b"c", b"d", b"e"]


def test_a_delivery_is_counted_in_the_opening_round_trip(journal: Journal) -> None:
    def deliver() -> None:
        execute(journal, "wf", "r1", steps(STEPS), args={"to": "a@b"}, delivered=True)

    assert len(round_trips(journal.client, deliver)) == STEPS + 2
    assert journal.meta(journal.keys("wf", "r1"))["deliveries"] == "1"


def test_a_resumed_run_replays_in_its_opening_round_trip(journal: Journal) -> None:
    def napper(run: Run) -> None:
        steps(STEPS)(run)
        run.sleep("nap", 0.05)

    assert execute(journal, "wf", "r1", napper).status == "waiting"
    journal.clock.sleep(0.06)
    resumed = lambda: execute(journal, "wf", "r1", napper)  # noqa: E731
    sent = round_trips(journal.client, resumed)
    assert len(sent) == 2, sent  # open (the journal comes with it) and close: nothing recorded


def test_a_finished_run_costs_one_round_trip(journal: Journal) -> None:
    execute(journal, "wf", "r1", steps(STEPS))
    sent = round_trips(journal.client, lambda: execute(journal, "wf", "r1", steps(STEPS)))
    assert len(sent) == 1, sent


def test_a_new_process_on_a_server_without_the_scripts_loads_them_in_one_round_trip(
    own_client: redis.Redis, prefix: str
) -> None:
    own_client.script_flush()  # this suite's own server: a restart, or a failover, forgets them

    def first_run() -> None:
        journal = Journal(own_client, keyspace=Keyspace(prefix))
        execute(journal, "wf", "r1", steps(STEPS))

    sent = round_trips(own_client, first_run)
    # The first script misses, every script is loaded in one transaction and the first is sent
    # again: two round trips once, then the warm run's S + 2, with no EVAL of a source.
    assert len(sent) == STEPS + 4, sent
    assert sent[0].startswith("EVALSHA") and sent[1] == "MULTI" and sent[2].startswith("EVALSHA")
    assert not any(command.startswith("EVAL ") for command in sent)


def test_an_effect_costs_its_confirmation_and_its_settlement(journal: Journal) -> None:
    """The confirmation renews the lease and takes the claim in one script, one round trip.

    The opening read that no claim of the effect stood: until its confirmation it cannot
    have happened, so nothing needs claiming before the function starts. Its settlement saves
    the receipt, from which a replay can answer: its record goes with the closing.
    """

    def send(effect: Effect) -> str:
        effect.confirm()
        effect.last_moment()
        effect.accepted("receipt")
        return "sent"

    def body(run: Run) -> str:
        return run.effect("send", send, timeout=10)

    sent = round_trips(journal.client, lambda: execute(journal, "wf", "r1", body))
    assert len(sent) == 2 + 2, sent  # confirm, settle; open and close (with the record)
    assert journal.client.hexists(journal.keys("wf", "r1").steps, "send")


def test_a_write_sent_with_a_steps_record_rides_in_its_round_trip(
    journal: Journal, own_client: redis.Redis, prefix: str
) -> None:
    """A step's body may send a write of another slot (a limiter's settle) with its record.

    Another thread may wait for such a write (a limiter's probe): its reply is handed over
    once the server has it.
    """
    counter = Script(journal.client, "return redis.call('INCR', KEYS[1])")
    elsewhere = f"{prefix}:elsewhere"
    counter(keys=[elsewhere])  # loaded on the server, as a warm process's scripts are
    replies: list[int] = []

    def body(run: Run) -> str:
        def call() -> str:
            send_with_record(counter, [elsewhere], [], replies.append)
            assert replies == []  # not yet: it waits for the record
            return "answered"

        return run.step("s0", call)

    sent = round_trips(journal.client, lambda: execute(journal, "wf", "r1", body))
    assert len(sent) == 1 + 2, sent  # the record carried the write: open, record, close
    assert own_client.get(elsewhere) == b"2"
    assert replies == [2]  # the server's reply: it ran
    send_with_record(counter, [elsewhere], [], replies.append)  # outside a step: at once
    assert replies == [2, 3]


def test_a_write_of_a_failed_attempt_is_sent_at_once_and_only_once(
    journal: Journal, own_client: redis.Redis, prefix: str
) -> None:
    counter = Script(journal.client, "return redis.call('INCR', KEYS[1])")
    elsewhere = f"{prefix}:elsewhere"
    attempts: list[int] = []

    def call() -> str:
        attempts.append(int(own_client.get(elsewhere) or 0))  # what was sent before it
        send_with_record(counter, [elsewhere], [])
        if len(attempts) == 1:
            raise ConnectionError("the API hung up")
        return "answered"

    retry = RetryPolicy(max_attempts=2, base_delay=0.0, retryable=lambda _: True)
    execute(journal, "wf", "r1", lambda run: run.step("s0", call, retry=retry))
    assert attempts == [0, 1]  # the failed attempt's write went before the retry
    assert own_client.get(elsewhere) == b"2"  # and the answered one's with the record
    assert send_with_record(counter, [elsewhere], []) is None  # outside a step: sent at once
    assert own_client.get(elsewhere) == b"3"


def test_a_run_read_with_the_start_up_checks_costs_no_round_trip_of_its_own(
    journal: Journal, own_client: redis.Redis, own_redis_url: str, prefix: str
) -> None:
    """A command line reads a run before opening it: with its start-up checks, in one trip."""
    execute(journal, "wf", "r1", steps(2))
    prefetch = Prefetch(Keyspace(prefix).run("wf", "r1"))
    views: list[RunView] = []

    def start_and_read() -> None:
        # RESP2 and no client name: a new connection's handshake is not what is counted.
        client = connect_checked(
            own_redis_url, SystemClock(), prefetch=prefetch, protocol=2, driver_info=None
        )
        views.append(
            inspect_run(Journal(client, keyspace=Keyspace(prefix)), "wf", "r1", prefetched=prefetch)
        )

    sent = round_trips(own_client, start_and_read)
    assert sent == ["MULTI"]
    assert views[0] == inspect_run(journal, "wf", "r1")
    assert [record.key for record in views[0].steps] == ["s0", "s1"]
    assert prefetch.snapshot is None  # taken: a later view reads afresh, never a stale one
