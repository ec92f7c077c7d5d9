"""Workers on two hosts, the store and broker on a third, and a host cut off mid run.

The hosts are network namespaces on one switch (``tests/hosts.py``); the test process is a
fourth host that serves the fake model API and an SMTP sink. One Valkey on the store host,
AOF fsynced at every write, is both the journal store and the Celery broker, reached over
TCP as a managed Redis would be. Each worker host runs a real ``celery -A tasks worker``.

Cutting a host sets its switch port down, as a pulled cable would: the worker neither crashes
nor sees a closed connection, it just stops hearing back, from the store and from the model
API. Its lease expires on the store, the due sweep (beat runs on the store host) hands the
run to the other host, and when the cable is plugged back the cut-off worker's late answers
and writes meet a lease that is no longer its own. The model timeout (20 s by default)
outlasts the cut, so the cut-off worker is still waiting on its calls when the cable comes
back: the answers the fake sent meanwhile reach it through TCP's retransmissions.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.failure.conftest import (
    CALLS,
    ITEMS,
    JOURNAL,
    RUN,
    enqueue,
    intro_calls,
    log_problems,
    summary_calls,
    task_returned,
    task_state,
    wait_for_status,
    wait_until,
)
from tests.fakes.anthropic_server import FakeAnthropic
from tests.fakes.smtp import Inbox, LoopbackController
from tests.hosts import Host, Network
from tests.support import Deployment, ThrowawayValkeys, Worker, item_ordered

pytestmark = pytest.mark.slow

# Each model call's answer takes this long, so calls are in flight when the cable is pulled.
CALL_TIME = 1.5

# The heartbeat's line when a renewal fails for good: the one error a cut-off worker logs.
LEASE_LOST = re.compile(r"ERROR/ForkPoolWorker-\d+\] lease on digest:\S+ lost; the run stops at")


@dataclass
class Site:
    """Three hosts on a switch, the store and broker up, no worker started yet."""

    network: Network
    store: Host
    hosts: tuple[Host, Host]
    deployment: Deployment
    fake: FakeAnthropic
    inbox: Inbox

    def workers(self) -> tuple[Worker, Worker]:
        """A worker on each worker host, one process each, both consuming the queue."""
        first, second = self.hosts
        return (
            self.deployment.worker(first.name, concurrency=1, on=first.command),
            self.deployment.worker(second.name, concurrency=1, on=second.command),
        )


@pytest.fixture
def site(
    network: Network, throwaway_valkeys: ThrowawayValkeys, deployment: Deployment
) -> Iterator[Site]:
    """The store host's Valkey and beat, the fake API and SMTP sink on the test host.

    Fixtures end in the reverse order of these arguments: the workers and beat first (so none
    logs the server's death), then the server, then the network, once nothing keeps its
    namespaces alive.
    """
    store = network.add("store")
    hosts = (network.add("a"), network.add("b"))
    # No password, so protected mode would refuse the workers: the switch reaches no one else.
    throwaway_valkeys.start(
        *("--port", "6379", "--bind", store.address, "--protected-mode", "no"),
        *("--appendonly", "yes", "--appendfsync", "always"),
        on=store.command,
    )
    with contextlib.ExitStack() as servers:
        inbox = Inbox()
        smtp = LoopbackController(inbox, hostname=network.test.address, port=0)
        smtp.start()
        servers.callback(smtp.stop)
        fake = FakeAnthropic(host=network.test.address).start()
        servers.callback(fake.stop)
        deployment.env.update(
            fake.env(),
            REDIS_URL=f"redis://{store.address}:6379/0",
            DIGEST_SMTP_URL=f"smtp://{network.test.address}:{smtp.port}",
        )
        deployment.beat(on=store.command)
        yield Site(network, store, hosts, deployment, fake, inbox)


def ran(worker: Worker) -> list[str]:
    """The steps the worker's pool ran (not replayed), in order."""
    return re.findall(r"ForkPoolWorker-\d+\] ran (\S+)(?: \[run=[^]]*\])?$", worker.text(), re.M)


def blocked_in_brpop(site: Site, host: Host) -> bool:
    """Whether the store still holds a BRPOP of a consumer on ``host`` open.

    A consumer whose host is cut while it waits in BRPOP stays blocked on the server until the
    BRPOP's timeout (1 s for kombu). A message pushed meanwhile is popped for it, and the reply
    carrying it waits for the cable to come back: the message would not run on the other host.
    The test enqueues once no such BRPOP is left.
    """
    clients = site.deployment.client().client_list()  # flag b: blocked in a command
    return any(
        str(c["addr"]).startswith(f"{host.address}:") and "b" in str(c["flags"]) for c in clients
    )


@pytest.mark.parametrize("only", [None, 0, 1], ids=["both-up", "only-a", "only-b"])
def test_a_digest_enqueued_once_runs_to_done_on_either_worker_host(
    site: Site, only: int | None
) -> None:
    workers = site.workers()
    if only is not None:  # the other host is cut off before the digest is enqueued
        away = site.hosts[1 - only]
        site.network.cut(away)
        wait_until(lambda: not blocked_in_brpop(site, away), 10, f"{away.name}'s BRPOP to end")
    [task] = enqueue(site.deployment)
    wait_for_status(site.deployment, "done", 30)

    # Whichever host took the message ran every step; the other ran none.
    assert sorted(ran(worker) for worker in workers) == [[], JOURNAL]
    ran_on = [ran(worker) for worker in workers].index(JOURNAL)
    assert only is None or ran_on == only
    assert len(site.inbox.messages) == 1
    assert site.fake.calls == CALLS
    assert summary_calls(site.fake) == [1] * 8
    assert intro_calls(site.fake) == 1
    assert {step.fence for step in site.deployment.view(RUN).steps} == {1}
    assert task_returned(site.deployment, task)["ran"] == len(JOURNAL)
    assert log_problems(*workers) == []
    print(f"enqueued once: ran on {site.hosts[ran_on].name}, {site.fake.calls} calls, 1 email")


def test_a_worker_host_cut_off_mid_run_is_replaced_and_changes_nothing_when_back(
    site: Site,
) -> None:
    deployment, fake = site.deployment, site.fake
    deployment.env["DIGEST_CONCURRENCY"] = "3"
    fake.delay = CALL_TIME
    workers = site.workers()
    client = deployment.client()
    keys = deployment.runtime().journal.keys("digest", RUN)
    [task] = enqueue(deployment)

    fake.wait_for_calls(3, timeout=30)  # three summaries asked, none answered yet
    holder = wait_until(
        lambda: [i for i, worker in enumerate(workers) if "select" in ran(worker)],
        10,
        "a worker to have run select",
    )[0]
    cut_off, other = site.hosts[holder], site.hosts[1 - holder]
    site.network.cut(cut_off)
    cut_at = time.monotonic()
    fake.delay = 0

    # The other host's worker gets the run from the due sweep once the lease has expired: the
    # due entry is pushed to lease expiry + recovery grace at each renewal, the sweep finds it
    # within one interval; the slack is the rest of the run.
    wait_for_status(deployment, "done", 40)
    replaced_after = time.monotonic() - cut_at
    config = deployment.config
    bound = config.lease_ttl + 5.0 + config.sweep_interval
    assert replaced_after < bound + 4, f"replaced after {replaced_after:.1f}s, bound {bound:g}s"
    assert "due sweep enqueued 1 run(s)" in workers[1 - holder].text()
    journal_before_return = client.hgetall(keys.steps)
    assert len(site.inbox.messages) == 1

    site.network.restore(cut_off)
    restored_at = time.monotonic()
    late = workers[holder]
    # Its delivery ends as a lost lease, or (when the store was unreachable at a step
    # boundary) as a retry of the same task, which finds the run done.
    wait_until(
        lambda: task_state(deployment, task) == "SUCCESS",
        40,
        f"the cut-off worker's delivery (task {task}) to end",
    )
    ended_after = time.monotonic() - restored_at
    ended = task_returned(deployment, task)["status"]
    assert ended in ("lease-lost", "already-done"), ended
    if ended == "lease-lost":  # it said so in one line: at the record of a summary it had,
        # or at the boundary before the next, once its heartbeat had found the lease gone
        assert re.search(
            r"lease lost \((.+'summarize:i\d'.+|the lease expired or was taken over)\); "
            "this worker stops",
            late.text(),
        )

    # It wrote nothing: the journal is byte for byte what the other holder left.
    assert client.hgetall(keys.steps) == journal_before_return
    view = deployment.view(RUN)
    assert item_ordered(view.steps) == JOURNAL
    assert view.meta["fence"] == "2"
    written_before_cut = {step.key for step in view.steps if step.fence == 1}
    assert written_before_cut <= set(JOURNAL[: 1 + ITEMS])  # select and summaries, if any
    assert {step.fence for step in view.steps if step.key not in written_before_cut} == {2}
    # It sent nothing, and the call in flight is all that was paid for twice.
    assert len(site.inbox.messages) == 1
    summaries_before_cut = sum(key.startswith("summarize:") for key in written_before_cut)
    # What the cut-off host asked, counted by its address once it is all in: a count taken at
    # the cut misses a request still on its way to the server under load.
    asked_by_cut_off = sum(
        request.peer == cut_off.address and "<updates>" not in request.text
        for request in fake.requests
    )
    in_flight = asked_by_cut_off - summaries_before_cut
    per_item = summary_calls(fake)
    assert all(calls in (1, 2) for calls in per_item), per_item
    assert sum(per_item) - len(per_item) <= in_flight, (per_item, in_flight)
    assert intro_calls(fake) == 1
    assert fake.calls <= CALLS + in_flight
    # No error but the one line saying the lease was lost; no traceback on either host.
    assert LEASE_LOST.search(late.text())
    assert [line for line in log_problems(late) if not LEASE_LOST.search(line)] == []
    assert log_problems(workers[1 - holder]) == []
    assert ran(workers[1 - holder])[-1] == "done"
    print(
        f"cut {cut_off.name} with {in_flight} call(s) in flight: {other.name} finished "
        f"{replaced_after:.1f}s after the cut (bound {bound:g}s), {cut_off.name}'s delivery "
        f"ended {ended_after:.1f}s after the link came back ({ended}); {fake.calls} calls, "
        f"per item {per_item}, fences {sorted({step.fence for step in view.steps})}"
    )
