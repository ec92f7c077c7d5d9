"""A master killed mid-run, its replica promoted: what a recorded step survives.

Replication is asynchronous: a master acknowledges a write before its replica has it. With
``Settings(wait_replicas=1)`` each record also waits (WAIT, same round trip) for the replica,
so every step a run went on from is on the replica a failover promotes. Without it, what the
replica had not received when the master died is lost, and the run does those steps again.

The replica is held back (SIGSTOP) to make that window wide and the outcome exact; each test
forms its own cluster, since it kills a node.
"""

from __future__ import annotations

import functools
import signal
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from journal import Journal, Keyspace, Run, Settings, connect
from journal.errors import LeaseBusy, NotDurable
from tests.cluster import Node, ValkeyCluster, valkey_cluster
from tests.support import as_text, execute, wait_until

pytestmark = pytest.mark.slow

STEPS = [f"s{n}" for n in range(1, 7)]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ValkeyCluster]:
    with valkey_cluster(tmp_path / "cluster", "--appendonly", "yes") as formed:
        yield formed


class Failover:
    """Runs a workflow of six steps and, at a chosen moment, fails its master over."""

    def __init__(self, cluster: ValkeyCluster, wait_replicas: int, lease_ttl: float = 1.0) -> None:
        self.cluster = cluster
        self.settings = Settings(lease_ttl=lease_ttl, wait_replicas=wait_replicas)
        self.calls: Counter[str] = Counter()
        self.keyspace = Keyspace("fo", shards=3)
        self.keys = self.keyspace.run("wf", "r1")
        self.master = cluster.master_of(self.keys.steps)
        self.replica = cluster.replica_of(self.master)
        self.hooks: dict[str, Callable[[], None]] = {}

    def journal(self, node: Node) -> Journal:
        return Journal(connect(node.url), keyspace=self.keyspace, settings=self.settings)

    def body(self, run: Run) -> list[str]:
        def step(name: str) -> str:
            self.calls[name] += 1
            if self.calls[name] == 1 and name in self.hooks:
                self.hooks[name]()
            return name.upper()

        return [run.step(name, functools.partial(step, name)) for name in STEPS]

    def replicated(self) -> bool:
        master = self.master.client().info("replication")["master_repl_offset"]
        replica = self.replica.client().info("replication")
        return bool(replica.get("slave_repl_offset", -1) >= master)

    def hold_replica(self) -> None:
        wait_until(self.replicated, 10, "the replica to catch up before it is held")
        self.replica.process.send_signal(signal.SIGSTOP)
        # And cut from its master: what the master sent into a stopped replica's socket would
        # still be read once it runs again, so the window would close by itself.
        self.master.client().execute_command("CLIENT KILL", "TYPE", "replica")  # type: ignore[no-untyped-call]

    def fail_over(self) -> None:
        self.cluster.kill(self.master)
        self.replica.process.send_signal(signal.SIGCONT)
        self.cluster.promote(self.replica)
        self.cluster.wait_healthy(replicated=False)

    def old_master_rejoins(self) -> None:
        """The dead master comes back, as the replica of the one that took its slots."""
        self.cluster.restart(self.master)
        self.cluster.wait_healthy()

    def resume(self) -> Any:
        """Deliver the run again through a node that survived, once the old lease is gone."""
        journal = self.journal(self.replica)

        def started() -> Any:
            try:
                return execute(journal, "wf", "r1", self.body)
            except LeaseBusy:
                return None

        return wait_until(started, 15, "the resumed run to take the lease")


def test_with_replica_waits_a_failover_loses_no_recorded_step(cluster: ValkeyCluster) -> None:
    fo = Failover(cluster, wait_replicas=1, lease_ttl=5.0)  # the lease outlives the failover
    fo.hooks["s4"] = fo.fail_over  # the master dies while s4 runs: s1..s3 were recorded
    with pytest.raises(NotDurable) as caught:
        execute(fo.journal(cluster.nodes[0]), "wf", "r1", fo.body)
    # s4's record found the new master, which has no replica left to confirm it: not trusted.
    assert (caught.value.step, caught.value.detail) == ("s4", "0 of 1 replicas acknowledged it")
    assert fo.calls == {"s1": 1, "s2": 1, "s3": 1, "s4": 1}
    fo.old_master_rejoins()
    outcome = fo.resume()
    assert (outcome.status, outcome.replayed, outcome.ran) == ("done", 4, 2)
    assert fo.calls == {"s1": 1, "s2": 1, "s3": 1, "s4": 1, "s5": 1, "s6": 1}


def test_with_replica_waits_a_record_the_replica_lacks_stops_the_run(
    cluster: ValkeyCluster,
) -> None:
    fo = Failover(cluster, wait_replicas=1)
    fo.hooks["s3"] = fo.hold_replica  # s3's record reaches the master alone
    with pytest.raises(NotDurable) as caught:
        execute(fo.journal(cluster.nodes[0]), "wf", "r1", fo.body)
    assert (caught.value.step, caught.value.detail) == ("s3", "0 of 1 replicas acknowledged it")
    assert fo.calls == {"s1": 1, "s2": 1, "s3": 1}  # nothing went on from the unconfirmed s3
    fo.fail_over()
    fo.old_master_rejoins()
    outcome = fo.resume()
    assert (outcome.status, outcome.replayed, outcome.ran) == ("done", 2, 4)
    assert fo.calls == {"s1": 1, "s2": 1, "s3": 2, "s4": 1, "s5": 1, "s6": 1}


def test_without_replica_waits_a_failover_loses_what_the_replica_had_not_received(
    cluster: ValkeyCluster,
) -> None:
    fo = Failover(cluster, wait_replicas=0, lease_ttl=30.0)  # the lease outlives the failover
    fo.hooks["s3"] = fo.hold_replica  # from s3 on, records reach the master alone
    fo.hooks["s5"] = fo.fail_over  # the master dies while s5 runs: s3, s4 were recorded there
    journal = fo.journal(cluster.nodes[0])
    outcome = execute(journal, "wf", "r1", fo.body)
    # The cluster client followed the failover and the run went on, from memory...
    assert (outcome.status, outcome.ran, outcome.result) == ("done", 6, [s.upper() for s in STEPS])
    assert fo.calls == dict.fromkeys(STEPS, 1)
    # ...but s3 and s4, acknowledged by the dead master alone, are not in the journal: a run
    # redelivered before its end would have done them again.
    recorded = {as_text(field) for field in journal.client.hkeys(fo.keys.steps)}
    assert recorded == {"s1", "s2", "s5", "s6"}
