"""What the journal costs over the raw Redis commands it is built from, on one server in one run.

    python -m bench.journal              # a throwaway Valkey, started and removed here
    python -m bench.journal --url URL    # another server: only this run's keys are touched
    python -m bench.journal --profile    # add where the time of the two targeted paths goes

Every row is the median of many timed calls, interleaved with the raw command it is compared
with, so both see the same server, the same load and the same moment. Two targets:

- a fenced step record (``run.step`` inside ``Journal.execute``: lease check, encoding, the
  record script, bookkeeping) costs at most 1.3 PINGs;
- opening a run of 10,000 recorded steps and replaying them (the opening script, which
  returns the steps hash, the field names, ``run.step`` for each) costs at most twice the
  raw HGETALL of the same hash.

On a server we started, writes are timed under ``appendfsync always`` (what the embedded
server runs) and ``appendfsync no`` (the journal's own cost, without the disk), because an
fsync per write dwarfs everything the journal itself does. A server given with ``--url`` is
measured as it is configured; its settings are never changed, and it is never flushed.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.metadata
import importlib.util
import io
import platform
import pstats
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

import orjson
import redis
from redis.utils import HIREDIS_AVAILABLE

from journal import Journal, Keyspace, Run, Settings, workflow
from journal._clock import millis
from journal._lease import Grant
from journal._redis.scripts import Client

WRITE_REPS = 3000
REPLAY_REPS = {10: 1000, 1_000: 100, 10_000: 15}
RECORD_TARGET = 1.3
REPLAY_TARGET = 2.0
PROFILED = r"/journal/(?!lua)|orjson|<string>|\((evalsha|hgetall)\)"
SUMMARY = (
    "the release notes mention a faster scheduler, fewer retries on flaky networks, a new "
    "billing page for teams, and a fix for invoices that were rounded the wrong way; "
    "nothing in it needs action from this team before the next release"
)


@dataclass(frozen=True)
class Server:
    """The server under test, and whether it is ours to reconfigure."""

    client: redis.Redis
    description: str
    owned: bool


@dataclass(frozen=True)
class Row:
    """One measured path: its median and the baseline it is compared with."""

    name: str
    micros: float
    baseline: float
    target: float | None = None
    server: float | None = None

    @property
    def ratio(self) -> float:
        """The row's cost in units of its baseline."""
        return self.micros / self.baseline


def summary(i: int) -> dict[str, Any]:
    """A step result shaped like a model summary: about 200 characters of text plus usage."""
    return {
        "summary": f"Update {i}: {SUMMARY}"[:200],
        "usage": {
            "input_tokens": 1200 + i % 97,
            "output_tokens": 180 + i % 13,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def stored_record(i: int) -> bytes:
    """The bytes ``run.step`` stores for step ``i`` (the record script writes them as given)."""
    return orjson.dumps(
        {
            "result": summary(i),
            "seq": i + 1,
            "attempt": 1,
            "fence": 1,
            "started_at": 1_800_000_000_000,
            "finished_at": 1_800_000_000_250,
            "kind": "step",
        }
    )


def median_us(samples_ns: list[int]) -> float:
    """Median of nanosecond samples, in microseconds."""
    return median(samples_ns) / 1000


@contextmanager
def throwaway_server() -> Iterator[Server]:
    """A Valkey started for this run only, with the journal's durability settings."""
    state = Path(tempfile.mkdtemp(prefix="journal-bench-"))
    try:
        try:
            from journal.contrib.embedded import embedded_url, stop_embedded
        except ImportError:
            with _bare_valkey(state) as client:
                yield Server(client, "throwaway valkey on a unix socket", owned=True)
            return
        client = redis.Redis.from_url(embedded_url(state))
        try:
            yield Server(
                client, "throwaway valkey (journal.contrib.embedded) on a unix socket", True
            )
        finally:
            client.close()
            stop_embedded(state)
    finally:
        shutil.rmtree(state, ignore_errors=True)


@contextmanager
def _bare_valkey(state: Path) -> Iterator[redis.Redis]:
    from journal.contrib.embedded import valkey_server_binary

    sock = state / "valkey.sock"
    options = ["--port", "0", "--unixsocket", str(sock), "--dir", str(state), "--save", ""]
    options += ["--appendonly", "yes", "--appendfsync", "always"]
    proc = subprocess.Popen([str(valkey_server_binary()), *options], stdout=subprocess.DEVNULL)
    client = redis.Redis(unix_socket_path=str(sock))
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("valkey did not start; run with --url instead") from None
                time.sleep(0.02)
        yield client
    finally:
        client.close()
        proc.kill()
        proc.wait()


@contextmanager
def given_server(url: str) -> Iterator[Server]:
    """A server someone else runs: used as it is."""
    client = redis.Redis.from_url(url)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        raise SystemExit(f"cannot reach {url} ({exc}); start it or pass another --url") from None
    try:
        yield Server(client, f"{url} (not ours: unchanged, only this run's keys)", owned=False)
    finally:
        client.close()


def server_line(server: Server) -> str:
    """What ran where: the numbers mean little without it."""
    info = server.client.info("server")
    product = (
        f"valkey {info['valkey_version']}"
        if "valkey_version" in info
        else f"redis {info['redis_version']}"
    )
    parser = "with hiredis" if HIREDIS_AVAILABLE else "pure-Python parser (no hiredis)"
    return (
        f"{product}, {server.description}\n"
        f"redis-py {importlib.metadata.version('redis')} {parser}, "
        f"orjson {importlib.metadata.version('orjson')}, Python {platform.python_version()}"
    )


def appendfsync(client: redis.Redis) -> str:
    """The server's fsync policy, or what it says instead (AOF off, CONFIG refused)."""
    try:
        raw: dict[Any, Any] = client.config_get("appendonly", "appendfsync")
    except redis.ResponseError:
        return "unknown (CONFIG refused)"
    config = {_text(name): _text(value) for name, value in raw.items()}
    if config.get("appendonly") == "no":
        return "off (appendonly no)"
    return config.get("appendfsync", "unknown")


def returning(value: object) -> Callable[[], object]:
    """A step body that returns ``value``; a lambda made in a loop would see the last value."""
    return lambda: value


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def measure_writes(journal: Journal, run_id: str) -> list[Row]:
    """PING, HSET, the record script and ``run.step``, interleaved inside one real run."""
    client = journal.client
    raw_hash = f"{journal.keyspace.prefix}:raw-hset"
    ping: list[int] = []
    hset: list[int] = []
    script: list[int] = []
    step: list[int] = []

    def body(run: Run) -> None:
        record_keys = [run.keys.lease, run.keys.steps, run.keys.meta]
        clock = time.perf_counter_ns
        for i in range(WRITE_REPS):
            encoded = stored_record(i)
            result = summary(i)
            started = clock()
            client.ping()
            ping.append(clock() - started)
            started = clock()
            client.hset(raw_hash, f"s{i}", encoded)
            hset.append(clock() - started)
            started = clock()
            journal.backend.scripts.record(
                keys=record_keys, args=[run.holder, f"direct:{i}", encoded]
            )
            script.append(clock() - started)
            started = clock()
            run.step(f"s{i}", returning(result))
            step.append(clock() - started)

    before = command_stats(client)
    workflow("bench")(body).start(run_id, journal=journal)
    server = server_micros(before, command_stats(client))
    base = median_us(ping)
    return [
        Row("PING", base, base, None, server.get("ping")),
        Row("HSET of the same record bytes", median_us(hset), base, None, server.get("hset")),
        Row("record script alone (EVALSHA)", median_us(script), base, None, server.get("evalsha")),
        Row(
            "fenced step record (run.step)",
            median_us(step),
            base,
            RECORD_TARGET,
            server.get("evalsha"),
        ),
    ]


def command_stats(client: Client) -> dict[str, dict[str, Any]]:
    """The server's per-command counters, read-only, or nothing if it will not tell."""
    try:
        return dict(client.info("commandstats"))
    except redis.ResponseError:
        return {}


def server_micros(
    before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]
) -> dict[str, float]:
    """Server-side microseconds per call of each command between two readings.

    A difference, not a CONFIG RESETSTAT, so a server that is not ours is left as it was;
    its other clients' calls blur the figure a little.
    """
    per_call: dict[str, float] = {}
    for command in ("ping", "hset", "evalsha"):
        name = f"cmdstat_{command}"
        if name not in after:
            continue
        calls = after[name]["calls"] - before.get(name, {}).get("calls", 0)
        usec = after[name]["usec"] - before.get(name, {}).get("usec", 0)
        if calls:
            per_call[command] = usec / calls
    return per_call


def populate(journal: Journal, run_id: str, steps: int) -> list[str]:
    """A run whose journal holds ``steps`` records, in the order the workflow asks for them."""
    keys = journal.keys("bench", run_id)
    order = [f"s{i}" for i in range(steps)]
    for start in range(0, steps, 1000):
        journal.client.hset(
            keys.steps,
            mapping={f"s{i}": stored_record(i) for i in range(start, min(start + 1000, steps))},
        )
    return order


def open_and_replay(
    journal: Journal, run_id: str, order: list[str]
) -> tuple[Run, Callable[[], object]]:
    """What opening a run does (the opening script, which returns its journal), then every
    step replayed; and how to give the lease back, outside what is timed."""
    keys = journal.keys("bench", run_id)
    lease = journal.runner._lease(keys)
    grant = lease.open(millis(journal.clock.now()), journal.runner._opening(None))
    assert isinstance(grant, Grant) and grant.status == 1, grant
    run, heartbeat = journal.runner._open(keys, grant, None, lease, None)
    for key in order:
        run.step(key, _never)
    heartbeat.stop()
    return run, lambda: lease.release(grant.holder)


def _never() -> None:
    raise AssertionError("a recorded step ran again instead of replaying")


def measure_replay(journal: Journal, steps: int) -> Row:
    """Open and replay ``steps`` records, interleaved with a raw HGETALL of the same hash."""
    run_id = f"replay-{steps}"
    order = populate(journal, run_id, steps)
    steps_key = journal.keys("bench", run_id).steps
    raw: list[int] = []
    full: list[int] = []
    clock = time.perf_counter_ns
    for _ in range(REPLAY_REPS[steps]):
        started = clock()
        journal.client.hgetall(steps_key)
        raw.append(clock() - started)
        started = clock()
        run, release = open_and_replay(journal, run_id, order)
        full.append(clock() - started)
        release()
        assert run.replayed == steps
    target = REPLAY_TARGET if steps == 10_000 else None
    return Row(f"{steps:,} steps", median_us(full), median_us(raw), target)


def profile(journal: Journal) -> str:
    """Where the time of the two targeted paths goes, by cumulative time.

    Listed: the journal's functions, orjson, generated dataclass ``__init__`` methods
    (``<string>``) and the redis-py command each path ends in.
    """
    out = io.StringIO()
    profiler = cProfile.Profile()

    results = [summary(i) for i in range(WRITE_REPS)]

    def body(run: Run) -> None:
        profiler.enable()
        for i, result in enumerate(results):
            run.step(f"s{i}", returning(result))
        profiler.disable()

    workflow("bench")(body).start("profile-record", journal=journal)
    out.write(f"\n-- {WRITE_REPS} fenced step records, by cumulative time --\n")
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(PROFILED)
    order = populate(journal, "profile-replay", 10_000)
    profiler = cProfile.Profile()
    _, release = profiler.runcall(open_and_replay, journal, "profile-replay", order)
    release()
    out.write("\n-- open and replay of 10,000 steps, by cumulative time --\n")
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(PROFILED)
    return out.getvalue()


def verdict(row: Row) -> str:
    """The target column: the limit and whether the row meets it."""
    if row.target is None:
        return ""
    return f"<= {row.target:.2f}  {'PASS' if row.ratio <= row.target else 'FAIL'}"


def print_writes(policy: str, rows: list[Row]) -> None:
    """One block of the write table."""
    title = f"writes, appendfsync {policy}"
    print(f"\n{title:<42}{'median us':>10}{'in server':>11}{'x PING':>8}   target")
    for row in rows:
        server = "" if row.server is None else f"{row.server:.1f}"
        print(f"  {row.name:<40}{row.micros:>10.1f}{server:>11}{row.ratio:>8.2f}   {verdict(row)}")


def print_replay(rows: list[Row]) -> None:
    """The replay table."""
    title = "open + replay (HGETALL, decode, run.step)"
    print(f"\n{title:<42}{'median us':>10}{'HGETALL':>11}{'ratio':>8}   target")
    for row in rows:
        print(
            f"  {row.name:<40}{row.micros:>10.0f}{row.baseline:>11.0f}{row.ratio:>8.2f}   "
            f"{verdict(row)}"
        )


def run_bench(server: Server, with_profile: bool) -> None:
    """Measure everything against ``server`` under a prefix of this run's own."""
    prefix = f"bench-{uuid.uuid4().hex[:10]}"
    # Replay opens the same run over and over without recording: never park it for that.
    settings = Settings(max_stalled_starts=1_000_000)
    journal = Journal(server.client, keyspace=Keyspace(prefix), settings=settings)
    started = time.monotonic()
    print(server_line(server))
    try:
        if server.owned:
            for policy in ("always", "no"):
                server.client.config_set("appendfsync", policy)
                print_writes(policy, measure_writes(journal, f"writes-{policy}"))
        else:
            print_writes(appendfsync(server.client), measure_writes(journal, "writes"))
        print_replay([measure_replay(journal, steps) for steps in REPLAY_REPS])
        if with_profile:
            print(profile(journal))
    finally:
        drop_keys(server.client, prefix)
    print(f"\n{time.monotonic() - started:.1f}s")


def drop_keys(client: redis.Redis, prefix: str) -> None:
    """Remove every key this run wrote, and nothing else."""
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        client.delete(key)


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments, pick the server, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", help="measure this server instead of a throwaway Valkey")
    parser.add_argument("--profile", action="store_true", help="print cProfile of both targets")
    args = parser.parse_args(argv)
    with given_server(args.url) if args.url else throwaway_server() as server:
        run_bench(server, args.profile)


if __name__ == "__main__":
    main()
