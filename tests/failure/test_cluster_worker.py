"""A whole Celery worker killed mid-run with the journal on a 3-master, 3-replica cluster.

The same scenario as ``test_worker_kills.py``'s whole-worker kill, with ``REDIS_URL`` naming a
cluster node and the broker a standalone server: beat's due sweep, reading every index shard,
hands the run to a second worker, which replays what the first recorded.
"""

from __future__ import annotations

import pytest

from tests.cluster import ValkeyCluster
from tests.failure.conftest import log_problems
from tests.failure.test_worker_kills import assert_resumed_once, whole_worker_killed_mid_run
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
    _, second, recovery = whole_worker_killed_mid_run(live, fake_anthropic)

    assert_resumed_once(live, fake_anthropic, final_fence=2)
    assert "due sweep enqueued 1 run(s)" in second.text()
    assert log_problems(second) == []
    print(f"cluster, worker SIGKILL: done {recovery:.1f}s after the kill")
