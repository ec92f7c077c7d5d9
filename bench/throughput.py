"""Runs per second through Celery: the queue's floor, a hand-written journal, ``Durable``.

    python -m bench.throughput [--rounds 5] [--runs 200] [--concurrency 2,4,8]

One throwaway Valkey (journal store, broker and result backend), one Celery worker started
here on ``bench/throughput_app.py``, the same settings for every task. Each round enqueues
``--runs`` runs of each kind in turn and times them until the last result is stored; the
rounds interleave the kinds, first with ``appendonly no``, then with ``appendfsync always``
(what the embedded server runs). Every figure is the median over the rounds, and each ratio
is taken from the same run. Targets, with AOF always: the durable workflow at least 0.9x the
hand-written journal and at least 0.5x the no-op task. With the bench extra installed
(``pip install -e '.[bench]'``), DBOS's ten-step workflow on SQLite runs in the same rounds
(a quarter as many runs, in this process); the goal is at least 5x its rate.

The whole measurement is repeated for each worker size in ``--concurrency`` (a worker of that
many processes, started afresh): with every write waiting for its fsync, a process spends
most of a run waiting on the disk, and the server's one fsync per event loop covers the writes
of every process that sent one meanwhile, so more processes share each fsync. Celery's default
is one process per core (2 here); the compose file runs 4.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from celery import Celery

import orjson
import redis
from redis.utils import HIREDIS_AVAILABLE

_ROOT = Path(__file__).resolve().parent.parent

STEPS = 10
KINDS = ("noop", "hand", "durable")
TASKS = {"noop": "bench.noop", "hand": "bench.hand", "durable": "bench.durable"}
TARGETS = {("durable", "hand"): 0.9, ("durable", "noop"): 0.5}
DBOS_GOAL = 5.0  # durable / DBOS on SQLite, when the bench extra (dbos) is installed
MODES = {"AOF off": ("no", "always"), "AOF always": ("yes", "always")}


@contextmanager
def throwaway_server() -> Iterator[tuple[str, str]]:
    """A Valkey of this run only, as the embedded server configures it: redis-py's URL, kombu's."""
    from journal.contrib.embedded import embedded_broker_url, embedded_url, stop_embedded

    state = Path(tempfile.mkdtemp(prefix="throughput-bench-"))
    try:
        yield embedded_url(state), embedded_broker_url(state)
        stop_embedded(state)
    finally:
        shutil.rmtree(state, ignore_errors=True)


@contextmanager
def worker(concurrency: int) -> Iterator[subprocess.Popen[bytes]]:
    """A Celery worker on the bench app (configured by BENCH_*), stopped afterwards."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(_ROOT)
    command = [sys.executable, "-m", "celery", "-A", "bench.throughput_app", "worker"]
    command += ["--pool", "prefork", "--concurrency", str(concurrency), "--loglevel", "WARNING"]
    command += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(command, cwd=_ROOT, env=env, stdout=log, stderr=log)
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def run_batch(app: Celery, client: redis.Redis, kind: str, runs: int) -> float:
    """Enqueue ``runs`` runs of ``kind`` and wait for every result; runs per second."""
    ids = [f"{kind}-{uuid.uuid4().hex[:12]}" for _ in range(runs)]
    started = time.perf_counter()
    results = [app.send_task(TASKS[kind], args=[run_id]) for run_id in ids]
    keys = [f"celery-task-meta-{result.id}" for result in results]
    deadline = time.monotonic() + 300
    pending = keys
    while pending:
        # A started task has a result key too (task_track_started): wait for a final state.
        if client.exists(pending[-1]):
            states = client.mget(pending)
            pending = [key for key, state in zip(pending, states, strict=True) if not _final(state)]
        if pending:
            if time.monotonic() > deadline:
                raise SystemExit(f"{kind}: {len(pending)} runs never finished")
            time.sleep(0.005)
    elapsed = time.perf_counter() - started
    failed = [r for r in results if r.state != "SUCCESS"]
    if failed:
        raise SystemExit(f"{kind}: {len(failed)} runs failed, e.g. {failed[0].result!r}")
    return runs / elapsed


def dbos_workflow(directory: Path) -> Callable[[int], float] | None:
    """DBOS's own ten-step workflow on SQLite, when the bench extra is installed.

    It runs in this process, one workflow at a time (two threads were no faster: SQLite takes
    one writer at a time); the returned function runs a batch and answers its runs/s.
    """
    try:
        from dbos import DBOS
    except ImportError:
        return None
    database = f"sqlite:///{directory / 'dbos.db'}"
    DBOS(config={"name": "bench", "system_database_url": database, "log_level": "WARNING"})

    @DBOS.step()
    def step(i: int) -> int:
        return i

    @DBOS.workflow()
    def ten_steps() -> int:
        for i in range(STEPS):
            step(i)
        return STEPS

    DBOS.launch()

    def batch(runs: int) -> float:
        started = time.perf_counter()
        for _ in range(runs):
            ten_steps()
        return runs / (time.perf_counter() - started)

    return batch


def _final(state: bytes | str | None) -> bool:
    return state is not None and orjson.loads(state)["status"] in ("SUCCESS", "FAILURE")


Samples = dict[tuple[int, str], dict[str, list[float]]]
"""Runs/s of each kind, round by round, by worker size and AOF mode."""


def measure(urls: tuple[str, str], rounds: int, runs: int, sizes: list[int]) -> Samples:
    """Each kind's runs/s in every round, by worker size and AOF mode.

    The kinds take turns within a round, in an order that rotates from round to round, so a
    ratio is taken between batches a few seconds apart and no kind always follows another.
    """
    url, broker = urls
    os.environ["BENCH_REDIS_URL"] = url
    os.environ["BENCH_BROKER_URL"] = broker
    os.environ["BENCH_PREFIX"] = f"tb{uuid.uuid4().hex[:8]}"
    from bench.throughput_app import app

    client = redis.Redis.from_url(url)
    figures: Samples = {}
    scratch = Path(tempfile.mkdtemp(prefix="throughput-dbos-"))
    dbos = dbos_workflow(scratch)
    kinds = (*KINDS, "dbos") if dbos else KINDS
    if dbos:
        dbos(10)  # warm
    for concurrency in sizes:
        with worker(concurrency):
            for kind in KINDS:  # warm every child: scripts loaded, imports done
                run_batch(app, client, kind, concurrency * 4)
            for mode, (appendonly, fsync) in MODES.items():
                client.config_set("appendonly", appendonly)
                client.config_set("appendfsync", fsync)
                samples: dict[str, list[float]] = {kind: [] for kind in kinds}
                for round_ in range(rounds):
                    for kind in KINDS[round_ % len(KINDS) :] + KINDS[: round_ % len(KINDS)]:
                        samples[kind].append(run_batch(app, client, kind, runs))
                    if dbos:
                        samples["dbos"].append(dbos(max(runs // 4, 10)))
                figures[concurrency, mode] = samples
            client.config_set("appendonly", "yes")
    client.close()
    if dbos:
        from dbos import DBOS

        DBOS.destroy()
    shutil.rmtree(scratch, ignore_errors=True)
    return figures


def report(figures: Samples) -> None:
    """Median runs/s by worker size and AOF mode, then each ratio with its target.

    A ratio is the median of the rounds' own ratios, each between batches run side by side,
    with the lowest and highest round after it: a machine whose speed drifts over the minutes
    of a run moves both sides of a round's ratio together.
    """
    kinds = list(next(iter(figures.values())))
    targets = dict(TARGETS)
    if "dbos" in kinds:
        targets[("durable", "dbos")] = DBOS_GOAL
    print(f"\n{'processes, AOF':<20}" + "".join(f"{kind:>9}" for kind in kinds), end="")
    print("".join(f"  {f'{over}/{under} (rounds)':<32}" for over, under in targets))
    for (concurrency, mode), samples in figures.items():
        line = f"{concurrency:>2}, {mode:<16}"
        line += "".join(f"{median(samples[k]):>9.0f}" for k in kinds)
        for (over, under), target in targets.items():
            ratios = [a / b for a, b in zip(samples[over], samples[under], strict=True)]
            figure = f"{median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
            if mode == "AOF always":
                figure += f" >={target} {'PASS' if median(ratios) >= target else 'FAIL'}"
            line += f"  {figure:<32}"
        print(line)


def sizes(text: str) -> list[int]:
    """``--concurrency``: worker sizes, comma-separated."""
    try:
        chosen = [int(part) for part in text.split(",")]
    except ValueError:
        chosen = []
    if not chosen or min(chosen) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of process counts, e.g. 2,4,8")
    return chosen


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments, start the server and each worker, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=200, help="runs of each kind per round")
    parser.add_argument(
        "--concurrency", type=sizes, default=[2, 4, 8], help="worker sizes, e.g. 2,4,8"
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    with throwaway_server() as urls:
        info = redis.Redis.from_url(urls[0]).info("server")
        reader = "hiredis" if HIREDIS_AVAILABLE else "pure-Python parser"
        version = info.get("valkey_version", info["redis_version"])
        print(f"valkey {version}, one throwaway server; redis-py with {reader}")
        print(f"{args.rounds} rounds x {args.runs} runs of each kind, for each worker size")
        report(measure(urls, args.rounds, args.runs, args.concurrency))
    print(f"\n{time.monotonic() - started:.1f}s")


if __name__ == "__main__":
    main()
