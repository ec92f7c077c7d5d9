"""A zombie worker: paused past its lease, woken after another took over, it changes nothing.

Worker A's pool child is stopped with SIGSTOP while its model call for the fourth item is held
open at the fake API, so its heartbeat stops with it and the lease expires. Worker B gets a
second delivery of the run, takes the lease (fence 2), replays what A recorded and runs the
rest. B is then held at its own last model call, so it still owns the run when A is woken
with SIGCONT and its held call is answered:

- answered 200, A tries to record the fourth summary and the fenced record script refuses it;
- answered 529, A's retry starts at a step boundary, where ``Heartbeat.ensure`` renews
  synchronously (its last confirmation is stale), fails, and stops the run.

Either way A records nothing and sends nothing: one email, every record from the fourth
summary on carries B's fence and B's answers, and the fake saw 9 calls plus A's one in flight.
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from tests.fakes.gated import GatedFake
from tests.support import JOURNAL, RUN, Deployment, Worker, item_ordered, wait_until

pytestmark = pytest.mark.slow

FOURTH_TITLE = "SSO for the Team plan"


def steps_logged(worker: Worker) -> list[tuple[str, str]]:
    """(``ran`` | ``replayed``, step) for every step the worker's pool logged."""
    return re.findall(
        r"ForkPoolWorker-\d+\] (ran|replayed) (\S+)(?: \[run=[^]]*\])?$", worker.text(), re.M
    )


@pytest.mark.parametrize("woken_to", ["answer", "overloaded"])
def test_a_zombie_worker_records_and_sends_nothing(
    woken_to: str, deployment: Deployment, gated_fake: GatedFake
) -> None:
    fake = gated_fake
    deployment.env.update(fake.env(), DIGEST_CONCURRENCY="1")  # lease TTL 2 s
    zombie_call = fake.gate(4)  # A's call for i4
    winner_last_call = fake.gate(10)  # B's compose: B still holds the run when A wakes
    if woken_to == "overloaded":
        fake.fail_next(529, contains=FOURTH_TITLE)  # A's call for i4, the first with that title
    client = deployment.client()
    keys = deployment.runtime().journal.keys("digest", RUN)

    a = deployment.worker("a", concurrency=1)
    assert deployment.cli("enqueue", RUN).returncode == 0
    fake.wait_for_calls(4, timeout=30)
    [zombie] = a.children()
    os.kill(zombie, signal.SIGSTOP)
    try:
        assert set(client.hkeys(keys.steps)) == {key.encode() for key in JOURNAL[:4]}

        b = deployment.worker("b", concurrency=1)
        assert deployment.cli("enqueue", RUN).returncode == 0  # A's only slot is taken
        fake.wait_for_calls(10, timeout=30)
        assert client.hget(keys.meta, "fence") == b"2"
        journal_while_b_holds = client.hgetall(keys.steps)
        assert len(journal_while_b_holds) == 9  # select, eight summaries; compose is held
    finally:
        os.kill(zombie, signal.SIGCONT)
    zombie_call.set()

    wait_until(lambda: "'status': 'lease-lost'" in a.text(), 20, "the zombie to give up")
    assert client.hgetall(keys.steps) == journal_while_b_holds  # the zombie wrote nothing
    if woken_to == "answer":
        assert "'summarize:i4' refused: the run is now held by 2:" in a.text()
    else:
        assert "lease lost (the lease expired or was taken over)" in a.text()
    winner_last_call.set()
    wait_until(lambda: deployment.view(RUN).status == "done", 20, "the winner to finish")

    assert [path.name for path in deployment.outbox()] == [f"digest-{RUN}.json"]
    assert fake.calls == 10  # nine, plus the zombie's one in flight
    assert fake.calls_for(FOURTH_TITLE) == 3  # A's and B's summary, B's opening
    assert [request.status for request in fake.requests].count(529) == (woken_to == "overloaded")
    view = deployment.view(RUN)
    assert item_ordered(view.steps) == JOURNAL
    assert [(record.key, record.fence) for record in view.steps] == [
        (key, 1 if index < 4 else 2) for index, key in enumerate(JOURNAL)
    ]
    results = {record.key: record.result for record in view.steps}
    assert results["summarize:i4"]["text"] == f"summary of {FOURTH_TITLE} (call 5)"
    assert results["compose"]["text"].endswith("(call 10)")
    assert view.meta["fence"] == "2"
    assert view.meta["starts"] == "2"
    assert steps_logged(a) == [("ran", key) for key in JOURNAL[:4]]
    assert steps_logged(b) == [("replayed", key) for key in JOURNAL[:4]] + [
        ("ran", key) for key in JOURNAL[4:]
    ]
    assert "'model_calls': 6" in b.text() and "'ran': 9, 'replayed': 4" in b.text()
    assert "'status': 'done'" not in a.text()
    # Nothing the zombie did re-armed the finished run: no sweep will ever deliver it again.
    assert client.zscore(f"{deployment.env['DIGEST_KEY_PREFIX']}:due", f"digest:{RUN}") is None


def test_a_finished_run_found_in_the_due_index_is_delivered_once_then_removed(
    deployment: Deployment,
) -> None:
    deployment.env.update(DIGEST_OFFLINE="1")
    assert deployment.cli("run", RUN).returncode == 0
    client = deployment.client()
    due, run = f"{deployment.env['DIGEST_KEY_PREFIX']}:due", f"digest:{RUN}"
    keys = deployment.runtime().journal.keys("digest", RUN)
    assert client.zscore(due, run) is None
    client.zadd(due, {run: 0})  # a late index write from an older holder or version
    deployment.worker("a", concurrency=1)
    deployment.beat()  # sweeps every second

    wait_until(lambda: client.zscore(due, run) is None, 20, "the ended run to leave the index")
    delivered = int(client.hget(keys.meta, "deliveries") or 0)
    assert delivered == 1  # swept once, found done, removed
    time.sleep(3)  # three more sweeps
    assert int(client.hget(keys.meta, "deliveries") or 0) == delivered
    assert len(deployment.outbox()) == 1
