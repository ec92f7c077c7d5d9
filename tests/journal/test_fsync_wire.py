"""``fsync_records`` without starting a server: the session's own Valkey, appendonly for a test.

``test_fsync.py`` proves the setting against servers started the way production runs them,
which makes it slow, so the fast tests (and the mutation run, docs/mutation.md) never reached
``Run._write_synced`` or ``Journal._require_waitaof``. Here the session's own Valkey (never a
shared one) turns appendonly on with CONFIG SET for one test and off after it, and a recording
client shows the exact commands each record sends. Also the refusal at start, on both backends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import fakeredis
import pytest
import redis

from journal import Journal, Keyspace, Run, Settings
from journal._redis.scripts import SCRIPT_NAMES
from journal.errors import NotDurable, StoreUnsupported
from tests.journal.test_fsync import (
    Packets,
    recording_client,
    sent,
    three_steps,
    warm_up,
)
from tests.support import execute, wait_until

REFUSED = "fsync_records needs WAITAOF (Redis 7.2+ or Valkey with appendonly yes): "


@pytest.fixture
def own_socket(own_redis_url: str, prefix: str) -> Iterator[Path]:
    """The socket of the session's own Valkey; this test's keys are dropped after it."""
    socket = Path(urlsplit(own_redis_url).path)
    yield socket
    admin = redis.Redis(unix_socket_path=str(socket))
    for key in admin.scan_iter(match=f"{prefix}:*"):
        admin.delete(key)
    admin.close()


@pytest.fixture
def appendonly(own_socket: Path) -> Iterator[tuple[redis.Redis, Packets]]:
    """A recording client of the own Valkey with appendonly on; off again after the test."""
    admin = redis.Redis(unix_socket_path=str(own_socket))
    admin.config_set("appendonly", "yes")

    def rewritten() -> bool:
        info = admin.info("persistence")
        return bool(info["aof_enabled"] == 1 and info["aof_rewrite_in_progress"] == 0)

    wait_until(rewritten, 10, "the AOF rewrite after turning appendonly on", every=0.005)
    try:
        yield recording_client(own_socket)
    finally:
        admin.config_set("appendonly", "no")
        admin.close()


@pytest.mark.parametrize("backend", ["valkey-appendonly-no", "fakeredis"])
def test_a_server_that_cannot_fsync_is_refused_at_start_with_its_own_words(
    own_socket: Path, prefix: str, backend: str
) -> None:
    if backend == "fakeredis":
        client: redis.Redis = fakeredis.FakeRedis(server=fakeredis.FakeServer())
        says = "unknown command 'waitaof', with args beginning with: "
    else:
        client = redis.Redis(unix_socket_path=str(own_socket))
        says = "WAITAOF cannot be used when numlocal is set but appendonly is disabled."
    with pytest.raises(StoreUnsupported) as caught:
        Journal(client, Keyspace(prefix), Settings(fsync_records=True), url="redis://store")
    assert (caught.value.url, caught.value.detail) == ("redis://store", REFUSED + says)


def test_each_record_sends_the_script_and_waitaof_in_one_packet_and_replays(
    appendonly: tuple[redis.Redis, Packets], prefix: str
) -> None:
    client, packets = appendonly
    journal = Journal(client, Keyspace(prefix), Settings(fsync_records=True))
    warm_up(journal, packets)
    calls: list[str] = []
    outcome = execute(journal, "wf", "r1", three_steps(calls))
    assert (outcome.status, outcome.result, outcome.ran, calls) == (
        "done",
        ["A", "B", "C"],
        3,
        list("abc"),
    )
    keys = journal.keys("wf", "r1")
    sha = journal.backend.scripts.record.sha.encode()
    evals = [command for command in sent(packets, b"EVALSHA") if command[1] == sha]
    assert [command[:6] for command in evals] == [
        [b"EVALSHA", sha, b"3", keys.lease.encode(), keys.steps.encode(), keys.meta.encode()]
    ] * 3
    assert [(command[7], len(command)) for command in evals] == [(b"a", 9), (b"b", 9), (b"c", 9)]
    assert exact_record_packets(packets, sha) == [[b"EVALSHA", b"WAITAOF"]] * 3
    assert sent(packets, b"WAITAOF") == [[b"WAITAOF", b"1", b"0", b"1000"]] * 3
    client.hdel(keys.meta, "status")
    again = execute(journal, "wf", "r1", three_steps(calls))
    assert (again.result, again.ran, again.replayed) == (["A", "B", "C"], 0, 3)


def exact_record_packets(packets: Packets, sha: bytes) -> list[list[bytes]]:
    """The commands of each packet that calls the record script, named exactly as sent."""
    calls_record = [p for p in packets if any(c[:2] == [b"EVALSHA", sha] for c in p)]
    return [[command[0] for command in packet] for packet in calls_record]


def test_a_flushed_script_is_sent_with_its_source_and_the_record_still_waits_for_fsync(
    appendonly: tuple[redis.Redis, Packets], prefix: str
) -> None:
    client, packets = appendonly
    journal = Journal(client, Keyspace(prefix), Settings(fsync_records=True))
    client.script_flush()
    packets.clear()

    def flushed_again_before_its_step(run: Run) -> str:
        client.script_flush()  # the server restarted after the opening loaded every script
        return run.step("a", lambda: "A")

    outcome = execute(journal, "wf", "r1", flushed_again_before_its_step)
    assert (outcome.status, outcome.result) == ("done", "A")
    record = journal.backend.scripts.record.script.encode()
    # Each miss of a script the transaction had not loaded loads them all, once each: the
    # opening's, then the closing's after the second flush (the record sent its own source).
    loads = [command for command in sent(packets, b"SCRIPT") if command[1] == b"LOAD"]
    assert len(loads) == 2 * len(SCRIPT_NAMES)
    assert [c for c in loads if c[2:] == [record]] == [[b"SCRIPT", b"LOAD", record]] * 2
    sha = journal.backend.scripts.record.sha.encode()
    calls_record = [
        [command[0] for command in packet]
        for packet in packets
        if any(c[:2] in ([b"EVALSHA", sha], [b"EVAL", record]) for c in packet)
    ]
    assert calls_record == [[b"EVALSHA", b"WAITAOF"], [b"EVAL", b"WAITAOF"]]


def test_a_record_whose_fsync_fails_stops_the_run_naming_the_step_and_the_reply(
    appendonly: tuple[redis.Redis, Packets], own_socket: Path, prefix: str
) -> None:
    client, _ = appendonly
    journal = Journal(client, Keyspace(prefix), Settings(fsync_records=True))
    admin = redis.Redis(unix_socket_path=str(own_socket))

    def body(run: Run) -> str:
        admin.config_set("appendonly", "no")  # the disk went away under the step
        return run.step("a", lambda: "A")

    with pytest.raises(NotDurable) as caught:
        execute(journal, "wf", "r1", body)
    admin.close()
    says = "WAITAOF cannot be used when numlocal is set but appendonly is disabled."
    assert (caught.value.run, caught.value.step) == ("wf:r1", "a")
    assert caught.value.detail == repr(redis.ResponseError(says))
    assert client.hexists(journal.keys("wf", "r1").steps, "a")  # written, just not trusted


def test_a_server_that_keeps_forgetting_the_script_stops_the_run_after_two_tries(
    appendonly: tuple[redis.Redis, Packets], prefix: str
) -> None:
    """A server that answers NOSCRIPT even to EVAL (a proxy that rewrites it) is not retried
    forever: the record is not trusted, and the run says so."""
    client, _ = appendonly
    journal = Journal(client, Keyspace(prefix), Settings(fsync_records=True))
    real_pipeline = client.pipeline

    def forgetful_pipeline(transaction: bool = True, shard_hint: Any = None) -> Any:
        pipe = real_pipeline(transaction, shard_hint)
        execute = pipe.execute

        def forget(raise_on_error: bool = True) -> Any:
            scripted = any(c[0][0] in ("EVALSHA", "EVAL") for c in pipe.command_stack)
            replies = execute(raise_on_error)
            if scripted:
                return [redis.exceptions.NoScriptError("No matching script."), *replies[1:]]
            return replies

        setattr(pipe, "execute", forget)  # noqa: B010 - one pipeline's own method
        return pipe

    setattr(client, "pipeline", forgetful_pipeline)  # noqa: B010 - the client stands in for a proxy
    with pytest.raises(NotDurable) as caught:
        execute(journal, "wf", "r1", lambda run: run.step("a", lambda: "A"))
    assert (caught.value.run, caught.value.step) == ("wf:r1", "a")
    assert caught.value.detail == "the server refused the record script"


def test_an_error_from_the_record_script_itself_is_raised_as_it_is(
    appendonly: tuple[redis.Redis, Packets], prefix: str
) -> None:
    client, _ = appendonly
    journal = Journal(client, Keyspace(prefix), Settings(fsync_records=True))
    broken: Callable[[Run], str] = lambda run: run.step("a", lambda: "A")  # noqa: E731
    execute(journal, "wf", "r0", broken)  # loads the script
    client.set(journal.keys("wf", "r1").steps, "not a hash")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        execute(journal, "wf", "r1", broken)
