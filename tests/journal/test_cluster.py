"""The journal on a real 3-master, 3-replica Valkey cluster (tests/cluster.py).

Every script touches one slot (a cross-slot script would fail loudly here, not on a laptop's
single server), the sweep claims shard by shard without a double claim, and the listing
merges the shards newest first.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from journal import Effect, Journal, Keyspace, ManualClock, Run, connect
from journal.errors import LeaseBusy
from journal.ops.views import list_runs
from tests.cluster import SLOTS, ValkeyCluster
from tests.support import execute

pytestmark = pytest.mark.slow

T0 = 1_800_000_000.0
SHARDS = 8


def test_the_cluster_has_three_masters_each_with_an_online_replica(
    valkey_cluster: ValkeyCluster,
) -> None:
    roles = [valkey_cluster.role(node) for node in valkey_cluster.nodes]
    assert roles == ["master"] * 3 + ["slave"] * 3
    for master, replica in zip(
        valkey_cluster.masters_at_start, valkey_cluster.replicas_at_start, strict=True
    ):
        assert valkey_cluster.replica_of(master) is replica
    info = valkey_cluster.nodes[0].client().execute_command("CLUSTER INFO")  # type: ignore[no-untyped-call]
    assert info["cluster_state"] == "ok"
    assert info["cluster_slots_assigned"] == str(SLOTS)
    assert all(node.port != 6379 for node in valkey_cluster.nodes)


@pytest.fixture
def make_cluster_journal(
    valkey_cluster: ValkeyCluster, prefix: str
) -> Iterator[Callable[..., Journal]]:
    clients: list[Any] = []

    def make(clock: ManualClock | None = None, node: int = 0, **settings: Any) -> Journal:
        client = connect(valkey_cluster.nodes[node].url)
        clients.append(client)
        keyspace = Keyspace(prefix, shards=SHARDS)
        return Journal(client, keyspace=keyspace, clock=clock or ManualClock(T0))

    yield make
    for client in clients:
        client.close()


def test_any_node_url_gives_a_cluster_client_and_a_sharded_keyspace(
    valkey_cluster: ValkeyCluster, make_cluster_journal: Callable[..., Journal]
) -> None:
    for index in (0, 4):  # a master's URL and a replica's
        journal = make_cluster_journal(node=index)
        assert isinstance(journal.client, redis.RedisCluster)
        assert journal.keyspace.cluster and journal.keyspace.sharded


def test_a_runs_keys_and_its_shards_indexes_share_one_slot(
    valkey_cluster: ValkeyCluster, make_cluster_journal: Callable[..., Journal]
) -> None:
    journal = make_cluster_journal()
    probe = valkey_cluster.nodes[0].client()
    slots_of_shards = set()
    for n in range(40):
        keys = journal.keys("wf", f"r{n}")
        names = [*keys.all(), keys.index.runs, keys.index.due]
        slots = {int(probe.execute_command("CLUSTER KEYSLOT", name)) for name in names}  # type: ignore[no-untyped-call]
        assert len(slots) == 1, names
        slots_of_shards |= slots
    assert len(slots_of_shards) == SHARDS  # 40 runs reach every one of the 8 shards


class Sink:
    def __init__(self) -> None:
        self.delivered: list[str] = []

    def send(self, key: str, effect: Effect) -> dict[str, Any]:
        effect.confirm()
        self.delivered.append(key)
        receipt = {"key": key}
        effect.accepted(receipt)
        return receipt


def test_a_run_with_steps_a_sleep_and_an_effect_ends_through_the_sweep(
    make_cluster_journal: Callable[..., Journal],
) -> None:
    clock = ManualClock(T0)
    journal = make_cluster_journal(clock)
    calls: Counter[str] = Counter()
    sink = Sink()

    def body(run: Run) -> dict[str, Any]:
        first = run.step("a", lambda: calls.update(["a"]) or 1)
        run.sleep("nap", 60)
        second = run.step("b", lambda: calls.update(["b"]) or 2)
        receipt = run.effect(
            "send", lambda effect: sink.send(run.idempotency_key("send"), effect), timeout=5
        )
        return {"sum": first + second, "receipt": receipt}

    assert execute(journal, "wf", "r1", body).status == "waiting"
    assert journal.claim_due() == []
    clock.advance(61)
    (claimed,) = journal.claim_due()
    assert claimed.run == "wf:r1"
    outcome = execute(journal, claimed.workflow, claimed.run_id, body)
    assert (outcome.status, outcome.ran, outcome.replayed) == ("done", 2, 2)  # b, send; a, nap
    assert outcome.result == {"sum": 3, "receipt": {"key": "wf-r1-send"}}
    assert execute(journal, "wf", "r1", body).status == "already-done"
    assert calls == {"a": 1, "b": 1}
    assert sink.delivered == ["wf-r1-send"]
    clock.advance(10_000)
    assert journal.claim_due() == []  # done: out of its shard's due index


def test_ten_duplicate_deliveries_at_once_execute_the_run_once(
    make_cluster_journal: Callable[..., Journal],
) -> None:
    deliveries = 10
    journals = [make_cluster_journal(node=n % 6) for n in range(deliveries)]
    barrier = threading.Barrier(deliveries)
    calls: list[str] = []
    outcomes: list[str] = []
    lock = threading.Lock()

    def work() -> str:
        with lock:
            calls.append("work")
        time.sleep(0.5)  # long enough that every duplicate finds the lease held
        return "done"

    def body(run: Run) -> str:
        return str(run.step("work", work))

    def deliver(journal: Journal) -> None:
        barrier.wait()
        try:
            status = execute(journal, "wf", "dup", body).status
        except LeaseBusy:
            status = "busy"
        with lock:
            outcomes.append(status)

    threads = [threading.Thread(target=deliver, args=(j,)) for j in journals]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert calls == ["work"]
    assert Counter(outcomes) == {"done": 1, "busy": deliveries - 1}


def napper(run: Run) -> str:
    run.sleep("nap", 10)
    return "after"


def test_racing_sweepers_claim_every_due_run_of_every_shard_exactly_once(
    make_cluster_journal: Callable[..., Journal],
) -> None:
    clock = ManualClock(T0)
    journal = make_cluster_journal(clock)
    runs = [f"due{n}" for n in range(60)]
    for run_id in runs:
        assert execute(journal, "wf", run_id, napper).status == "waiting"
    execute(journal, "wf", "later", lambda run: run.sleep("nap", 1000))
    clock.advance(10)
    sweepers = [make_cluster_journal(clock, node=n % 6) for n in range(6)]
    barrier = threading.Barrier(len(sweepers))
    claimed: list[str] = []
    lock = threading.Lock()

    def sweep(sweeper: Journal) -> None:
        barrier.wait()
        while batch := sweeper.claim_due(limit=4):
            with lock:
                claimed.extend(keys.run for keys in batch)

    threads = [threading.Thread(target=sweep, args=(s,)) for s in sweepers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    counts = Counter(claimed)
    assert set(counts) == {f"wf:{run_id}" for run_id in runs}
    assert max(counts.values()) == 1  # not one run claimed twice


def test_the_listing_merges_every_shard_newest_first(
    make_cluster_journal: Callable[..., Journal],
) -> None:
    clock = ManualClock(T0)
    journal = make_cluster_journal(clock)
    created = []
    for n in range(30):
        run_id = f"l{n}-{uuid.uuid4().hex[:4]}"
        execute(journal, "wf", run_id, lambda run: "ok")
        created.append(run_id)
        clock.advance(1)
    assert len({journal.keys("wf", run_id).shard for run_id in created}) > 1
    rows = list_runs(journal, limit=50)
    assert [row.run_id for row in rows] == created[::-1]
    assert [row.run_id for row in list_runs(journal, limit=5)] == created[::-1][:5]
    assert {row.state for row in rows} == {"done"}
