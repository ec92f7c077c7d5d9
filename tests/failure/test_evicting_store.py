"""A journal store that evicts keys is refused at start, by the command line and the worker.

Under an evicting ``maxmemory-policy`` a full server deletes keys silently: a lease, a step
record, a dispatcher's marker (an evicted marker re-queued a week already sent). Each process
refuses such a store before it writes anything, in one line: ``digest run`` exits 2, a
``celery -A tasks worker`` exits 2 before taking a delivery.
"""

from __future__ import annotations

import subprocess

import pytest
import redis

from tests.failure.conftest import RUN
from tests.support import BIN, ROOT, Deployment, ThrowawayValkeys

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-ttl"])
def test_an_evicting_store_is_refused_by_the_command_line_and_the_worker(
    policy: str, deployment: Deployment, throwaway_valkeys: ThrowawayValkeys
) -> None:
    sock = throwaway_valkeys.start("--appendonly", "yes", "--maxmemory-policy", policy)
    deployment.env.update(REDIS_URL=f"unix://{sock}", CELERY_BROKER_URL=f"redis+socket://{sock}")

    ran = deployment.cli("run", RUN)
    worker = subprocess.run(
        [str(BIN / "celery"), "-A", "tasks", "worker", "--concurrency=1", "--without-gossip"],
        cwd=ROOT,
        env=deployment.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    for refused in (ran, worker):
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "Traceback" not in refused.stderr, refused.stderr
        # Celery warns on its own that it runs as root; the refusal is one line of its own.
        [line] = [line for line in refused.stderr.splitlines() if line.startswith("digest:")]
        assert line.startswith("digest: the journal store at "), line
        assert f"maxmemory-policy {policy}" in line and "noeviction" in line
    assert len(ran.stderr.splitlines()) == 1, ran.stderr
    assert ran.stdout == ""
    assert redis.Redis(unix_socket_path=str(sock)).dbsize() == 0  # nothing written
    assert deployment.outbox() == []
