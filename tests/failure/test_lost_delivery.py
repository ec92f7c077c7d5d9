"""A delivery lost before its run ever opened is sent again by the due sweep.

A run that has opened is in the due index for as long as it is not finished, so a worker that
dies holding it is replaced by the sweep. Before it opens, only the broker knows of it: a
worker SIGKILLed with the message reserved (a retry's countdown, a prefetched message) leaves it
unacknowledged until the Redis broker's visibility timeout (an hour by default), and a message
the broker itself lost (a restart that kept only part of its AOF) is gone for good. The fault
campaign's one-hour soak found two weeks that the schedule reached and no worker ever opened.

Every send of a run that has not opened arms it in the due index (``DIGEST_REDELIVER_AFTER``
ahead), with its arguments, so the sweep sends it again unless a delivery opened it by then.
"""

from __future__ import annotations

import json

import pytest

from tests.failure.conftest import RUN, enqueue
from tests.support import Deployment, wait_until

pytestmark = pytest.mark.slow


TO = "lost-and-found@example.org"


def lose_every_queued_message(deployment: Deployment) -> int:
    """Empty the broker's queues (Redis lists): the messages are gone; how many there were."""
    client = deployment.client()
    queues = list(client.scan_iter(_type="list"))
    lost = sum(int(client.llen(queue)) for queue in queues)
    if queues:
        client.delete(*queues)
    return lost


def test_a_run_whose_first_delivery_is_lost_is_delivered_by_the_sweep(
    deployment: Deployment,
) -> None:
    deployment.env.update(DIGEST_OFFLINE="1", DIGEST_REDELIVER_AFTER="2")
    enqueue(deployment, to=TO)
    assert lose_every_queued_message(deployment) == 1
    assert deployment.view(RUN).status == "new"

    deployment.worker("a", concurrency=1)
    deployment.beat()
    wait_until(lambda: deployment.view(RUN).status == "done", 40, "the lost week to be sent")
    view = deployment.view(RUN)
    assert view.meta["deliveries"] == "1"  # the sweep's send; the lost one never arrived
    assert json.loads(view.meta["args"])["to"] == TO  # the lost send's options, kept
    (email,) = deployment.outbox()
    assert json.loads(email.read_text())["to"] == TO
