"""``Settings(fsync_records=True)``: every record waits for the local AOF fsync (WAITAOF).

Checked on the wire: a recording connection keeps the commands of every packet it sends, one
packet per round trip, so "in the same pipeline" is a fact about the bytes, not a belief.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from journal import Journal, Keyspace, Run, Settings
from journal.errors import JournalError
from tests.support import ThrowawayValkeys, execute, watched_client

# Each test starts a Valkey configured its own way (appendfsync, WAITAOF support).
pytestmark = pytest.mark.slow

Packets = list[list[list[bytes]]]
StartValkey = Callable[..., tuple[redis.Redis, Packets]]


def commands_in(data: bytes) -> list[list[bytes]]:
    """The commands of one RESP request packet, each as its list of arguments."""
    commands = []
    pos = 0
    while pos < len(data):
        end = data.index(b"\r\n", pos)
        count = int(data[pos + 1 : end])
        pos = end + 2
        args = []
        for _ in range(count):
            end = data.index(b"\r\n", pos)
            length = int(data[pos + 1 : end])
            args.append(data[end + 2 : end + 2 + length])
            pos = end + 2 + length + 2
        commands.append(args)
    return commands


def recording_client(socket_path: Path) -> tuple[redis.Redis, Packets]:
    """A client whose connections log every packet they send."""
    packets: Packets = []
    client = watched_client(f"unix://{socket_path}", lambda data: packets.append(commands_in(data)))
    return client, packets


@pytest.fixture
def valkey(throwaway_valkeys: ThrowawayValkeys) -> StartValkey:
    """Start a throwaway Valkey with the given options, with a recording client; killed after."""

    def start(*options: str) -> tuple[redis.Redis, Packets]:
        return recording_client(throwaway_valkeys.start(*options))

    return start


def three_steps(calls: list[str]) -> Callable[[Run], list[str]]:
    def body(run: Run) -> list[str]:
        def call(name: str) -> str:
            calls.append(name)
            return name.upper()

        return [run.step(name, functools.partial(call, name)) for name in "abc"]

    return body


def record_packets(journal: Journal, packets: Packets) -> list[list[bytes]]:
    """The name of every command sent with each record script call, packet by packet."""
    sha = journal.backend.scripts.record.sha.encode()
    return [
        [command[0].upper() for command in packet]
        for packet in packets
        if any(command[:2] == [b"EVALSHA", sha] for command in packet)
    ]


def warm_up(journal: Journal, packets: Packets) -> None:
    """One run first, so scripts are loaded and connections made; then forget what it sent."""
    execute(journal, "wf", "warm-up", three_steps([]))
    journal.client.config_resetstat()
    packets.clear()


def sent(packets: Packets, name: bytes) -> list[list[bytes]]:
    return [command for packet in packets for command in packet if command[0].upper() == name]


@pytest.mark.parametrize("policy", ["everysec", "always"])
def test_each_record_is_sent_with_waitaof_in_one_packet_and_still_records(
    valkey: StartValkey, policy: str
) -> None:
    client, packets = valkey("--appendonly", "yes", "--appendfsync", policy)
    journal = Journal(client, keyspace=Keyspace("j"), settings=Settings(fsync_records=True))
    warm_up(journal, packets)
    calls: list[str] = []
    outcome = execute(journal, "wf", "r1", three_steps(calls))
    assert (outcome.status, outcome.result, outcome.ran) == ("done", ["A", "B", "C"], 3)
    assert calls == ["a", "b", "c"]
    assert client.hlen(journal.keys("wf", "r1").steps) == 3
    assert record_packets(journal, packets) == [[b"EVALSHA", b"WAITAOF"]] * 3
    assert sent(packets, b"WAITAOF") == [[b"WAITAOF", b"1", b"0", b"1000"]] * 3
    stats = client.info("commandstats")["cmdstat_waitaof"]
    assert (stats["calls"], stats["failed_calls"], stats["rejected_calls"]) == (3, 0, 0)


def test_without_the_setting_a_record_is_the_script_alone(valkey: StartValkey) -> None:
    client, packets = valkey("--appendonly", "yes", "--appendfsync", "everysec")
    journal = Journal(client, keyspace=Keyspace("j"))
    warm_up(journal, packets)
    execute(journal, "wf", "r1", three_steps([]))
    assert record_packets(journal, packets) == [[b"EVALSHA"]] * 3
    assert sent(packets, b"WAITAOF") == []


def test_with_the_setting_no_record_waits_for_a_later_write(valkey: StartValkey) -> None:
    """A repeatable step's record is fsynced as it is made, like any other."""
    client, packets = valkey("--appendonly", "yes", "--appendfsync", "everysec")
    journal = Journal(client, keyspace=Keyspace("j"), settings=Settings(fsync_records=True))
    warm_up(journal, packets)

    def body(run: Run) -> list[int]:
        return [run.step("a", lambda: 1, repeatable=True), run.step("b", lambda: 2)]

    execute(journal, "wf", "r1", body)
    assert record_packets(journal, packets) == [[b"EVALSHA", b"WAITAOF"]] * 2


def test_a_fsynced_record_costs_one_round_trip(valkey: StartValkey) -> None:
    client, packets = valkey("--appendonly", "yes", "--appendfsync", "everysec")
    journal = Journal(client, keyspace=Keyspace("j"), settings=Settings(fsync_records=True))
    warm_up(journal, packets)
    execute(journal, "wf", "r1", three_steps([]))
    assert sent(packets, b"SCRIPT") == []


# -- a server that cannot confirm an fsync ----------------------------------------------------


@pytest.fixture(params=["redis-without-waitaof", "valkey-appendonly-no"])
def no_waitaof(
    request: pytest.FixtureRequest, valkey: StartValkey, prefix: str
) -> tuple[redis.Redis, str]:
    """A store where WAITAOF 1 fails, and the reason the server gives."""
    if request.param == "valkey-appendonly-no":
        client, _ = valkey("--appendonly", "no")
        return client, "appendonly is disabled"
    client = request.getfixturevalue("real_redis")  # the shared Redis 7.0, own prefix
    try:
        client.waitaof(0, 0, 0)
    except redis.ResponseError:
        return client, "unknown command 'WAITAOF'"
    pytest.skip("the shared test Redis supports WAITAOF (7.2+); this case needs an older one")


def test_on_a_server_without_waitaof_the_setting_is_refused_before_any_step(
    no_waitaof: tuple[redis.Redis, str], prefix: str
) -> None:
    client, _ = no_waitaof
    calls: list[str] = []
    with pytest.raises(JournalError, match="WAITAOF"):
        journal = Journal(client, keyspace=Keyspace(prefix), settings=Settings(fsync_records=True))
        execute(journal, "wf", "r1", three_steps(calls))
    assert calls == []
    assert client.exists(f"{prefix}:{{wf:r1}}:steps") == 0
