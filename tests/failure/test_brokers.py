"""The pool-child kill and the duplicate deliveries again, with RabbitMQ as the broker.

RabbitMQ hands a killed child's message back when the worker rejects it, and a dead worker's
when its channel closes, instead of after a visibility timeout; Celery keeps its results in
the journal's Redis, as it has no AMQP result backend. Each test gets its own queue on the
shared broker (``DIGEST_QUEUE``) and its own key prefix on the shared Redis, and removes both
afterwards. They run when ``TEST_AMQP_URL`` names a RabbitMQ (``.ci/run`` sets it where one
answers) and are skipped, with that reason, elsewhere.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator

import pytest
from kombu.connection import Connection

from tests.failure.test_duplicates import duplicate_deliveries
from tests.failure.test_worker_kills import child_killed_mid_call
from tests.fakes.anthropic_server import FakeAnthropic
from tests.support import Deployment

pytestmark = pytest.mark.slow

AMQP_URL = os.environ.get("TEST_AMQP_URL", "")


@pytest.fixture(params=["embedded-journal", "shared-redis-journal"])
def on_rabbitmq(request: pytest.FixtureRequest, live: Deployment) -> Iterator[Deployment]:
    """``live`` with RabbitMQ as the broker, on a queue of its own.

    The journal is the deployment's embedded server (only ``CELERY_BROKER_URL`` set, the
    documented default), or the session's shared Redis server (``REDIS_URL``).
    """
    if not AMQP_URL:
        pytest.skip("RabbitMQ tests need TEST_AMQP_URL, e.g. amqp://guest:guest@127.0.0.1:5672//")
    try:
        with Connection(AMQP_URL, connect_timeout=3) as connection:
            connection.ensure_connection(max_retries=1)
    except Exception as exc:
        pytest.fail(
            f"RabbitMQ at {AMQP_URL} is not reachable ({exc}); start it or set TEST_AMQP_URL"
        )
    queue = f"digest-test-{uuid.uuid4().hex[:12]}"
    # Below 90% of RabbitMQ's default 30 min consumer timeout, or the worker refuses to start.
    live.env.update(CELERY_BROKER_URL=AMQP_URL, DIGEST_QUEUE=queue, DIGEST_TASK_TIME_LIMIT="1500")
    if request.param == "shared-redis-journal":
        live.env["REDIS_URL"] = request.getfixturevalue("shared_redis_url")
    yield live
    live.close()
    with Connection(AMQP_URL, connect_timeout=3) as connection:
        channel = connection.default_channel
        channel.queue_delete(queue)
        channel.exchange_delete(queue)  # Celery declares an exchange named after the queue
    if request.param == "shared-redis-journal":
        drop_keys(live)


def drop_keys(deployment: Deployment) -> None:
    """Remove the deployment's keys and its tasks' results from the shared Redis."""
    client = deployment.client()
    prefix = deployment.env["DIGEST_KEY_PREFIX"]
    leftovers = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    logs = "".join(log.read_text(errors="replace") for log in deployment.state_dir.glob("*.log"))
    tasks = set(re.findall(r"Task tasks\.digest\[([0-9a-f-]+)\] received", logs))
    leftovers += [f"celery-task-meta-{task}" for task in tasks]
    if leftovers:
        client.delete(*leftovers)


def test_pool_child_killed_mid_call_on_rabbitmq(
    on_rabbitmq: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    assert on_rabbitmq.config.broker_url == AMQP_URL
    recovery = child_killed_mid_call(on_rabbitmq, fake_anthropic)
    assert recovery < 8, recovery  # the dead child is taken over at once, not its 30 s lease
    print(f"rabbitmq child SIGKILL: done {recovery:.1f}s after the kill")


def test_ten_duplicates_on_rabbitmq(on_rabbitmq: Deployment, fake_anthropic: FakeAnthropic) -> None:
    seen = duplicate_deliveries(on_rabbitmq, fake_anthropic)
    print(f"rabbitmq duplicates: {seen}")
