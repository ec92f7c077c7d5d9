"""The step contract, on real Redis and on fakeredis."""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import fakeredis
import pytest
import redis

from journal import Journal, Keyspace, ManualClock, RetryPolicy, Run, StepEvent
from journal.errors import (
    CorruptJournal,
    Fenced,
    LeaseBusy,
    LeaseLost,
    ReplayMismatch,
    UnserializableResult,
)
from tests.conftest import MakeJournal
from tests.support import as_bytes, as_text, execute, only_index, wait_until


def test_a_step_runs_once_and_a_later_attempt_replays_it(make_journal: MakeJournal) -> None:
    journal = make_journal()
    calls: list[int] = []

    def body(run: Run) -> int:
        return run.step("x", lambda: calls.append(1) or len(calls))

    first = execute(journal, "wf", "r1", body)
    journal.client.hdel(journal.keys("wf", "r1").meta, "status")  # force a second execution
    events: list[StepEvent] = []
    second = execute(journal, "wf", "r1", body, on_step=events.append)
    assert (first.result, second.result) == (1, 1)
    assert len(calls) == 1
    assert events == [StepEvent("x", True, "step", 1)]
    assert (second.ran, second.replayed) == (0, 1)


def test_a_finished_run_is_already_done_and_does_not_run(make_journal: MakeJournal) -> None:
    journal = make_journal()
    calls: list[int] = []
    execute(journal, "wf", "r1", lambda run: run.step("x", lambda: calls.append(1) or "v"))
    again = execute(journal, "wf", "r1", lambda run: run.step("x", lambda: calls.append(1) or "w"))
    assert again.status == "already-done"
    assert again.result == "v"
    assert calls == [1]


def test_the_record_holds_seq_attempt_fence_and_times(make_journal: MakeJournal) -> None:
    journal = make_journal(clock=ManualClock(1000.0))
    execute(journal, "wf", "r1", lambda run: [run.step("a", lambda: 1), run.step("b", lambda: 2)])
    raw = journal.client.hgetall(journal.keys("wf", "r1").steps)
    import orjson

    records = {as_text(k): orjson.loads(v) for k, v in raw.items()}
    assert records["a"] == {
        "result": 1,
        "seq": 1,
        "attempt": 1,
        "fence": 1,
        "started_at": 1_000_000,
        "finished_at": 1_000_000,
        "kind": "step",
    }
    assert records["b"]["seq"] == 2


def test_crash_mid_run_resumes_without_repeating_finished_steps(make_journal: MakeJournal) -> None:
    journal = make_journal(lease_ttl=0.5)
    calls: list[str] = []

    class Crash(Exception):
        pass

    def call(name: str) -> str:
        calls.append(name)
        return name.upper()

    def body(crash: bool) -> Callable[[Run], list[str]]:
        def run_body(run: Run) -> list[str]:
            out = []
            for name in ["a", "b", "c"]:
                out.append(run.step(name, functools.partial(call, name)))
                if crash and name == "b":
                    raise Crash()
            return out

        return run_body

    with pytest.raises(Crash):
        execute(journal, "wf", "r1", body(True))
    assert journal.meta(journal.keys("wf", "r1"))["status"] == "failed"
    outcome = execute(journal, "wf", "r1", body(False))
    assert outcome.result == ["A", "B", "C"]
    assert calls == ["a", "b", "c"]
    assert (outcome.ran, outcome.replayed) == (1, 2)


def test_non_json_result_is_refused_at_record_time_naming_the_step(
    make_journal: MakeJournal,
) -> None:
    journal = make_journal()
    with pytest.raises(UnserializableResult, match="'bad'"):
        execute(journal, "wf", "r1", lambda run: run.step("bad", lambda: {1, 2}))
    assert journal.client.hlen(journal.keys("wf", "r1").steps) == 0


def test_corrupt_field_raises_naming_run_and_field(make_journal: MakeJournal) -> None:
    journal = make_journal()
    keys = journal.keys("wf", "r1")
    journal.client.hset(keys.steps, "summarize:i1", b'{"result": "half')
    with pytest.raises(CorruptJournal) as info:
        execute(journal, "wf", "r1", lambda run: run.step("summarize:i1", lambda: "again"))
    assert info.value.run == "wf:r1" and info.value.field == "summarize:i1"
    assert journal.client.hget(keys.steps, "summarize:i1") == b'{"result": "half'


def test_a_record_missing_fields_is_corrupt_too(make_journal: MakeJournal) -> None:
    journal = make_journal()
    journal.client.hset(journal.keys("wf", "r1").steps, "x", b'{"result": 1}')
    with pytest.raises(CorruptJournal, match="'x'"):
        execute(journal, "wf", "r1", lambda run: run.step("x", lambda: 2))


def test_drift_inserting_a_step_before_recorded_ones(make_journal: MakeJournal) -> None:
    journal = make_journal()
    keys = journal.keys("wf", "r1")

    def v1(run: Run) -> None:
        run.step("select", lambda: 1)
        run.step("compose", lambda: 2)
        raise RuntimeError("stop before done")

    with pytest.raises(RuntimeError):
        execute(journal, "wf", "r1", v1)

    def v2(run: Run) -> None:
        run.step("select", lambda: 1)
        run.step("enrich", lambda: 3)  # new code, inserted before a recorded step
        run.step("compose", lambda: 2)

    with pytest.raises(ReplayMismatch) as info:
        execute(journal, "wf", "r1", v2)
    assert (info.value.recorded, info.value.requested) == ("compose", "enrich")
    assert "compose" in str(info.value) and "enrich" in str(info.value)
    assert journal.client.hexists(keys.steps, "enrich") == 0


def test_appending_a_step_after_recorded_ones_is_not_drift(make_journal: MakeJournal) -> None:
    journal = make_journal()

    def v1(run: Run) -> None:
        run.step("a", lambda: 1)
        raise RuntimeError("crash")

    with pytest.raises(RuntimeError):
        execute(journal, "wf", "r1", v1)
    outcome = execute(
        journal, "wf", "r1", lambda run: [run.step("a", lambda: 9), run.step("b", lambda: 2)]
    )
    assert outcome.result == [1, 2]


def test_map_records_each_item_and_a_resumed_map_runs_only_the_rest(
    make_journal: MakeJournal,
) -> None:
    journal = make_journal()
    calls: list[str] = []
    lock = threading.Lock()

    def summarize(item: str) -> str:
        with lock:
            calls.append(item)
        if item == "d" and len(calls) < 10:
            raise RuntimeError("boom on d")
        return item * 2

    def body(run: Run) -> list[str]:
        run.step("select", lambda: 0)
        out = run.map("summarize", list("abcdef"), summarize, key=lambda i: i, concurrency=1)
        run.step("compose", lambda: 1)
        return out

    with pytest.raises(RuntimeError, match="boom"):
        execute(journal, "wf", "r1", body)
    assert calls == list("abcd")  # e and f were never started
    calls.extend(["x"] * 10)  # let d succeed now
    outcome = execute(journal, "wf", "r1", body)
    assert outcome.result == ["aa", "bb", "cc", "dd", "ee", "ff"]
    assert calls[-3:] == ["d", "e", "f"]


def test_map_runs_n_at_a_time(make_journal: MakeJournal) -> None:
    journal = make_journal()
    running = 0
    peak = 0
    lock = threading.Lock()

    def work(item: int) -> int:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.05)
        with lock:
            running -= 1
        return item

    outcome = execute(
        journal, "wf", "r1", lambda run: run.map("m", list(range(9)), work, key=str, concurrency=3)
    )
    assert outcome.result == list(range(9))
    assert peak == 3


def test_map_records_each_answer_at_once_and_reports_in_item_order(
    make_journal: MakeJournal,
) -> None:
    """c answers first, then b, then a: each is recorded before the next one answers.

    A finished answer held back in memory behind a slower one is paid again after a crash;
    here b answers only once c is in the journal, and a only once b is.
    """
    journal = make_journal()
    keys = journal.keys("wf", "r1")
    finished: list[str] = []
    seen: list[tuple[str, list[str]]] = []

    def journal_holds(step: str) -> bool:
        return bool(journal.client.hexists(keys.steps, step))

    def call(item: str) -> str:
        if item != "c":  # the next item's answer must be durable before this one's comes
            later = f"s:{chr(ord(item) + 1)}"
            wait_until(lambda: journal_holds(later), 5, f"{later} recorded before {item} answers")
        finished.append(item)
        return item.upper()

    def on_step(event: StepEvent) -> None:
        # What a crash at this point would leave behind: the journal at the report.
        seen.append((event.key, sorted(as_text(k) for k in journal.client.hkeys(keys.steps))))

    outcome = execute(
        journal,
        "wf",
        "r1",
        lambda run: run.map("s", ["a", "b", "c"], call, key=str, concurrency=3),
        on_step=on_step,
    )
    assert outcome.result == ["A", "B", "C"]
    assert finished == ["c", "b", "a"]
    everything = ["s:a", "s:b", "s:c"]
    assert seen == [("s:a", everything), ("s:b", everything), ("s:c", everything)]
    records = journal.client.hgetall(keys.steps)
    seqs = {as_text(key): json.loads(raw)["seq"] for key, raw in records.items()}
    assert seqs["s:a"] < seqs["s:b"] < seqs["s:c"]  # numbered in item order all the same


def test_a_failed_map_item_does_not_hold_back_the_items_after_it(make_journal: MakeJournal) -> None:
    journal = make_journal()
    events: list[str] = []
    all_started = threading.Barrier(3, timeout=5)

    def call(item: str) -> str:
        all_started.wait()
        if item == "a":
            raise RuntimeError("boom on a")
        return item

    with pytest.raises(RuntimeError, match="boom on a"):
        execute(
            journal,
            "wf",
            "r1",
            lambda run: run.map("s", ["a", "b", "c"], call, key=str, concurrency=3),
            on_step=lambda event: events.append(event.key),
        )
    assert events == ["s:b", "s:c"]
    resumed: list[tuple[str, bool]] = []
    outcome = execute(
        journal,
        "wf",
        "r1",
        lambda run: run.map("s", ["a", "b", "c"], str.upper, key=str, concurrency=3),
        on_step=lambda event: resumed.append((event.key, event.replayed)),
    )
    assert outcome.result == ["A", "b", "c"]
    assert resumed == [("s:a", False), ("s:b", True), ("s:c", True)]


def test_map_group_may_complete_in_any_order_without_drift(make_journal: MakeJournal) -> None:
    journal = make_journal()
    keys = journal.keys("wf", "r1")

    def first(run: Run) -> None:
        run.step("select", lambda: 0)
        run.map("s", ["a", "b", "c"], lambda i: i, key=str, concurrency=3)
        raise RuntimeError("crash before compose")

    with pytest.raises(RuntimeError):
        execute(journal, "wf", "r1", first)
    journal.client.hdel(keys.steps, "s:a")  # as if a had not completed before the crash
    outcome = execute(
        journal,
        "wf",
        "r1",
        lambda run: [
            run.step("select", lambda: 0),
            run.map("s", ["a", "b", "c"], str.upper, key=str),
        ],
    )
    assert outcome.result == [0, ["A", "b", "c"]]


def test_deterministic_helpers_replay_their_first_value(make_journal: MakeJournal) -> None:
    clock = ManualClock(5000.0)
    journal = make_journal(clock=clock)
    keys = journal.keys("wf", "r1")

    def body(run: Run) -> list[object]:
        return [run.now("started"), run.uuid("request"), run.idempotency_key("send")]

    first = execute(journal, "wf", "r1", body)
    journal.client.hdel(keys.meta, "status")
    clock.advance(100)
    second = execute(journal, "wf", "r1", body)
    assert first.result == second.result
    assert first.result[0] == 5000.0
    assert first.result[2] == "wf-r1-send"


def test_retry_policy_retries_transient_errors_then_gives_up(make_journal: MakeJournal) -> None:
    clock = ManualClock()
    journal = make_journal(clock=clock)
    attempts: list[int] = []

    class Transient(Exception):
        retry_after = 7.0

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise Transient()
        return "ok"

    policy = RetryPolicy(
        max_attempts=5,
        retryable=lambda e: isinstance(e, Transient),
        retry_after=lambda e: getattr(e, "retry_after", None),
    )
    outcome = execute(journal, "wf", "r1", lambda run: run.step("s", flaky, retry=policy))
    assert outcome.result == "ok"
    assert len(attempts) == 3
    assert clock.slept == [7.0, 7.0]  # the server's hint beats a shorter back-off
    record = journal.client.hget(journal.keys("wf", "r2").steps, "s")
    assert record is None

    attempts.clear()

    def always() -> str:
        attempts.append(1)
        raise Transient()

    with pytest.raises(Transient):
        execute(journal, "wf", "r2", lambda run: run.step("s", always, retry=policy))
    assert len(attempts) == 5


def test_live_lease_blocks_a_second_holder_who_learns_the_time_left(
    make_journal: MakeJournal,
) -> None:
    journal = make_journal(lease_ttl=5.0)
    entered = threading.Event()
    release = threading.Event()

    def slow(run: Run) -> int:
        return run.step("x", lambda: entered.set() or (release.wait(5) and 1))

    worker = threading.Thread(target=execute, args=(journal, "wf", "r1", slow))
    worker.start()
    assert entered.wait(5)
    try:
        with pytest.raises(LeaseBusy) as info:
            execute(journal, "wf", "r1", slow)
        assert 3000 < info.value.remaining_ms <= 5000
    finally:
        release.set()
        worker.join()


def test_an_expired_lease_is_taken_over(make_journal: MakeJournal) -> None:
    journal = make_journal(lease_ttl=0.3)
    keys = journal.keys("wf", "r1")
    journal.client.set(keys.lease, "7:deadworker", px=300)  # left by a crashed holder
    with pytest.raises(LeaseBusy):
        execute(journal, "wf", "r1", lambda run: 1)
    time.sleep(0.4)
    assert execute(journal, "wf", "r1", lambda run: run.step("x", lambda: 1)).status == "done"


def test_heartbeat_keeps_the_lease_through_a_step_of_three_ttls(make_journal: MakeJournal) -> None:
    journal = make_journal(lease_ttl=0.6)
    outcome = execute(
        journal, "wf", "r1", lambda run: run.step("long", lambda: time.sleep(1.8) or 1)
    )
    assert outcome.status == "done"
    assert journal.meta(journal.keys("wf", "r1"))["status"] == "done"


def test_a_holder_whose_lease_was_taken_over_records_nothing_and_stops(
    make_journal: MakeJournal,
) -> None:
    journal = make_journal(lease_ttl=5.0)
    keys = journal.keys("wf", "r1")
    ran_after: list[str] = []

    def body(run: Run) -> None:
        run.step("a", lambda: 1)
        journal.client.set(keys.lease, "99:usurper", px=5000)  # another worker took over
        run.step("b", lambda: 2)
        ran_after.append("side effect")

    with pytest.raises(Fenced):
        execute(journal, "wf", "r1", body)
    assert ran_after == []
    assert journal.client.hkeys(keys.steps) == [b"a"]
    assert journal.client.get(keys.lease) == b"99:usurper"
    assert journal.meta(keys)["status"] == "running"  # the loser wrote no status either


def test_a_paused_holder_whose_lease_was_reacquired_elsewhere_runs_and_records_nothing(
    make_journal: MakeJournal,
) -> None:
    journal = make_journal(lease_ttl=0.3)
    other = make_journal(lease_ttl=5.0)
    keys = journal.keys("wf", "r1")
    effects: list[str] = []
    winner_result: list[object] = []

    def winner(run: Run) -> list[str]:
        return [run.step("a", lambda: "w-a"), run.step("b", lambda: "w-b")]

    def zombie(run: Run) -> None:
        run.step("a", lambda: "zombie-a")
        journal.client.delete(keys.lease)  # the expiry a paused process would suffer
        winner_result.append(execute(other, "wf", "r1", winner).result)
        time.sleep(0.2)  # more than half the TTL without a confirmed renewal
        run.step("b", lambda: effects.append("zombie-b") or "zombie-b")

    with pytest.raises(LeaseLost):
        execute(journal, "wf", "r1", zombie)
    assert effects == []  # the side effect never ran
    assert winner_result == [["zombie-a", "w-b"]]
    assert journal.client.hget(keys.steps, "b") is not None
    assert b"w-b" in as_bytes(journal.client.hget(keys.steps, "b"))


@pytest.mark.parametrize("backend", ["redis", "fakeredis"])
def test_script_flush_mid_run_does_not_break_the_next_record(
    backend: str, own_redis_url: str, prefix: str
) -> None:
    # SCRIPT FLUSH empties the whole server's script cache: never on a server others share.
    if backend == "redis":
        client = redis.Redis.from_url(own_redis_url)
    else:
        client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    journal = Journal(client, keyspace=Keyspace(prefix))

    def body(run: Run) -> list[int]:
        a = run.step("a", lambda: 1)
        journal.client.script_flush()
        return [a, run.step("b", lambda: 2)]

    assert execute(journal, "wf", "r1", body).result == [1, 2]


@pytest.mark.parametrize("backend", ["redis", "fakeredis"])
def test_a_script_cache_emptied_before_every_call_breaks_no_call(
    backend: str, own_redis_url: str, prefix: str
) -> None:
    """Found by test_wait_schedules: a server restarted between SCRIPT LOAD and the retried
    EVALSHA answered NOSCRIPT twice and failed the run. Here every EVALSHA finds the cache
    empty, as if the server restarted right before it."""

    class Forgetful(redis.Redis):
        def execute_command(self, *args: Any, **options: Any) -> Any:
            # redis-py leaves execute_command unannotated.
            if args[0] == "EVALSHA":
                super().execute_command("SCRIPT", "FLUSH")  # type: ignore[no-untyped-call]
            return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]

    class ForgetfulFake(Forgetful, fakeredis.FakeRedis):
        pass

    if backend == "redis":
        client: redis.Redis = Forgetful.from_url(own_redis_url)
    else:
        client = ForgetfulFake(server=fakeredis.FakeServer())
    journal = Journal(client, keyspace=Keyspace(prefix))

    def body(run: Run) -> list[int]:
        return [run.step("a", lambda: 1), run.step("b", lambda: 2)]

    assert execute(journal, "wf", "r1", body).result == [1, 2]
    assert execute(journal, "wf", "r1", body).status == "already-done"


def test_runs_are_indexed_for_listing(make_journal: MakeJournal) -> None:
    journal = make_journal()
    for run_id in ["w1", "w2"]:
        execute(journal, "wf", run_id, lambda run: run.step("x", lambda: 1))
    members = journal.client.zrange(only_index(journal).runs, 0, -1)
    assert sorted(members) == [b"wf:w1", b"wf:w2"]
    assert journal.client.zcard(only_index(journal).due) == 0
