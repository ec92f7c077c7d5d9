"""Real processes for tests: the digest CLI, Celery workers and beat, each isolated.

Every test that starts processes gets its own state dir, hence its own embedded Valkey server
(journal store and Celery broker), and its own key prefix; nothing touches the shared Redis.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

import redis

from journal import Journal, Outcome, Run, StepEvent
from journal._lease import Grant, Lease
from journal._redis.scripts import Client
from journal._schema.keys import Index, Keyspace
from journal.contrib.embedded import embedded_url, stop_embedded, valkey_server_binary
from journal.events import listen
from journal.ops.views import RunView, inspect_run
from tasks.config import Config
from tasks.keys import DigestKeys
from tasks.runtime import Runtime

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

# The week the process tests run: the shipped items file, the tutorial's eight updates.
RUN = "2026-w42"
WEEK: list[dict[str, str]] = json.loads((ROOT / "data" / "items.json").read_text())
TITLES = [item["title"] for item in WEEK]
JOURNAL = ["select", *(f"summarize:{item['id']}" for item in WEEK), "compose", "send"]
JOURNAL += ["mark-seen", "done"]
CALLS = len(WEEK) + 1  # one summary per item, then the opening paragraph


def item_ordered(records: Iterable[Any]) -> list[str]:
    """The recorded steps' keys, the summaries among them put in item order.

    The map records each answer the moment it arrives, so the summaries' order in the journal
    is the model's; every other step keeps its recorded place.
    """
    keys = [str(record.key) for record in records]
    summaries = iter(
        sorted(
            (key for key in keys if key.startswith("summarize:")),
            key=lambda key: JOURNAL.index(key) if key in JOURNAL else len(JOURNAL),
        )
    )
    return [next(summaries) if key.startswith("summarize:") else key for key in keys]


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, every: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


T = TypeVar("T")

# Wraps a command line to run it elsewhere (``Host.command`` of ``tests/hosts.py`` runs it in a
# network namespace); it must exec the command, so the pid a test signals stays the command's.
Launcher = Callable[..., list[str]]


def watched_client(url: str, before_send: Callable[[bytes], None]) -> redis.Redis:
    """A client that hands each request it sends (one per round trip) to ``before_send`` first.

    For counting a path's round trips, reading what it sends, or acting between two of them.
    The connection class is the URL's own (TCP or a unix socket), so any store URL works.
    """
    base = redis.ConnectionPool.from_url(url).connection_class

    def send_packed_command(self: Any, command: Any, check_health: bool = True) -> None:
        data = command if isinstance(command, bytes) else b"".join(bytes(c) for c in command)
        before_send(data)
        base.send_packed_command(self, command, check_health)

    watched = type("Watched", (base,), {"send_packed_command": send_packed_command})
    return redis.Redis.from_url(url, connection_class=watched)


def execute(
    journal: Journal,
    workflow: str,
    run_id: str,
    body: Callable[[Run], Any],
    *,
    args: dict[str, Any] | None = None,
    on_step: Callable[[StepEvent], None] | None = None,
    delivered: bool = False,
) -> Outcome:
    """A bare body started under the lease: the protocol's own tests drive the delivery.

    Applications define a workflow with ``@journal.workflow`` and start it with its ``start``;
    these tests need bodies that read ``run.args`` themselves and deliveries counted as a
    queue's, which only the delivery under ``Workflow.start`` takes.
    """
    keys = journal.keys(workflow, run_id)
    return journal._deliver(keys, body, args=args, on_step=on_step, delivered=delivered)


def acquire(lease: Lease, now_ms: int) -> Grant:
    """Take ``lease`` alone, opening no run: the protocol's tests hold a run by hand.

    Raises:
        LeaseBusy: another holder's lease is live.
    """
    grant = lease._take(now_ms, None)
    assert isinstance(grant, Grant)  # without an opening the script never finds a run
    return grant


class HasKeyspace(Protocol):
    """A journal, or a test's own holder of its keyspace."""

    @property
    def keyspace(self) -> Keyspace: ...


def only_index(holder: HasKeyspace) -> Index:
    """The runs and due indexes of an unsharded keyspace (a sharded one has one per shard)."""
    (index,) = holder.keyspace.indexes()
    return index


def round_trips(client: Client, action: Callable[[], Any]) -> list[str]:
    """The commands ``action`` sent to the server, one per round trip, as MONITOR saw them.

    Counted between two ECHO markers this sends; a script's own commands are the script's, and
    a MULTI ... EXEC is one. MONITOR sees the whole server: only the suite's own Valkey.
    """
    start, end = f"start-{uuid.uuid4().hex}", f"end-{uuid.uuid4().hex}"
    seen: list[str] = []
    failed: list[BaseException] = []
    ready = threading.Event()
    # Its own connection with no read timeout: a process starting up may say nothing for
    # longer than the client's timeout, and a watcher that timed out would count too few.
    assert isinstance(client, redis.Redis), "MONITOR sees one server: count on a single one"
    watching = redis.Redis(
        connection_pool=redis.ConnectionPool(
            connection_class=client.connection_pool.connection_class,
            **{**client.connection_pool.connection_kwargs, "socket_timeout": None},
        )
    )

    def watch() -> None:
        try:
            count()
        except BaseException as error:  # the caller re-raises it: never a partial count
            failed.append(error)
            ready.set()

    def count() -> None:
        # redis-py leaves monitor unannotated.
        with watching.monitor() as monitor:  # type: ignore[no-untyped-call]
            ready.set()
            recording = False
            # Per connection: another one's commands may come between a MULTI and its EXEC.
            in_transaction: set[tuple[str, str]] = set()
            for command in monitor.listen():
                text: str = command["command"]
                client_id = (command.get("client_address", ""), command.get("client_port", ""))
                if text == f"ECHO {start}":
                    recording = True
                elif text == f"ECHO {end}":
                    return
                elif recording and command["client_type"] != "lua":
                    if text == "MULTI":
                        in_transaction.add(client_id)
                        seen.append(text)
                    elif text == "EXEC":
                        in_transaction.discard(client_id)
                    elif client_id not in in_transaction:
                        seen.append(text)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        assert ready.wait(5)  # MONITOR has answered: every command from here on is streamed
        client.echo(start)
        action()
        client.echo(end)
        watcher.join(5)
    finally:
        watching.close()
    assert not watcher.is_alive(), "MONITOR never saw the end marker"
    assert not failed, f"MONITOR's watcher died, so its count is partial: {failed[0]!r}"
    return seen


def returning(value: T) -> Callable[[], T]:
    """A step body that returns ``value``; a lambda made in a loop would see the last value."""
    return lambda: value


def server_ms(store: redis.Redis) -> int:
    """The server's clock, in milliseconds: what a script's deadlines are written against."""
    seconds, micros = store.time()
    return int(seconds) * 1000 + int(micros) // 1000


def as_bytes(value: bytes | str | None) -> bytes:
    """A value read back by a test's client, which never decodes replies: bytes, or fail."""
    assert isinstance(value, bytes), f"expected bytes from Redis, got {value!r}"
    return value


def as_text(value: bytes | str | None) -> str:
    """A key, field or value read back by a test's client, as text."""
    return as_bytes(value).decode()


Event = tuple[str, str, float]
_event_sinks: list[list[Event]] = []


def _to_sinks(event: str, label: str, amount: float, workflow: str) -> None:
    for sink in _event_sinks:
        sink.append((event, label, amount))


@contextlib.contextmanager
def recorded_events() -> Iterator[list[Event]]:
    """Every journal event (``journal.events.emit``) of this process while the block runs.

    Listeners cannot be removed, so one listener is registered once and feeds whichever
    blocks are open.
    """
    listen(_to_sinks)
    sink: list[Event] = []
    _event_sinks.append(sink)
    try:
        yield sink
    finally:
        _event_sinks.remove(sink)


def fresh_items(directory: Path, tag: str, count: int | None = None) -> Path:
    """The shipped updates under ids no other run has used, so a run summarizes them all.

    Without ``count``, the shipped eight once, ids prefixed with ``tag``; with it, the eight
    over and over up to ``count``, each numbered in its id and title (a week of thousands).
    """
    shipped = json.loads((ROOT / "data" / "items.json").read_text(encoding="utf-8"))
    if count is None:
        items = [{**item, "id": f"{tag}-{item['id']}"} for item in shipped]
    else:
        items = [
            {**shipped[n % len(shipped)], "id": f"{tag}-{n}", "title": f"{tag} update {n}"}
            for n in range(count)
        ]
    path = directory / f"items-{tag}.json"
    path.write_text(json.dumps(items))
    return path


def fake_api_runtime(config: Config, client: redis.Redis, journal: Journal, fake: Any) -> Runtime:
    """A runtime whose model calls go to ``fake`` (a ``FakeAnthropic``), its email to a file.

    The first model of each chain is the summarizer's; the rest of a chain is the config's.
    """
    from tasks.llm.client import AnthropicSummarizer
    from tasks.mail.smtp import FileOutbox

    return Runtime(
        config=config,
        client=client,
        journal=journal,
        keys=DigestKeys(config.key_prefix),
        summarizer=AnthropicSummarizer(
            functools.partial(fake.client, timeout=5.0),
            config.summary_models[0],
            config.intro_models[0],
        ),
        mailer=FileOutbox(config.state_dir / "outbox"),
    )


def counted_by(counter: Any, **labels: str) -> float:
    """What a prometheus counter of this process counted for ``labels`` (its ``_total``)."""
    [family] = counter.collect()
    return float(
        sum(
            sample.value
            for sample in family.samples
            if sample.name.endswith("_total") and sample.labels == labels
        )
    )


def digest_env(state_dir: Path, **overrides: str) -> dict[str, str]:
    """The environment of a CLI, worker or beat process in an isolated deployment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DIGEST_", "CRASH"))}
    env.pop("REDIS_URL", None)
    env.pop("CELERY_BROKER_URL", None)
    env.update(
        {
            "DIGEST_STATE_DIR": str(state_dir),
            "DIGEST_KEY_PREFIX": f"t{uuid.uuid4().hex[:8]}",
            "DIGEST_ITEMS": str(ROOT / "data" / "items.json"),
            "DIGEST_LEASE_TTL": "2",
            "DIGEST_RETRY_BASE_DELAY": "0.01",
            "DIGEST_SWEEP_INTERVAL": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(overrides)
    return env


class Deployment:
    """One isolated deployment: a state dir, its embedded server, its environment."""

    def __init__(self, state_dir: Path, **env: str) -> None:
        self.state_dir = state_dir
        state_dir.mkdir(parents=True, exist_ok=True)
        self.env = digest_env(state_dir, **env)
        self.processes: list[subprocess.Popen[bytes]] = []

    @property
    def config(self) -> Config:
        """The configuration these processes read."""
        return Config.from_env(self.env)

    def runtime(self) -> Runtime:
        """The same runtime a process of this deployment builds, for inspecting from a test."""
        return Runtime.build(self.config, allow_offline=True)

    def client(self) -> redis.Redis:
        """A client of this deployment's store (the embedded server, unless REDIS_URL is set)."""
        return redis.Redis.from_url(self.env.get("REDIS_URL") or embedded_url(self.state_dir))

    def view(self, run_id: str, workflow: str = "digest") -> RunView:
        """What the journal holds for a run."""
        return inspect_run(self.runtime().journal, workflow, run_id)

    def outbox(self) -> list[Path]:
        """Emails delivered to the file outbox."""
        directory = self.state_dir / "outbox"
        return sorted(directory.glob("*.json")) if directory.exists() else []

    def cli(
        self, *args: str, env: Mapping[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run ``digest ARGS`` to completion and capture its output."""
        return subprocess.run(
            [str(BIN / "digest"), *args],
            cwd=ROOT,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def worker(
        self,
        name: str,
        *,
        concurrency: int = 2,
        env: Mapping[str, str] | None = None,
        extra: tuple[str, ...] = (),
        on: Launcher | None = None,
    ) -> Worker:
        """Start ``celery -A tasks worker`` and wait until it is ready.

        Args:
            on: runs the worker elsewhere, such as on a host of ``tests/hosts.py``.
        """
        log = self.state_dir / f"worker-{name}.log"
        process = self._celery(
            "worker",
            f"--hostname={name}@%h",
            f"--concurrency={concurrency}",
            "--without-gossip",
            "--without-mingle",
            *extra,
            log=log,
            env=env,
            on=on,
        )
        worker = Worker(process, log)
        wait_until(worker.ready, 30, f"worker {name} to be ready (log: {log})")
        return worker

    def beat(
        self,
        env: Mapping[str, str] | None = None,
        on: Launcher | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``celery -A tasks beat`` with its schedule file in the state dir."""
        schedule = f"--schedule={self.state_dir / 'beat-schedule'}"
        return self._celery("beat", schedule, log=self.state_dir / "beat.log", env=env, on=on)

    def _celery(
        self,
        *args: str,
        log: Path,
        env: Mapping[str, str] | None,
        on: Launcher | None = None,
    ) -> subprocess.Popen[bytes]:
        command = [str(BIN / "celery"), "-A", "tasks", *args, "--loglevel=INFO"]
        process = subprocess.Popen(
            on(*command) if on is not None else command,
            cwd=ROOT,
            env={**self.env, **(env or {})},
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.processes.append(process)
        return process

    def close(self) -> None:
        """Kill every process started here and stop the embedded server.

        Under ``make coverage`` each process is first asked to stop (SIGTERM: a worker's warm
        shutdown ends its pool children too), so that every one saves what it measured.
        """
        if "COVERAGE_PROCESS_CONFIG" in os.environ:
            for process in self.processes:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            for process in self.processes:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=10)
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        stop_embedded(self.state_dir)


class Worker:
    """A running ``celery worker`` process group."""

    def __init__(self, process: subprocess.Popen[bytes], log: Path) -> None:
        self.process = process
        self.log = log

    def text(self) -> str:
        """The worker's log so far."""
        return self.log.read_text(errors="replace")

    def ready(self) -> bool:
        """Whether the worker said it is ready (or died trying)."""
        if self.process.poll() is not None:
            raise AssertionError(f"worker exited with {self.process.returncode}:\n{self.text()}")
        return " ready." in self.text()

    def children(self) -> list[int]:
        """Pids of the pool's child processes."""
        out = subprocess.run(
            ["pgrep", "-P", str(self.process.pid)], capture_output=True, text=True, check=False
        )
        return [int(pid) for pid in out.stdout.split()]

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole worker: main process and pool children."""
        os.killpg(self.process.pid, sig)

    def stop(self, timeout: float = 30) -> int:
        """Warm shutdown (SIGTERM) and wait for it."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)


class ThrowawayValkeys:
    """Valkey servers with given options, each on its own unix socket in one directory.

    For tests that need a server configured a certain way (appendonly off, an evicting
    policy, WAITAOF); ``close`` kills every one.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, *options: str, on: Launcher | None = None) -> Path:
        """Start one and wait for its PING; returns its socket.

        Args:
            options: server options; they override the defaults (``--port 6379`` with a
                ``--bind`` serves TCP as well).
            on: runs the server elsewhere, such as on a host of ``tests/hosts.py``; the socket
                is a file, so the test reaches the server on any host.
        """
        sock = self.directory / f"v{len(self.processes)}.sock"
        base = [
            "--port",
            "0",
            "--unixsocket",
            str(sock),
            "--save",
            "",
            "--dir",
            str(self.directory),
        ]
        command = [str(valkey_server_binary()), *base, *options]
        process = subprocess.Popen(
            on(*command) if on is not None else command, stdout=subprocess.DEVNULL
        )
        self.processes.append(process)
        probe = redis.Redis(unix_socket_path=str(sock))

        def answers() -> bool:
            assert process.poll() is None, f"valkey exited with {process.returncode}"
            try:
                return bool(probe.ping())
            except redis.ConnectionError:
                return False

        wait_until(answers, 10, f"valkey on {sock} to answer PING", every=0.01)
        probe.close()
        return sock

    def close(self) -> None:
        """Kill every server started here."""
        for process in self.processes:
            process.kill()
            process.wait()


class HeldPort:
    """A loopback TCP port held by a bound socket that does not listen: connecting is refused.

    Unlike binding a probe and closing it, which lets any other process take the port before
    the test uses it, the port stays this test's own: ``socket`` is handed to the server that
    is to answer on it (``start_server(..., sock=held.socket)``).
    """

    def __init__(self) -> None:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.port: int = self.socket.getsockname()[1]

    def close(self) -> None:
        """Let the port go."""
        self.socket.close()


class Relay:
    """A unix-socket relay to a real Redis server that a test can cut, as a partition would.

    ``cut`` closes every relayed connection and refuses new ones until ``restore``: the client
    sees the connection errors of a lost server while the server itself, shared by the test
    session, is never touched. ``lag`` holds each reply back that many seconds, as a slow
    network or a paused process would.
    """

    lag = 0.0

    def __init__(self, target_url: str, directory: Path) -> None:
        target = urlsplit(target_url)
        self._family = socket.AF_UNIX if target.scheme == "unix" else socket.AF_INET
        self._address: str | tuple[str, int] = (
            target.path if target.scheme == "unix" else (target.hostname or "", target.port or 6379)
        )
        database = target.path.strip("/") if target.scheme != "unix" else ""
        self.path = directory / f"relay-{uuid.uuid4().hex[:8]}.sock"
        self.url = f"unix://{self.path}" + (f"?db={database}" if database else "")
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._cut = False
        self._listener = socket.socket(socket.AF_UNIX)
        self._listener.bind(str(self.path))
        self._listener.listen()
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        """Drop every connection and refuse new ones."""
        with self._lock:
            self._cut = True
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._open.clear()

    def restore(self) -> None:
        """Accept and relay connections again."""
        with self._lock:
            self._cut = False

    def close(self) -> None:
        """Stop relaying for good."""
        self.cut()
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self._cut:
                    client.close()
                    continue
                upstream = socket.socket(self._family)
                upstream.connect(self._address)
                self._open += [client, upstream]
            for source, sink, replies in ((client, upstream, False), (upstream, client, True)):
                pump = threading.Thread(target=self._pump, args=(source, sink, replies))
                pump.daemon = True
                pump.start()

    def _pump(self, source: socket.socket, sink: socket.socket, replies: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if replies and self.lag:
                    time.sleep(self.lag)
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_RDWR)


def schedule_profiles(name: str, ci: tuple[int, int], long: tuple[int, int]) -> str:
    """Register Hypothesis profiles ``<name>-ci`` and ``<name>-long`` of (examples, steps).

    Returns the one to run: the long one when ``DIGEST_HYPOTHESIS_PROFILE=long``.
    """
    from hypothesis import HealthCheck, settings

    for kind, (examples, steps) in (("ci", ci), ("long", long)):
        settings.register_profile(
            f"{name}-{kind}",
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        )
    return f"{name}-{'long' if os.environ.get('DIGEST_HYPOTHESIS_PROFILE') == 'long' else 'ci'}"


class AofValkey:
    """One Valkey server, ``appendonly yes`` + ``appendfsync always``, restartable on its AOF.

    A kill -9 loses nothing the server acknowledged (the journal's A1 property), so a restart
    on the same directory gives back every record, fence and claim. A unix socket, not a TCP
    port: a restart finds its address free, never taken meanwhile.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.socket = directory / "valkey.sock"
        self.url = f"unix://{self.socket}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> AofValkey:
        """Start the server (on the AOF left by the last one) and wait for its PING."""
        command = [
            str(valkey_server_binary()),
            "--port",
            "0",
            "--unixsocket",
            str(self.socket),
            "--dir",
            str(self.directory),
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--maxmemory-policy",
            "noeviction",
            "--unixsocketperm",
            "777",  # a worker of another user (``hidden``) connects too
        ]
        log = (self.directory / "valkey.log").open("ab")
        self.process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        probe = redis.Redis(unix_socket_path=str(self.socket))

        def answers() -> bool:
            assert self.process is not None and self.process.poll() is None, "valkey exited"
            try:
                return bool(probe.ping())
            except (redis.ConnectionError, redis.BusyLoadingError):
                return False

        try:
            wait_until(answers, 20, "valkey to answer PING", every=0.02)
        finally:
            probe.close()
        return self

    def kill(self) -> None:
        """SIGKILL the server: no shutdown, no final fsync beyond what ``always`` did."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def client(self) -> redis.Redis:
        """A client of the server, with short timeouts: the campaign never waits on it long."""
        return redis.Redis(
            unix_socket_path=str(self.socket), socket_timeout=2, socket_connect_timeout=2
        )
