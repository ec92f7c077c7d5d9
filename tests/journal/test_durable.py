"""The Celery integration, by what Celery does: a real worker consumes each delivery.

The worker runs in a thread of the test (Celery's own test worker, solo pool) on an
in-memory broker, so nothing is eager and nothing is read from source: a busy or store-down
delivery is seen as the retry message Celery publishes (its countdown and its retry count),
every other outcome as what the task returned to the worker.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, TypedDict, Unpack

import fakeredis
import pytest
from celery import Celery
from celery._state import _set_task_join_will_block
from celery.contrib.testing.worker import TestWorkController, setup_app_for_worker
from celery.signals import before_task_publish, task_postrun
from celery.worker import state
from kombu.exceptions import OperationalError

from journal import Journal, Keyspace, Run, Settings, workflow
from journal.errors import InvalidArguments, InvalidRunId
from journal.integrations.celery import Durable, DurableWorkflow, at_least_once_settings

VISIBILITY = 3600.0
TIME_LIMIT = 1800.0
NUDGE = "test.nudge"


@dataclass
class Published:
    """The messages a task published: its retry count and countdown, as Celery sent them."""

    task_name: str
    retries: list[int] = field(default_factory=list)
    countdowns: list[float] = field(default_factory=list)
    arrived: threading.Event = field(default_factory=threading.Event)
    wanted: int = 1

    returned: dict[str, dict[str, Any]] = field(default_factory=dict)
    finished: threading.Event = field(default_factory=threading.Event)

    def __call__(self, sender: str | None = None, headers: Any = None, **_: Any) -> None:
        if sender != self.task_name or not headers.get("eta"):
            return
        self.retries.append(headers["retries"])
        eta = datetime.fromisoformat(headers["eta"]).timestamp()
        self.countdowns.append(eta - time.time())
        if len(self.retries) >= self.wanted:
            self.arrived.set()

    def ran(self, sender: Any = None, task_id: str = "", retval: Any = None, **_: Any) -> None:
        """What a delivery returned to the worker (a retry returns its Retry exception)."""
        if getattr(sender, "name", None) == self.task_name and isinstance(retval, dict):
            self.returned[task_id] = retval
            self.finished.set()

    def result(self, task_id: str, timeout: float = 10) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while task_id not in self.returned:
            assert time.monotonic() < deadline, f"task {task_id} returned nothing"
            self.finished.wait(0.01)
            self.finished.clear()
        return self.returned[task_id]


class DurableOptions(TypedDict, total=False):
    """The options of ``Durable`` a test may set; the rest keep their defaults."""

    max_countdown: float
    store_backoff_cap: float


@dataclass
class Deployed:
    """One app, its durable workflow, the journal it uses, and what it published."""

    app: Celery
    durable: Durable
    journal: Journal
    task: DurableWorkflow[Any, Any]
    published: Published
    server: fakeredis.FakeServer


def nudge() -> None:
    """Wakes a worker waiting for a message, so that it notices it should stop."""


def step_a(run: Run, **options: Any) -> Any:
    return run.step("a", lambda: {"options": options})


def build(
    prefix: str, body: Callable[..., Any], **durable_options: Unpack[DurableOptions]
) -> Deployed:
    app = Celery(f"t{uuid.uuid4().hex[:6]}", broker="memory://")
    settings = at_least_once_settings(visibility_timeout=VISIBILITY, task_time_limit=TIME_LIMIT)
    app.conf.update(settings, task_default_queue=f"q{uuid.uuid4().hex[:8]}")
    # The in-memory broker looks for messages once a second unless told otherwise.
    app.conf.broker_transport_options = {
        **settings["broker_transport_options"],
        "polling_interval": 0.01,
    }
    app.task(name=NUDGE)(nudge)
    server = fakeredis.FakeServer()
    journal = Journal(
        fakeredis.FakeRedis(server=server),
        keyspace=Keyspace(prefix),
        settings=Settings(lease_ttl=5.0),
    )
    durable = Durable(app, lambda: journal, **durable_options)

    task = durable.register(workflow("wf")(body), task_name=f"{app.main}.wf")
    return Deployed(app, durable, journal, task, Published(task.name), server)


class Deploy(Protocol):
    """The ``deploy`` fixture: an app running ``body`` as a durable workflow, torn down after."""

    def __call__(
        self, body: Callable[..., Any] = ..., **durable_options: Unpack[DurableOptions]
    ) -> Deployed: ...


@pytest.fixture
def deploy(prefix: str) -> Iterator[Deploy]:
    built: list[Deployed] = []

    def make(
        body: Callable[..., Any] = step_a, **durable_options: Unpack[DurableOptions]
    ) -> Deployed:
        deployed = build(prefix, body, **durable_options)
        before_task_publish.connect(deployed.published, weak=False)
        task_postrun.connect(deployed.published.ran, weak=False)
        built.append(deployed)
        return deployed

    yield make
    for deployed in built:
        before_task_publish.disconnect(deployed.published)
        task_postrun.disconnect(deployed.published.ran)


def hold(journal: Journal, ttl_ms: int) -> None:
    """Another worker, on another host, holds run wf:r1 for ``ttl_ms``."""
    journal.client.set(journal.keys("wf", "r1").lease, "7:elsewhere", px=ttl_ms)


@contextmanager
def worker(deployed: Deployed) -> Iterator[None]:
    """A real worker consuming in a thread of this test, stopped at once afterwards."""
    app = deployed.app
    setup_app_for_worker(app, "WARNING", None)
    controller = TestWorkController(
        app=app,
        hostname=f"test-{uuid.uuid4().hex[:6]}@localhost",
        concurrency=1,
        pool="solo",
        loglevel="WARNING",
        logfile=None,
        ready_callback=None,
        without_heartbeat=True,
        without_mingle=True,
        without_gossip=True,
    )
    thread = threading.Thread(target=controller.start, daemon=True)
    thread.start()
    controller.ensure_started()
    # A starting worker marks the process as one whose tasks must not block on results; this
    # process is a test, whose other tests may (Celery's own start_worker does the same).
    _set_task_join_will_block(False)
    try:
        yield
    finally:
        state.should_terminate = 0
        # The worker's loop checks for shutdown between two waits of up to 2 s for a message:
        # one message ends the wait it is in, the other the last one it makes.
        for _ in range(2):
            app.send_task(NUDGE)
        thread.join(5)
        state.should_terminate = None
    assert not thread.is_alive(), "the test worker did not stop"


# -- retries ----------------------------------------------------------------------------------


def test_a_busy_delivery_retries_after_the_holders_remaining_time_with_no_ceiling(
    deploy: Deploy,
) -> None:
    deployed = deploy()
    hold(deployed.journal, 3_000)
    with worker(deployed):
        deployed.task.apply_async(["r1"], retries=100)  # far past Celery's default ceiling of 3
        assert deployed.published.arrived.wait(5), "no retry was published"
    assert deployed.published.retries[0] == 101
    # What the holder had left (at most 3 s, less what the worker's start took), plus up to 20%
    # jitter: not at once, while the run is still held, nor much later.
    assert 1.0 < deployed.published.countdowns[0] <= 3.0 * 1.2


def test_busy_retries_are_capped_and_end_when_the_lease_frees(
    deploy: Deploy,
) -> None:
    deployed = deploy(max_countdown=0.05)
    deployed.published.wanted = 5  # more than Celery's default max_retries
    hold(deployed.journal, 1_000)
    with worker(deployed):
        sent = deployed.task.delay("r1", to="a@b")
        assert deployed.published.result(sent.id)["status"] == "done"
    assert len(deployed.published.retries) >= 5
    assert deployed.published.retries == list(range(1, len(deployed.published.retries) + 1))
    assert all(countdown <= 0.05 for countdown in deployed.published.countdowns)
    meta = deployed.journal.meta(deployed.journal.keys("wf", "r1"))
    assert int(meta["deliveries"]) == len(deployed.published.retries) + 1


@pytest.mark.parametrize(
    ("retries", "options", "low", "high"),
    [
        (0, {}, 1.0, 1.2),  # 2**0 s plus up to 20%
        (3, {}, 8.0, 9.6),  # doubling
        (100, {}, 60.0, 60.0),  # capped at store_backoff_cap, and never out of retries
        (100, {"max_countdown": 10.0}, 10.0, 10.0),  # and never past max_countdown
    ],
)
def test_a_delivery_while_the_store_is_down_backs_off_exponentially_and_never_gives_up(
    deploy: Deploy,
    retries: int,
    options: DurableOptions,
    low: float,
    high: float,
) -> None:
    deployed = deploy(**options)
    deployed.server.connected = False
    with worker(deployed):
        deployed.task.apply_async(["r1"], retries=retries)
        assert deployed.published.arrived.wait(5), "no retry was published"
    assert deployed.published.retries == [retries + 1]
    assert low - 0.5 < deployed.published.countdowns[0] <= high


def test_deliveries_during_an_outage_run_the_workflow_once_it_is_back(
    deploy: Deploy,
) -> None:
    deployed = deploy(store_backoff_cap=0.05)
    deployed.published.wanted = 4
    deployed.server.connected = False
    with worker(deployed):
        sent = deployed.task.delay("r1")
        assert deployed.published.arrived.wait(5), "the delivery did not keep retrying"
        deployed.server.connected = True
        assert deployed.published.result(sent.id)["status"] == "done"
    assert all(countdown <= 0.05 for countdown in deployed.published.countdowns)


def test_a_retry_the_broker_refuses_puts_the_delivery_back_instead_of_dropping_it(
    deploy: Deploy,
) -> None:
    """Celery rejects without requeueing a message whose retry it cannot publish; with the
    store down too, before the run opened, that message is the run's only record."""
    deployed = deploy(store_backoff_cap=0.05)
    deployed.server.connected = False
    send = deployed.app.amqp.send_task_message
    refused: list[str] = []

    def broker_down_once(producer: Any, name: str, message: Any, **options: Any) -> Any:
        if message.headers.get("eta") and not refused:
            refused.append(name)
            raise OperationalError("the broker is down too")
        return send(producer, name, message, **options)

    deployed.app.amqp.send_task_message = broker_down_once
    with worker(deployed):
        deployed.task.delay("r1")
        assert deployed.published.arrived.wait(5), "the refused delivery was dropped"
    assert refused == [deployed.task.name]
    assert deployed.published.retries == [1]  # the same delivery again, then its retry


# -- results that end a delivery ------------------------------------------------------------


def run_to_result(deployed: Deployed, run_id: str = "r1") -> dict[str, Any]:
    with worker(deployed):
        result = deployed.published.result(deployed.task.delay(run_id).id)
    assert deployed.published.retries == []  # a final answer: not retried, not redelivered
    return result


def test_a_parked_run_is_a_parked_result(deploy: Deploy) -> None:
    deployed = deploy()
    keys = deployed.journal.keys("wf", "r1")
    deployed.journal.client.hset(keys.meta, mapping={"parked": "1", "starts_without_progress": 5})
    result = run_to_result(deployed)
    assert (result["run"], result["status"]) == ("wf:r1", "parked")
    assert "parked after 5 starts without progress" in result["error"]


def test_a_delivery_that_lost_its_lease_is_a_lease_lost_result(
    deploy: Deploy,
) -> None:
    def taken_over(run: Run) -> Any:
        return run.step(
            "a", lambda: run.keys and deployed.journal.client.set(run.keys.lease, "9:b")
        )

    deployed = deploy(taken_over)
    result = run_to_result(deployed)
    assert (result["run"], result["status"]) == ("wf:r1", "lease-lost")
    assert "refused: the run is now held by 9:b" in result["error"]


def test_an_invalid_run_id_is_refused_at_enqueue_and_by_a_worker_and_touches_nothing(
    deploy: Deploy,
) -> None:
    deployed = deploy()
    with pytest.raises(InvalidRunId, match="invalid run id 'no such/run'"):
        deployed.task.delay("no such/run")
    assert deployed.published.arrived.is_set() is False
    # A message from elsewhere (an older client, send_task) is still refused by the worker.
    with worker(deployed):
        raw = deployed.task.task.delay("no such/run")
        result = deployed.published.result(raw.id)
    assert (result["run"], result["status"]) == ("wf:'no such/run'", "invalid")
    assert "invalid run id 'no such/run'" in result["error"]
    assert deployed.journal.client.keys("*") == []


@dataclass(frozen=True)
class Options:
    to: str | None = None
    copies: int = 1


def test_typed_options_are_checked_at_enqueue_and_the_body_gets_them_typed(
    deploy: Deploy,
) -> None:
    deployed = deploy()
    seen: list[Options] = []

    @workflow("typed", options=Options, journal=lambda: deployed.journal)
    def typed(run: Run, options: Options) -> dict[str, Any]:
        seen.append(options)
        return run.step("a", lambda: {"to": options.to, "copies": options.copies})

    delivered = deployed.durable.register(typed, task_name=f"{deployed.app.main}.typed")
    for bad, problem in (
        ({"colour": "red"}, "got an unexpected keyword argument 'colour'"),
        ({"copies": "2"}, "copies='2' is not int"),
    ):
        with pytest.raises(InvalidArguments) as refused:
            delivered.delay("r1", **bad)
        assert str(refused.value) == (
            f"run typed:r1: invalid arguments: {problem}; nothing was started; "
            "the workflow takes to, copies"
        )
    keys = deployed.journal.keys("typed", "r1")
    with worker(deployed):
        delivered.start("r1", Options(to="a@b"))
        deadline = time.monotonic() + 10
        while deployed.journal.meta(keys).get("status") != "done":
            assert time.monotonic() < deadline, "the typed delivery did not finish"
            time.sleep(0.01)
    assert seen == [Options(to="a@b", copies=1)]
    # Only what was given travels and is frozen: a field left at its default is not.
    assert deployed.journal.meta(keys)["args"] == '{"to":"a@b"}'

    # The same workflow runs a run here, with the same journal and the same checks.
    here = typed.start("r2", Options(copies=3))
    assert (here.status, here.result, here.ran) == ("done", {"to": None, "copies": 3}, 1)
    again = typed.start("r2")  # a resumed run replays with the options it froze
    assert (again.status, again.result) == ("already-done", {"to": None, "copies": 3})
    assert seen[-1] == Options(copies=3)
    with pytest.raises(InvalidArguments):
        typed.start("r3", Options(copies="x"))  # type: ignore[arg-type]
    assert deployed.journal.client.exists(deployed.journal.keys("typed", "r3").meta) == 0


def test_a_delivery_returns_the_outcome_and_the_frozen_options(
    deploy: Deploy,
) -> None:
    deployed = deploy()
    with worker(deployed):
        first = deployed.published.result(deployed.task.delay("r1", to="a@b").id)
        again = deployed.published.result(deployed.task.delay("r1").id)
    assert first == {
        "run": "wf:r1",
        "status": "done",
        "result": {"options": {"to": "a@b"}},
        "ran": 1,
        "replayed": 0,
    }
    assert (again["status"], again["result"]) == ("already-done", {"options": {"to": "a@b"}})


# -- what Celery is told --------------------------------------------------------------------


def test_the_at_least_once_settings_are_what_the_app_runs_with(
    deploy: Deploy,
) -> None:
    deployed = deploy()
    conf = deployed.app.conf
    assert conf.task_acks_late is True
    assert conf.task_reject_on_worker_lost is True
    assert conf.worker_prefetch_multiplier == 1
    assert (conf.task_serializer, conf.result_serializer) == ("json", "json")
    assert conf.accept_content == ["json"]
    assert conf.broker_transport_options["visibility_timeout"] == 3600
    assert (conf.task_time_limit, conf.task_soft_time_limit) == (1800, 1620)
    assert conf.worker_cancel_long_running_tasks_on_connection_loss is True
    task = deployed.task.task  # the Celery task the workflow is delivered as
    assert (task.acks_late, task.reject_on_worker_lost, task.max_retries) == (True, True, None)


def test_a_time_limit_the_broker_would_redeliver_under_is_refused() -> None:
    with pytest.raises(ValueError, match="must stay below 90% of the broker's visibility_timeout"):
        at_least_once_settings(visibility_timeout=1000, task_time_limit=900)
    assert at_least_once_settings(visibility_timeout=1000, task_time_limit=899)
