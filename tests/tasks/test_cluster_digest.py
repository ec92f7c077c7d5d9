"""The digest end to end on a 3-master, 3-replica Valkey cluster, through the ``digest`` CLI.

The journal and the digest's own keys live on the cluster (``REDIS_URL`` names one node); the
broker is a standalone server apart, since Celery's Redis transport cannot use a cluster.
"""

from __future__ import annotations

import pytest
import redis

from tests.cluster import ValkeyCluster
from tests.support import JOURNAL, RUN, Deployment, ThrowawayValkeys, item_ordered

pytestmark = pytest.mark.slow


def test_a_cluster_store_without_a_broker_of_its_own_is_refused_in_one_line(
    deployment: Deployment, valkey_cluster: ValkeyCluster
) -> None:
    deployment.env["REDIS_URL"] = valkey_cluster.url
    refused = deployment.cli("run", RUN)
    assert refused.returncode == 2
    assert refused.stdout == ""
    assert refused.stderr == (
        f"digest: REDIS_URL={valkey_cluster.url!r} is a Redis Cluster node, which Celery's "
        "Redis transport cannot use as its broker; set CELERY_BROKER_URL to a standalone "
        "Redis\n"
    )


def test_the_digest_runs_crashes_and_resumes_on_a_cluster(
    deployment: Deployment, valkey_cluster: ValkeyCluster, throwaway_valkeys: ThrowawayValkeys
) -> None:
    broker = throwaway_valkeys.start()
    deployment.env.pop("ANTHROPIC_API_KEY", None)
    deployment.env.pop("ANTHROPIC_BASE_URL", None)
    deployment.env.update(
        REDIS_URL=valkey_cluster.nodes[4].url,  # a replica's URL: any node will do
        CELERY_BROKER_URL=f"redis+socket://{broker}",
        DIGEST_JOURNAL_SHARDS="6",
        DIGEST_CONCURRENCY="1",
    )
    crashed = deployment.cli("run", RUN, env={"CRASH": "after:summarize:i3"})
    assert crashed.returncode == 137, crashed.stderr
    runtime = deployment.runtime()
    assert isinstance(runtime.client, redis.RedisCluster)
    view = deployment.view(RUN)
    assert item_ordered(view.steps) == JOURNAL[:4]
    # A crashed CLI on this host is provably gone: the next start takes the lease at once.
    resumed = deployment.cli("run", RUN)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.count("replayed") == 4
    assert resumed.stdout.endswith("email sent (digest-2026-w42)\n")
    assert item_ordered(deployment.view(RUN).steps) == JOURNAL
    assert [p.name for p in deployment.outbox()] == ["digest-2026-w42.json"]
    again = deployment.cli("run", RUN)
    assert again.stdout == (
        "already-done: ended earlier (sent: 8 items, email sent (digest-2026-w42)); "
        "nothing ran in this attempt\n"
    )
    listed = deployment.cli("runs")
    assert listed.returncode == 0 and RUN in listed.stdout
    seen = runtime.client.scard(runtime.keys.seen)
    assert seen == 8
