"""The journal's Redis dies mid-run (kill -9) and comes back on the same data: nothing is lost.

A throwaway Valkey with ``appendonly yes`` and ``appendfsync always`` holds the journal (the
Celery broker stays on the deployment's embedded server). It is killed after three summaries
were recorded, while the fourth model call is held open at the fake API. While it is down the
delivery retries with back-off, and ``digest run`` fails within seconds with one clear line.
Restarted on the same directory, it still holds every step recorded before the kill, and the
run resumes and completes: one email, nine model calls plus the one that was in flight.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from journal.contrib.embedded import embedded_broker_url
from tests.fakes.gated import GatedFake
from tests.support import JOURNAL, RUN, AofValkey, Deployment, item_ordered, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def valkey(tmp_path: Path) -> Iterator[AofValkey]:
    server = AofValkey(tmp_path / "valkey").start()
    yield server
    if server.process is not None and server.process.poll() is None:
        server.kill()


def test_redis_killed_mid_run_then_restarted(
    deployment: Deployment, valkey: AofValkey, gated_fake: GatedFake
) -> None:
    fake = gated_fake
    deployment.env.update(
        fake.env(),
        REDIS_URL=valkey.url,
        CELERY_BROKER_URL=embedded_broker_url(deployment.state_dir),
        DIGEST_CONCURRENCY="1",
    )
    in_flight = fake.gate(4)  # the fourth summary's call, held while Redis dies
    client = redis.Redis.from_url(valkey.url)
    keys = deployment.runtime().journal.keys("digest", RUN)
    worker = deployment.worker("w", concurrency=1)

    assert deployment.cli("enqueue", RUN).returncode == 0
    fake.wait_for_calls(4, timeout=30)
    recorded = client.hgetall(keys.steps)
    assert set(recorded) == {key.encode() for key in JOURNAL[:4]}

    valkey.kill()
    in_flight.set()  # the answer arrives; its record cannot be written
    wait_until(
        lambda: worker.text().count("cannot reach the journal store") >= 2,
        20,
        "two deliveries retried while Redis is down",
    )

    started = time.monotonic()
    down = deployment.cli("run", RUN, timeout=20)
    took = time.monotonic() - started

    assert down.returncode == 1
    assert down.stdout == ""
    [line] = down.stderr.splitlines()
    assert line.startswith(f"failed: cannot reach the journal store at {valkey.url} (Error 111")
    assert line.endswith("; check that Redis is running and REDIS_URL is right")
    assert took < 10, f"digest run took {took:.1f}s to report the dead store"

    valkey.start()
    assert client.hgetall(keys.steps) == recorded  # every record before the kill survived
    wait_until(lambda: deployment.outbox(), 40, "the resumed run to send its email")
    wait_until(lambda: client.hget(keys.meta, "status") == b"done", 10, "the run to finish")

    assert [path.name for path in deployment.outbox()] == [f"digest-{RUN}.json"]
    assert fake.calls == 10  # nine, plus the fourth summary's answer that was never recorded
    assert fake.calls_for("SSO for the Team plan") == 3  # twice summarized, once in the opening
    view = deployment.view(RUN)
    assert item_ordered(view.steps) == JOURNAL
    # Back-off while Redis was down: 1 s, then 2 s (each plus up to 20% jitter).
    countdowns = [
        float(c) for c in re.findall(r"retrying this delivery in ([\d.]+)s", worker.text())
    ]
    assert 1.0 <= countdowns[0] <= 1.2 and 2.0 <= countdowns[1] <= 2.4, countdowns
    # The run is done in Redis before Celery logs the task's success: wait for that line.
    wait_until(lambda: "'status': 'done'" in worker.text(), 10, "the task's success line")
    assert worker.text().count("'status': 'done'") == 1
    assert "'model_calls': 6" in worker.text() and "'ran': 9, 'replayed': 4" in worker.text()


def test_a_store_that_is_also_the_broker_dying_before_the_run_opens_loses_no_week(
    deployment: Deployment, valkey: AofValkey
) -> None:
    """Found by the fault campaign: one Valkey as store and broker, down between a message's
    receipt and its run's open. The delivery's retry could not be published, Celery rejected
    the message without requeueing it, and the run had no journal for a sweep to find: the
    week was never sent. Here the pool child holds the received message while Valkey dies."""
    deployment.env.update(
        REDIS_URL=valkey.url,
        CELERY_BROKER_URL=f"redis+socket://{valkey.socket}",
        DIGEST_CONCURRENCY="1",
        DIGEST_OFFLINE="1",
    )
    worker = deployment.worker("w", concurrency=1)
    [child] = worker.children()
    os.kill(child, signal.SIGSTOP)  # the message reaches it, and waits in its pipe
    try:
        assert deployment.cli("enqueue", RUN).returncode == 0
        wait_until(lambda: "] received" in worker.text(), 20, "the message's receipt")
        valkey.kill()
    finally:
        os.kill(child, signal.SIGCONT)
    wait_until(
        lambda: re.search(
            r"ForkPoolWorker.*(cannot reach the journal store|Failed operation|outside body)",
            worker.text(),
        ),
        20,
        "the delivery to meet the dead store",
    )
    valkey.start()
    wait_until(lambda: deployment.outbox(), 60, f"the week's email (log: {worker.log})")
    assert [path.name for path in deployment.outbox()] == [f"digest-{RUN}.json"]
