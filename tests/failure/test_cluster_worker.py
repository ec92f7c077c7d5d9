"""A whole Celery worker killed mid-run with the journal on a 3-master, 3-replica cluster.

The same scenario as ``test_worker_kills.py``'s whole-worker kill, with ``REDIS_URL`` naming a
cluster node and the broker a standalone server: beat's due sweep, reading every index shard,
hands the run to a second worker, which replays what the first recorded.
"""

from __future__ import annotations

import time

import pytest

from tests.cluster import ValkeyCluster
from tests.failure.conftest import enqueue, log_problems, wait_for_status
from tests.failure.test_worker_kills import CALL_TIME, assert_resumed_once, hold_mid_summaries
from tests.fakes.anthropic_server import FakeAnthropic
from tests.support import Deployment, ThrowawayValkeys

pytestmark = pytest.mark.slow


def test_a_worker_killed_mid_run_on_a_cluster_is_replaced_through_the_sweep(
    live: Deployment,
    fake_anthropic: FakeAnthropic,
    valkey_cluster: ValkeyCluster,
    throwaway_valkeys: ThrowawayValkeys,
) -> None:
    broker = throwaway_valkeys.start()
    live.env.update(
        REDIS_URL=valkey_cluster.url,
        CELERY_BROKER_URL=f"redis+socket://{broker}",
        DIGEST_JOURNAL_SHARDS="6",
        DIGEST_WAIT_REPLICAS="1",
        DIGEST_CONCURRENCY="1",
    )
    fake_anthropic.delay = CALL_TIME
    first = live.worker("a", concurrency=1)
    live.beat()
    enqueue(live)
    hold_mid_summaries(live, fake_anthropic)
    first.kill()
    killed = time.monotonic()
    first.process.wait(timeout=10)
    fake_anthropic.release()
    fake_anthropic.delay = 0
    second = live.worker("b", concurrency=1)
    wait_for_status(live, "done", 30)
    recovery = time.monotonic() - killed

    assert_resumed_once(live, fake_anthropic, final_fence=2)
    assert "due sweep enqueued 1 run(s)" in second.text()
    assert log_problems(second) == []
    print(f"cluster, worker SIGKILL: done {recovery:.1f}s after the kill")
