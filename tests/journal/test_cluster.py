"""The journal on a real 3-master, 3-replica Valkey cluster (tests/cluster.py)."""

from __future__ import annotations

import pytest

from tests.cluster import SLOTS, ValkeyCluster

pytestmark = pytest.mark.slow


def test_the_cluster_has_three_masters_each_with_an_online_replica(
    valkey_cluster: ValkeyCluster,
) -> None:
    roles = [valkey_cluster.role(node) for node in valkey_cluster.nodes]
    assert roles == ["master"] * 3 + ["slave"] * 3
    for master, replica in zip(
        valkey_cluster.masters_at_start, valkey_cluster.replicas_at_start, strict=True
    ):
        assert valkey_cluster.replica_of(master) is replica
    info = valkey_cluster.nodes[0].client().execute_command("CLUSTER INFO")
    assert info["cluster_state"] == "ok"
    assert info["cluster_slots_assigned"] == str(SLOTS)
    assert all(node.port != 6379 for node in valkey_cluster.nodes)
