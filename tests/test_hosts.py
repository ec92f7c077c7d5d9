"""The partition tests' network (``tests/hosts.py``): hosts that reach each other until cut,
and nothing of it left on the machine afterwards, even when a test fails while building it."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from tests.hosts import Host, Network, ip, unavailable

pytestmark = pytest.mark.slow

# Connects to the address and port given, within a second: exit 0 if it could.
_CONNECT = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 1)"


def reaches(host: Host, listener: socket.socket) -> bool:
    """Whether a process on ``host`` can open a TCP connection to ``listener``."""
    address, port = listener.getsockname()
    command = host.command(sys.executable, "-c", _CONNECT, address, str(port))
    return subprocess.run(command, capture_output=True, check=False, timeout=10).returncode == 0


def leftovers(network: Network) -> list[str]:
    """The network's namespaces and its test-host device still on the machine."""
    names = [line.split()[0] for line in ip("netns", "list").stdout.splitlines() if line]
    devices = [line.split(":")[1].strip() for line in ip("-o", "link").stdout.splitlines()]
    return [name for name in names if network.tag in name] + [
        device for device in devices if device.startswith(network.test_device)
    ]


def test_hosts_reach_each_other_until_cut_and_again_once_restored(network: Network) -> None:
    a, b = network.add("a"), network.add("b")
    with socket.create_server((network.test.address, 0)) as listener:
        assert reaches(a, listener) and reaches(b, listener)
        network.cut(a)
        assert not reaches(a, listener)
        assert reaches(b, listener)  # only a's cable was pulled
        network.restore(a)
        assert reaches(a, listener)


def test_closing_removes_every_namespace_and_link_even_after_a_failed_setup() -> None:
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    network = Network()
    network.add("a")
    with pytest.raises(RuntimeError, match="File exists"):
        network.add("a")  # a test that fails while building its hosts
    before = leftovers(network)
    # the switch, host a, and the test host's end of its cable
    assert len(before) == 3 and before[-1].startswith(network.test_device), before
    network.close()
    assert leftovers(network) == []
    network.close()  # twice is harmless: a finalizer may run after a test closed it
