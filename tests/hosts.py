"""Hosts made of Linux network namespaces on one switch, for tests of partitions.

Each host is a network namespace with one interface, ``eth0``, and its own address; its cable
is a veth pair whose other end is a port of a bridge in a namespace of its own (the switch).
The test process's own namespace is plugged into the switch too, as the ``test`` host, so the
test reaches every host and serves what the hosts call (the fake model API) from its address.
Cutting a host sets its switch port down: the host keeps its address and its open
connections, as with a pulled cable, and every packet to or from it is lost until the port
comes back up.

The switch lives apart from the test's namespace so that its bridge sees none of the
machine's firewall rules (``br-netfilter`` would apply them to bridged traffic), and so that
cleaning up is deleting namespaces: deleting the switch's ports deletes their veth pairs,
the test host's end included. Namespace names carry the test process's pid, and each fixture
first deletes those of processes gone for minutes, so a killed test run leaves nothing behind
past the next.

Needs root and ``ip netns``; ``network`` skips, saying which is missing, otherwise.
"""

from __future__ import annotations

import ipaddress
import os
import random
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

PREFIX = "ddnet"
ABANDONED_AFTER = 300.0  # seconds


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS``; raise with its stderr when it fails and ``check`` is set."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


@dataclass(frozen=True)
class Host:
    """One host: a network namespace with an address on the switch.

    Attributes:
        name: the test's name for it (``store``, ``a``).
        namespace: the namespace (None for the test host, the test process's own).
        address: its IPv4 address on the switch.
        port: its switch port, in the switch namespace.
    """

    name: str
    namespace: str | None
    address: str
    port: str

    def command(self, *argv: str) -> list[str]:
        """``argv`` run on this host (``ip netns exec``, which execs: the pid stays argv's)."""
        if self.namespace is None:
            return list(argv)
        return ["ip", "netns", "exec", self.namespace, *argv]


class Network:
    """A switch, the test host on it, and the hosts a test adds; ``close`` removes them all."""

    def __init__(self) -> None:
        self.tag = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.switch = f"{PREFIX}-{self.tag}-sw"
        self.subnet = _free_subnet()
        self.hosts: dict[str, Host] = {}
        self._namespaces: list[str] = []
        self._addresses = self.subnet.hosts()
        try:
            self._namespace(self.switch)
            ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            ip("-n", self.switch, "link", "set", "br0", "up")
            # The test process's end: a name of its own in the shared namespace (15 bytes at
            # most), moved there by pid, since the test's namespace may have no name.
            self.test_device = f"dd{uuid.uuid4().hex[:8]}"
            self._veth("ptest", self.test_device, str(os.getpid()))
            self.test = self._plug("test", None, "ptest", self.test_device)
        except BaseException:
            self.close()
            raise

    def add(self, name: str) -> Host:
        """A new host called ``name``, its link up, reachable from every other."""
        namespace = f"{PREFIX}-{self.tag}-{name}"
        self._namespace(namespace)
        ip("-n", namespace, "link", "set", "lo", "up")
        port = f"p{len(self.hosts)}"
        self._veth(port, "eth0", namespace)
        return self._plug(name, namespace, port, "eth0")

    def cut(self, host: Host) -> None:
        """Pull the host's cable: its switch port down, every packet to or from it lost."""
        ip("-n", self.switch, "link", "set", host.port, "down")

    def restore(self, host: Host) -> None:
        """Plug it back: open connections carry on where their retransmissions find them."""
        ip("-n", self.switch, "link", "set", host.port, "up")

    def close(self) -> None:
        """Delete every port, then every namespace; never raises, so it may run on any failure.

        Processes still running on a host keep its namespace alive after its name is gone, but
        without a link: kill them first (the fixtures that start them end before this one).
        """
        for host in self.hosts.values():
            ip("-n", self.switch, "link", "del", host.port, check=False)
        for namespace in reversed(self._namespaces):
            ip("netns", "del", namespace, check=False)
        self._namespaces.clear()

    def _namespace(self, namespace: str) -> None:
        ip("netns", "add", namespace)
        self._namespaces.append(namespace)

    def _veth(self, port: str, device: str, where: str) -> None:
        """A cable: ``port`` on the switch, ``device`` in namespace ``where`` (a name or pid)."""
        ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", device)
        ip("-n", self.switch, "link", "set", device, "netns", where)

    def _plug(self, name: str, namespace: str | None, port: str, device: str) -> Host:
        address = str(next(self._addresses))
        inside = ("-n", namespace) if namespace else ()
        ip(*inside, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", device)
        ip(*inside, "link", "set", device, "up")
        ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
        host = Host(name, namespace, address, port)
        self.hosts[name] = host
        return host


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.200.0.0/13 that no address of this machine's namespace falls in.

    Random, so that tests running at once (other worktrees, other sessions) rarely pick the
    same one; a subnet already in use is skipped.
    """
    shown = ip("-4", "-o", "addr", "show").stdout
    used = [ipaddress.IPv4Interface(word).network for word in shown.split() if "/" in word]
    for _ in range(100):
        subnet = ipaddress.IPv4Network(
            f"10.{random.randrange(200, 208)}.{random.randrange(256)}.0/24"
        )
        if not any(subnet.overlaps(other) for other in used):
            return subnet
    raise RuntimeError("no free /24 in 10.200.0.0/13 for the test network")


def _remove_abandoned() -> None:
    """Delete the namespaces of test processes that are gone (killed before their cleanup).

    Only those older than ``ABANDONED_AFTER``: a pid absent here may be alive in another pid
    namespace sharing the machine's network namespace names, but no test lasts that long.
    """
    for line in ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        parts = name.split("-")
        if len(parts) < 4 or parts[0] != PREFIX or not parts[1].isdigit():
            continue
        try:
            made = os.stat(f"/run/netns/{name}").st_mtime  # the namespace's creation
        except OSError:
            continue
        if time.time() - made < ABANDONED_AFTER:
            continue
        try:
            os.kill(int(parts[1]), 0)
        except ProcessLookupError:
            ip("netns", "del", name, check=False)
        except PermissionError:
            pass  # alive, another user's


def unavailable() -> str | None:
    """Why network namespaces cannot be made here, in one line; None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    probe = f"{PREFIX}-probe-{uuid.uuid4().hex[:8]}"
    made = ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        said = made.stderr.strip().splitlines()
        return f"`ip netns add` failed: {said[0] if said else f'exit {made.returncode}'}"
    ip("netns", "del", probe, check=False)
    return None


@pytest.fixture
def network() -> Iterator[Network]:
    """A switch with the test host on it; every host added is removed after the test."""
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    _remove_abandoned()
    made = Network()
    try:
        yield made
    finally:
        made.close()
