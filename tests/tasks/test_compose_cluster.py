"""docker-compose.cluster.yml, parsed and checked (no Docker engine here): 3 masters and 3
replicas, a one-shot forming the cluster, the broker apart, a worker and beat.
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import yaml

from tasks.config import Config
from tests.tasks.test_compose_file import REPO, argv, environment, service

NODES = [f"redis-{n}" for n in range(1, 7)]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load((REPO / "docker-compose.cluster.yml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def flags(args: list[str]) -> dict[str, str]:
    assert args[0] == "redis-server"
    return dict(zip(args[1::2], args[2::2], strict=True))


def test_the_stack_is_six_nodes_a_forming_one_shot_a_broker_a_worker_and_beat(
    compose: dict[str, Any],
) -> None:
    assert set(compose["services"]) == {*NODES, "cluster-init", "broker", "worker", "beat"}


@pytest.mark.parametrize("name", NODES)
def test_each_node_is_a_persistent_cluster_node_announcing_its_name(
    compose: dict[str, Any], name: str
) -> None:
    node = service(compose, name)
    assert node["image"] == "redis:7.4"
    assert flags(argv(node)) == {
        "--cluster-enabled": "yes",
        "--cluster-config-file": "nodes.conf",
        "--cluster-node-timeout": "5000",
        "--cluster-announce-hostname": name,
        "--cluster-preferred-endpoint-type": "hostname",
        "--appendonly": "yes",
        "--appendfsync": "always",
        "--maxmemory-policy": "noeviction",
    }
    assert node["volumes"] == [f"{name}-data:/data"]  # its own: nodes.conf is its identity
    assert node["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    assert "ports" not in node


def test_the_one_shot_forms_three_masters_with_a_replica_each_once_all_are_up(
    compose: dict[str, Any],
) -> None:
    init = service(compose, "cluster-init")
    assert init["restart"] == "no"
    assert init["depends_on"] == {name: {"condition": "service_healthy"} for name in NODES}
    assert init["entrypoint"] == ["sh", "-c"]
    (script,) = init["command"]
    assert "redis-cli --cluster create" in script
    assert "--cluster-replicas 1 --cluster-yes" in script
    assert f'nodes="{" ".join(NODES)}"' in script


@pytest.mark.slow
def test_the_one_shots_script_parses_as_the_shell_will_run_it(compose: dict[str, Any]) -> None:
    (script,) = service(compose, "cluster-init")["command"]
    shell = script.replace("$$", "$")  # what compose hands the shell
    parsed = subprocess.run(["sh", "-n", "-c", shell], capture_output=True, text=True, check=False)
    assert parsed.returncode == 0, parsed.stderr


def test_the_broker_is_a_standalone_server_of_its_own(compose: dict[str, Any]) -> None:
    broker = service(compose, "broker")
    assert "--cluster-enabled" not in flags(argv(broker))
    assert flags(argv(broker))["--appendonly"] == "yes"
    assert broker["volumes"] == ["broker-data:/data"]


@pytest.mark.parametrize("name", ["worker", "beat"])
def test_celery_uses_a_node_for_the_journal_and_the_broker_for_its_queues(
    compose: dict[str, Any], name: str
) -> None:
    svc = service(compose, name)
    env = environment(svc)
    assert env["REDIS_URL"] == "redis://redis-1:6379/0"
    assert env["CELERY_BROKER_URL"] == "redis://broker:6379/0"
    assert svc["depends_on"] == {
        "cluster-init": {"condition": "service_completed_successfully"},
        "broker": {"condition": "service_healthy"},
    }
    config = Config.from_env({k: v for k, v in env.items() if v is not None})
    config.check_store(cluster=True)  # not refused: the broker is apart
    assert config.journal_shards == 12 and config.wait_replicas == 1


def test_the_worker_and_beat_share_one_key_layout(compose: dict[str, Any]) -> None:
    worker, beat = (environment(service(compose, name)) for name in ("worker", "beat"))
    for variable in ("REDIS_URL", "CELERY_BROKER_URL", "DIGEST_JOURNAL_SHARDS"):
        assert worker[variable] == beat[variable]


def test_replica_waits_ask_for_no_more_replicas_than_each_master_has(
    compose: dict[str, Any],
) -> None:
    (script,) = service(compose, "cluster-init")["command"]
    per_master = int(script.split("--cluster-replicas ")[1].split()[0])
    assert int(environment(service(compose, "worker"))["DIGEST_WAIT_REPLICAS"] or 0) <= per_master


def test_every_named_volume_is_declared(compose: dict[str, Any]) -> None:
    used = {
        mount.split(":")[0]
        for svc in compose["services"].values()
        for mount in svc.get("volumes", [])
        if not mount.startswith((".", "/"))
    }
    assert used == set(compose["volumes"])
    assert used == {*(f"{name}-data" for name in NODES), "broker-data", "digest-state"}
