"""Twenty racers at once, on real Redis: one step key recorded once, one lease granted once.

Threads share the process and its Run; processes share nothing but the server, so they
exercise the scripts' atomicity rather than any lock on the Python side.
"""

from __future__ import annotations

import multiprocessing
import queue
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import redis

from journal import Journal, Keyspace, Run, Settings, StepEvent
from journal._lease import Lease
from journal._redis.scripts import Scripts
from journal._schema.keys import RunKeys
from journal._schema.records import Record
from journal.errors import LeaseBusy
from tests.support import acquire, execute, returning

RACERS = 20
TTL_S = 10.0
# Fresh processes forked from a server that imported all this once: spawning twenty
# interpreters costs seconds, forking them from a threaded pytest is unsafe.
PROCESSES = multiprocessing.get_context("forkserver")
PROCESSES.set_forkserver_preload(["redis", "journal", __name__])


@pytest.fixture
def journal(real_redis: redis.Redis, prefix: str) -> Iterator[Journal]:
    yield Journal(real_redis, keyspace=Keyspace(prefix), settings=Settings(lease_ttl=TTL_S))


def racer_record(i: int) -> bytes:
    """A record only racer ``i`` would write, so the stored one names its writer."""
    at = 1_800_000_000_000 + i
    return orjson.dumps(
        {
            "result": {"racer": i},
            "seq": 1,
            "attempt": 1,
            "fence": 1,
            "started_at": at,
            "finished_at": at,
            "kind": "step",
        }
    )


# -- one step key ---------------------------------------------------------------------------


def test_threads_sharing_a_run_record_one_value_and_all_get_it_back(journal: Journal) -> None:
    barrier = threading.Barrier(RACERS)
    returned: dict[int, Any] = {}
    events: list[StepEvent] = []

    def racer(run: Run, i: int) -> None:
        def fn() -> dict[str, int]:
            barrier.wait(timeout=10)  # every racer has missed the journal before any records
            return {"racer": i}

        returned[i] = run.step("same", fn)

    def body(run: Run) -> Any:
        threads = [threading.Thread(target=racer, args=(run, i)) for i in range(RACERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=20)
        return run.step("same", lambda: {"racer": "late"})  # replayed: the stored value

    outcome = execute(journal, "wf", "r1", body, on_step=events.append)
    keys = journal.keys("wf", "r1")
    raw = journal.client.hget(keys.steps, "same")
    assert isinstance(raw, bytes)
    stored = Record.decode(keys.run, "same", raw)
    assert journal.client.hlen(keys.steps) == 1
    assert stored.result["racer"] in range(RACERS)
    assert len(returned) == RACERS
    assert all(value == stored.result for value in returned.values())
    assert outcome.result == stored.result
    assert Counter(event.replayed for event in events) == {False: 1, True: RACERS}


@pytest.fixture
def frequent_thread_switches() -> Iterator[None]:
    """Hand the GIL over every few microseconds, so a race window of one loop is hit."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def test_map_threads_replaying_steps_while_one_records_share_the_run_safely(
    journal: Journal, frequent_thread_switches: None
) -> None:
    """Map items replay steps of their own while another item records the attempt's first.

    That first record reads every record the journal holds for its sequence number while the
    other threads take records out of the same dicts.
    """
    parts = range(1000)

    def first(run: Run) -> None:
        # The state a crash mid-map leaves: items 2-7 had recorded their parts, not their sums.
        for i in range(2, 8):
            for j in parts:
                run.step(f"part:{i}:{j}", returning(j))
        run.map("sum", [0], lambda i: i, key=str)
        raise RuntimeError("crash")

    def second(run: Run) -> list[int]:
        def one(i: int) -> int:
            return sum(run.step(f"part:{i}:{j}", lambda: -1) for j in parts) if i > 1 else i

        return run.map("sum", list(range(8)), one, key=str, concurrency=8)

    with pytest.raises(RuntimeError, match="crash"):
        execute(journal, "wf", "r1", first)
    outcome = execute(journal, "wf", "r1", second)
    assert outcome.result == [0, 1] + [sum(parts)] * 6
    assert (outcome.ran, outcome.replayed) == (7, 1 + 6 * len(parts))
    raw = journal.client.hgetall(journal.keys("wf", "r1").steps)
    seqs = [orjson.loads(record)["seq"] for record in raw.values()]
    assert sorted(seqs) == list(range(1, len(raw) + 1))  # no number handed out twice


def record_in_process(
    url: str, keys: list[str], holder: str, i: int, barrier: Any, results: Any
) -> None:
    client = redis.Redis.from_url(url)
    scripts = Scripts.register(client)
    client.ping()  # connected before the start line
    barrier.wait(timeout=30)
    reply = scripts.record(keys=keys, args=[holder, "same", racer_record(i)])
    results.put((i, reply))


@pytest.mark.slow
def test_processes_with_one_holder_record_one_value_and_all_get_it_back(
    journal: Journal, shared_redis_url: str
) -> None:
    keys = journal.keys("wf", "r1")
    grant = acquire(Lease(keys, journal.backend, 10_000), 0)
    journal.client.script_load(journal.backend.scripts.record.script)  # no racer pays a NOSCRIPT
    barrier = PROCESSES.Barrier(RACERS)
    results = PROCESSES.Queue()
    script_keys = [keys.lease, keys.steps, keys.meta]
    procs = [
        PROCESSES.Process(
            target=record_in_process,
            args=(shared_redis_url, script_keys, grant.holder, i, barrier, results),
        )
        for i in range(RACERS)
    ]
    for proc in procs:
        proc.start()
    replies = dict(results.get(timeout=60) for _ in procs)
    for proc in procs:
        proc.join(timeout=10)
        assert proc.exitcode == 0
    stored = journal.client.hget(keys.steps, "same")
    statuses = Counter(reply if reply == 1 else reply[0] for reply in replies.values())
    assert statuses == {1: 1, 2: RACERS - 1}
    (winner,) = (i for i, reply in replies.items() if reply == 1)
    assert stored == racer_record(winner)
    assert all(reply[1] == stored for reply in replies.values() if reply != 1)
    assert journal.client.hlen(keys.steps) == 1


# -- one lease ------------------------------------------------------------------------------


def test_threads_acquiring_one_lease_yield_one_holder_and_busy_others(journal: Journal) -> None:
    barrier = threading.Barrier(RACERS)
    everyone_tried = threading.Event()
    won: list[int] = []
    busy: list[LeaseBusy] = []

    def body(run: Run) -> None:
        won.append(run.fence)
        assert everyone_tried.wait(20), "the losers never reported"

    def racer() -> None:
        barrier.wait(timeout=10)
        try:
            execute(journal, "wf", "r1", body)
        except LeaseBusy as exc:
            busy.append(exc)
            if len(busy) == RACERS - 1:
                everyone_tried.set()

    threads = [threading.Thread(target=racer) for _ in range(RACERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert won == [1]
    assert_busy(busy, journal.keys("wf", "r1"))
    assert journal.client.get(journal.keys("wf", "r1").fence) == b"1"  # one INCR: one grant
    assert journal.meta(journal.keys("wf", "r1"))["status"] == "done"


def acquire_in_process(
    url: str, prefix: str, i: int, barrier: Any, results: Any, release: Any
) -> None:
    client = redis.Redis.from_url(url)
    journal = Journal(client, keyspace=Keyspace(prefix), settings=Settings(lease_ttl=TTL_S))
    journal.meta(journal.keys("wf", "r1"))  # connect before the start line
    barrier.wait(timeout=30)
    try:
        outcome = execute(journal, "wf", "r1", lambda run: release.wait(30) and run.fence)
    except LeaseBusy as exc:
        results.put((i, "busy", exc))
    else:
        results.put((i, "won", outcome.result))


@pytest.mark.slow
def test_processes_acquiring_one_lease_yield_one_holder_and_busy_others(
    journal: Journal, prefix: str, shared_redis_url: str
) -> None:
    barrier = PROCESSES.Barrier(RACERS)
    results = PROCESSES.Queue()
    release = PROCESSES.Event()
    procs = [
        PROCESSES.Process(
            target=acquire_in_process,
            args=(shared_redis_url, prefix, i, barrier, results, release),
        )
        for i in range(RACERS)
    ]
    for proc in procs:
        proc.start()
    try:
        losers = [results.get(timeout=60) for _ in range(RACERS - 1)]
        with pytest.raises(queue.Empty):
            results.get(timeout=0.2)  # the winner is still inside its run
    finally:
        release.set()
    winner = results.get(timeout=30)
    for proc in procs:
        proc.join(timeout=10)
        assert proc.exitcode == 0
    assert [kind for _, kind, _ in losers] == ["busy"] * (RACERS - 1)
    assert winner[1:] == ("won", 1)
    assert_busy([exc for _, _, exc in losers], journal.keys("wf", "r1"))
    assert journal.client.get(journal.keys("wf", "r1").fence) == b"1"


def assert_busy(busy: list[LeaseBusy], keys: RunKeys) -> None:
    """Every loser learned whom it lost to and for how long: the lease's live remainder."""
    assert len(busy) == RACERS - 1
    assert {exc.run for exc in busy} == {keys.run}
    assert {exc.holder for exc in busy} == {"1"}
    # All tried within moments of the grant, so each saw most of the TTL left, never none.
    assert all(TTL_S * 1000 - 5_000 < exc.remaining_ms <= TTL_S * 1000 for exc in busy)
