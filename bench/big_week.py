"""A week of thousands of items: wall time against the rate limit's floor, the replay of the
finished run, the digest process's peak memory and its round trips per item.

    python -m bench.big_week                    # 5,000 items, offline then through the fake API
    python -m bench.big_week --items 1000 --offline-only

Each week is a ``digest run`` process (the task body a worker runs, in a process of its own)
on an embedded Valkey of its own, started before timing. Offline, the week is timed, then the
next week of as many fresh items is run under MONITOR (``tests.support.round_trips``) to count
its round trips, the finished run is rehearsed in memory (``digest fork RUN --from compose
--dry-run``: every recorded step replayed, the opening made again) and shown (``digest show``).
Through the fake Anthropic API (``tests/fakes/anthropic_server.py``), which enforces a request
rate as the real one does and answers each call after ``--latency``, the floor is the calls
answered over the rate; the span runs from the first request's arrival to the last answer.
A process's peak memory is its maximum resident set (``ru_maxrss``), read by a wrapper that
runs it as its only child.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.fakes.anthropic_server import FakeAnthropic
from tests.support import BIN, ROOT, Deployment, fresh_items, round_trips

# Runs its arguments as a child and prints the child's peak resident set, kilobytes, last.
_PEAK = (
    "import resource, subprocess, sys; "
    "done = subprocess.run(sys.argv[1:]); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
    "sys.exit(done.returncode)"
)


@dataclass(frozen=True)
class Measured:
    """One process: its wall time, peak memory, output."""

    wall: float
    peak_mb: float
    stdout: str


def measured(deployment: Deployment, *args: str, env: dict[str, str] | None = None) -> Measured:
    """``digest ARGS`` timed as a whole process, with its peak memory; it must exit 0."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _PEAK, str(BIN / "digest"), *args],
        env={**deployment.env, **(env or {})},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"digest {' '.join(args)} failed: {done.stderr[-2000:]}")
    peak_kb = int(done.stderr.strip().splitlines()[-1])
    return Measured(wall, peak_kb / 1024, done.stdout)


def offline(directory: Path, count: int) -> None:
    """The week offline: timed, then the next one counted, the first rehearsed and shown."""
    deployment = Deployment(directory / "offline", DIGEST_LEASE_TTL="60")
    try:
        deployment.client().ping()  # the embedded server starts before timing
        run = measured(
            deployment, "run", "2031-w01", "--items", str(fresh_items(directory, "a", count))
        )
        print(
            f"offline, {count} items: digest run {run.wall:.1f} s "
            f"({run.wall / count * 1000:.2f} ms an item), peak {run.peak_mb:.0f} MB"
        )
        again = fresh_items(directory, "b", count)
        sent = round_trips(
            deployment.client(),
            lambda: measured(deployment, "run", "2031-w02", "--items", str(again)),
        )
        steps = len(deployment.view("2031-w02").steps)
        print(
            f"  round trips of the next week: {len(sent)} for {steps} steps "
            f"({len(sent) / count:.3f} an item, {len(sent) - steps} beyond the steps)"
        )
        fork = measured(deployment, "fork", "2031-w01", "--from", "compose", "--dry-run")
        print(
            f"  replay of the finished run in memory (fork --from compose --dry-run): "
            f"{fork.wall:.1f} s, peak {fork.peak_mb:.0f} MB"
        )
        show = measured(deployment, "show", "2031-w01")
        print(f"  digest show: {show.wall:.2f} s, {len(show.stdout.splitlines())} lines")
    finally:
        deployment.close()


def through_api(directory: Path, count: int, rate: float, latency: float, concurrency: int) -> None:
    """The week through the fake API at its request rate."""
    arrivals: list[float] = []
    with FakeAnthropic(
        delay=latency, log=lambda line: arrivals.append(time.perf_counter())
    ) as fake:
        fake.limit(requests=rate, per=1)
        deployment = Deployment(
            directory / "api",
            **fake.env(),
            DIGEST_LEASE_TTL="60",
            DIGEST_CONCURRENCY=str(concurrency),
        )
        try:
            deployment.client().ping()
            items = fresh_items(directory, "c", count)
            run = measured(deployment, "run", "2031-w03", "--items", str(items))
        finally:
            deployment.close()
        answered, refused = fake.answered(), fake.refused
    floor = answered / rate
    span = arrivals[-1] + latency - arrivals[0]
    print(
        f"through the API, {count} items, {rate:g} requests/s, {latency:g} s a call, "
        f"{concurrency} in flight: first request to last answer {span:.1f} s = "
        f"{span / floor:.2f}x the floor ({floor:.1f} s); wall {run.wall:.1f} s "
        f"({run.wall / floor:.2f}x); {answered} answered, {refused} refused; "
        f"peak {run.peak_mb:.0f} MB"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--items", type=int, default=5000)
    parser.add_argument("--rate", type=float, default=50.0, help="requests a second")
    parser.add_argument("--latency", type=float, default=0.1, help="seconds a call takes")
    parser.add_argument("--concurrency", type=int, default=16, help="calls in flight")
    parser.add_argument("--offline-only", action="store_true")
    args = parser.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(prefix="big-week-") as scratch:
        offline(Path(scratch), args.items)
        if not args.offline_only:
            through_api(Path(scratch), args.items, args.rate, args.latency, args.concurrency)


if __name__ == "__main__":
    main()
