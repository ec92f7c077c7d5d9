"""The due sweep: claims each due run once across racing sweepers, and finds lost ones again.

Also the rule behind it: no countdown longer than a fraction of the broker's visibility
timeout, since a Redis broker redelivers an unacked message after that timeout (the retries'
countdowns are in ``test_durable.py``, the digest app's cap in ``tests/tasks/worker/test_app.py``).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest
from celery import Celery

from journal import Journal, ManualClock, Outcome, Run, workflow
from journal._clock import millis
from journal._schema.meta import Wait
from journal.integrations.celery import Durable
from tests.conftest import MakeJournal
from tests.support import execute, only_index

T0 = 1_800_000_000.0
SWEEPERS = 20
ROOT = Path(__file__).resolve().parents[2]


def napper(seconds: float, calls: list[str] | None = None) -> Callable[[Run], str]:
    """A workflow that sleeps, then notes in ``calls`` that it went on."""

    def after(run: Run) -> str:
        if calls is not None:
            calls.append(run.run_id)
        return "after"

    def body(run: Run) -> str:
        run.sleep("nap", seconds)
        return str(run.step("after", lambda: after(run)))

    return body


def test_racing_sweepers_claim_each_due_run_exactly_once(make_journal: MakeJournal) -> None:
    clock = ManualClock(T0)
    journal: Journal = make_journal(clock=clock)
    due = [f"due{i}" for i in range(12)]
    later = [f"later{i}" for i in range(3)]
    for run_id in due:
        assert execute(journal, "wf", run_id, napper(10)).status == "waiting"
    for run_id in later:
        execute(journal, "wf", run_id, napper(1000))
    clock.advance(10)
    sweepers: list[Journal] = [make_journal(clock=clock) for _ in range(SWEEPERS)]
    barrier = threading.Barrier(SWEEPERS)
    claimed: list[str] = []
    lock = threading.Lock()

    def sweep(sweeper: Journal) -> None:
        barrier.wait(timeout=10)
        runs = sweeper.claim_due()
        with lock:
            claimed.extend(keys.run for keys in runs)

    threads = [threading.Thread(target=sweep, args=(s,)) for s in sweepers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)

    assert Counter(claimed) == Counter(f"wf:{run_id}" for run_id in due)
    rearmed = millis(T0 + 10 + journal.settings.rearm_after)
    for run_id in due:
        assert journal.client.zscore(only_index(journal).due, f"wf:{run_id}") == rearmed
    for run_id in later:
        assert journal.client.zscore(only_index(journal).due, f"wf:{run_id}") == millis(T0 + 1000)


def test_a_claimed_run_whose_message_was_lost_is_claimed_again_later(
    make_journal: MakeJournal,
) -> None:
    clock = ManualClock(T0)
    journal: Journal = make_journal(clock=clock, rearm_after=120.0)
    execute(journal, "wf", "r1", napper(10))
    assert journal.claim_due() == []
    clock.advance(10)
    assert [keys.run for keys in journal.claim_due()] == ["wf:r1"]
    assert journal.claim_due() == []  # its message is on its way; nobody sends another
    clock.advance(119.999)
    assert journal.claim_due() == []
    clock.advance(0.001)
    assert [keys.run for keys in journal.claim_due()] == ["wf:r1"]  # that message was lost

    assert execute(journal, "wf", "r1", napper(10)).status == "done"
    clock.advance(1000)
    assert journal.claim_due() == []


def test_a_sent_run_that_never_opens_is_claimed_with_its_arguments_after_rearm_after(
    make_journal: MakeJournal,
) -> None:
    clock = ManualClock(T0)
    journal: Journal = make_journal(clock=clock, rearm_after=120.0)
    keys = journal.keys("wf", "r1")
    assert journal.expect(keys, {"to": "first@example.org"})
    clock.advance(60)
    assert journal.expect(keys, {"to": "second@example.org"})  # a second send: the first stays
    assert journal.meta(keys).status is None  # not a run yet: nothing opened it
    clock.advance(59.999)
    assert journal.claim_due() == []
    clock.advance(0.001)
    assert [claimed.run for claimed in journal.claim_due()] == ["wf:r1"]  # no delivery came
    assert journal.run_args(keys) == {"to": "first@example.org"}

    assert execute(journal, "wf", "r1", napper(10), args={"to": "started"}).status == "waiting"
    assert journal.run_args(keys) == {"to": "started"}  # the first start freezes its own
    clock.advance(10)
    assert [claimed.run for claimed in journal.claim_due()] == ["wf:r1"]  # the nap's own time


def test_a_run_armed_at_its_send_freezes_the_defaults_of_where_it_first_starts(
    make_journal: MakeJournal,
) -> None:
    journal: Journal = make_journal(clock=ManualClock(T0))

    @workflow("wf", defaults=lambda _: {"to": "worker-default@example.org", "gate": True})
    def wf(run: Run, **options: object) -> dict[str, object]:
        return dict(options)

    assert journal.expect(journal.keys("wf", "r1"), {"to": "sent@example.org"})
    outcome = wf._start("r1", {"to": "sent@example.org"}, journal=journal)
    # The send's options and the worker's defaults, frozen together by the first start: a
    # run frozen at its send would lose the defaults (the gate) and take them from wherever
    # each later start ran.
    assert outcome.result == {"to": "sent@example.org", "gate": True}
    assert journal.meta(journal.keys("wf", "r1")).args == outcome.result


def test_a_run_that_has_opened_keeps_its_own_due_time_when_sent_again(
    make_journal: MakeJournal,
) -> None:
    clock = ManualClock(T0)
    journal: Journal = make_journal(clock=clock, rearm_after=5.0)
    due = only_index(journal).due
    napping, finished = journal.keys("wf", "napping"), journal.keys("wf", "finished")
    execute(journal, "wf", "napping", napper(1000), args={"n": 1})
    execute(journal, "wf", "finished", lambda run: "ok", args={"n": 2})
    assert journal.client.zscore(due, napping.run) == millis(T0 + 1000)
    assert journal.client.zscore(due, finished.run) is None

    assert not journal.expect(napping, {"n": 3})
    assert not journal.expect(finished, {"n": 4})
    assert journal.client.zscore(due, napping.run) == millis(T0 + 1000)
    assert journal.client.zscore(due, finished.run) is None  # a finished run is never re-sent
    assert journal.run_args(napping) == {"n": 1}
    assert journal.run_args(finished) == {"n": 2}


def test_a_running_run_is_due_at_its_lease_expiry_so_a_dead_worker_is_recovered(
    make_journal: MakeJournal,
) -> None:
    clock = ManualClock(T0)
    journal: Journal = make_journal(clock=clock, lease_ttl=30.0, recovery_grace=5.0)
    seen: list[float | None] = []

    def dies(run: Run) -> None:
        run.step("a", lambda: 1)
        seen.append(journal.client.zscore(only_index(journal).due, "wf:r1"))
        raise SystemExit("the worker process ends mid-run")

    with pytest.raises(SystemExit):
        execute(journal, "wf", "r1", dies)
    assert seen == [millis(T0 + 35)]
    clock.advance(34.999)
    assert journal.claim_due() == []
    clock.advance(0.001)
    assert [keys.run for keys in journal.claim_due()] == ["wf:r1"]


def eager_app() -> Celery:
    app = Celery(f"t{uuid.uuid4().hex[:6]}", broker="memory://")
    app.conf.task_always_eager = True
    return app


def test_the_sweep_task_delivers_due_runs_of_registered_workflows(
    make_journal: MakeJournal, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock(T0)
    journal: Journal = make_journal(clock=clock)
    durable = Durable(eager_app(), lambda: journal)
    calls: list[str] = []
    body = napper(10, calls)

    @workflow("wf")
    def wf(run: Run, **options: object) -> str:
        return body(run)

    durable.register(wf, task_name="t.wf")

    for run_id in ["r1", "r2"]:
        execute(journal, "wf", run_id, body, args={"week": run_id})
    execute(journal, "orphan", "r3", napper(10))  # a workflow this app does not know
    assert durable.sweep() == 0

    clock.advance(10)
    assert durable.sweep() == 2

    assert sorted(calls) == ["r1", "r2"]
    for run_id in ["r1", "r2"]:
        meta = journal.meta(journal.keys("wf", run_id))
        assert (meta["status"], meta["deliveries"]) == ("done", "1")
    assert journal.meta(journal.keys("orphan", "r3"))["status"] == "waiting"
    assert "due run orphan:r3 has no workflow registered in this app" in caplog.text
    assert durable.sweep() == 0


def test_a_run_whose_state_cannot_be_read_is_skipped_and_the_rest_of_the_batch_enqueued(
    make_journal: MakeJournal, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock(T0)
    journal: Journal = make_journal(clock=clock)
    app = Celery(f"t{uuid.uuid4().hex[:6]}", broker="memory://")
    app.conf.task_default_queue = queue = f"q{uuid.uuid4().hex[:8]}"
    durable = Durable(app, lambda: journal)

    @workflow("wf")
    def wf(run: Run, **options: object) -> str:
        return napper(10)(run)

    durable.register(wf, task_name="t.wf")

    for run_id in ["r1", "r2", "r3", "r4"]:
        execute(journal, "wf", run_id, napper(10), args={"week": run_id})
    journal.client.hset(journal.keys("wf", "r2").meta, "args", b"{not json")
    journal.client.hset(journal.keys("wf", "r4").meta, "holder", b"\xff\xfe")
    clock.advance(10)

    assert durable.sweep() == 2

    with app.connection_for_read() as connection:
        messages = connection.SimpleQueue(queue)
        payloads = []
        while messages.qsize():
            message = messages.get(timeout=1)
            payloads.append(message.payload[:2])
            message.ack()
    assert payloads == [[["r1"], {"week": "r1"}], [["r3"], {"week": "r3"}]]
    skipped = [r.getMessage() for r in caplog.records if "due sweep skipped" in r.getMessage()]
    assert len(skipped) == 2
    assert "run wf:r2" in skipped[0] and "'meta.args' is corrupt" in skipped[0]
    assert "run wf:r4" in skipped[1] and "'meta.holder' is corrupt" in skipped[1]
    for run_id in ["r2", "r4"]:  # still due: named again by every later sweep until repaired
        assert journal.client.zscore(only_index(journal).due, f"wf:{run_id}") is not None


# -- no long countdowns -----------------------------------------------------------------------


def no_journal() -> Journal:
    raise AssertionError("a countdown is worked out without the journal")


def test_a_wait_gets_a_countdown_only_within_max_countdown() -> None:
    app = Celery(f"t{uuid.uuid4().hex[:6]}", broker="memory://")
    app.conf.task_default_queue = queue = f"q{uuid.uuid4().hex[:8]}"
    durable = Durable(app, no_journal, max_countdown=10.0)

    @workflow("wf")
    def wf(run: Run) -> None:
        return None

    durable.register(wf, task_name="t.wf")

    task = durable.tasks["wf"]
    now = time.time()
    for until in [now + 5, now + 10.5, now + 3600, now - 1, None]:
        wait = Wait("sleep", "sleep:x", until=until)
        durable._wake_soon(task, Outcome("wf:r1", "waiting", wait=wait), "r1", {"to": "a@b"})
    durable._wake_soon(task, Outcome("wf:r1", "done", "x"), "r1", {})

    etas = []
    with app.connection_for_read() as connection:
        messages = connection.SimpleQueue(queue)
        while messages.qsize():
            message = messages.get(timeout=1)
            assert message.payload[:2] == [["r1"], {"to": "a@b"}]
            etas.append(datetime.fromisoformat(message.headers["eta"]).timestamp())
            message.ack()
    assert len(etas) == 1
    assert etas[0] == pytest.approx(now + 5, abs=1.0)
