"""How long a whole ``digest run`` takes when every model call takes a second.

    python -m bench.latency [--rounds 3]

Eight items, the fake Anthropic API (``tests/fakes/anthropic_server.py``) answering each call
after 1 s, ``DIGEST_CONCURRENCY=3``: the summaries take ceil(8/3) = 3 latencies and the opening
paragraph one more, so the floor is 4 s. Target: the command's wall time, process start to
exit, at most 4.6 s (the floor plus 15%). Each round runs a week no earlier round covered,
as a whole process in one throwaway state directory (its embedded Valkey started before
timing); the median and the spread are printed. The same runs are then enqueued to a warm
``celery -A tasks worker``, timed from ``send`` to the run's status reading done.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import median

from bench._common import digest, isolated_env, verdict
from journal.contrib.embedded import embedded_url, stop_embedded
from tests.fakes.anthropic_server import FakeAnthropic
from tests.support import WEEK, fresh_items

LATENCY = 1.0
CONCURRENCY = 3
SLACK = 1.15


@dataclass(frozen=True)
class Timings:
    """What the rounds measured, each a list of seconds, one per round."""

    walls: list[float]
    firsts: list[float]  # process start to the first model request's arrival
    imports: list[float]  # the SDK's import alone, timed between the rounds
    delivered: list[float]  # enqueued to a warm worker, to done

    def report(self, floor: float, target: float, calls: int) -> None:
        """Print the figures against the floor and the target, as docs/benchmarks.md quotes them."""
        walls, firsts, imports, delivered = self.walls, self.firsts, self.imports, self.delivered
        rounds, wall, first = len(walls), median(walls), median(firsts)
        print(
            f"digest run, {len(WEEK)} items, {LATENCY:.0f} s per model call, concurrency "
            f"{CONCURRENCY}: {wall:.2f} s median of {rounds} (min {min(walls):.2f}, max "
            f"{max(walls):.2f}), floor {floor:.1f} s; target {target:.1f} s: "
            f"{verdict(wall, target)} ({calls} model calls)"
        )
        print(
            f"  of which: process start to the first model request {first:.2f} s, "
            f"first request to exit {wall - first:.2f} s (the floor's part: {floor:.1f} s)"
        )
        print(
            f"  the Anthropic SDK's import alone, in a fresh interpreter: {median(imports):.2f} s "
            f"median (min {min(imports):.2f}, max {max(imports):.2f}); the target leaves "
            f"{target - floor:.2f} s for everything before the first call"
        )
        print(
            f"enqueued to a warm worker (the SDK imported before it forked): "
            f"{median(delivered):.2f} s median of {rounds}, enqueue to done (min "
            f"{min(delivered):.2f}, max {max(delivered):.2f}); target {target:.1f} s: "
            f"{verdict(median(delivered), target)}"
        )


def sdk_import_time() -> float:
    """What importing the Anthropic SDK alone costs a fresh interpreter, in seconds.

    Timed as two whole processes, ``import anthropic`` against an empty one, so the
    interpreter's own start-up cancels out; the first model call of a ``digest run`` cannot
    start before it.
    """

    def wall(code: str) -> float:
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        return time.perf_counter() - started

    return wall("import anthropic") - wall("pass")


def through_cli(
    fake: FakeAnthropic, arrivals: list[float], here: Path, rounds: int
) -> tuple[list[float], list[float], list[float]]:
    """Each round's ``digest run`` as a whole process, on a server started before timing.

    Returns, in seconds, a list each: the wall times, process start to the first model
    request's arrival (``arrivals``, which the fake API appends to), and the SDK's import
    alone, timed between the rounds.
    """
    state = here / ".digest"
    env = isolated_env(state, **fake.env(), DIGEST_CONCURRENCY=str(CONCURRENCY))
    walls: list[float] = []
    firsts: list[float] = []
    imports: list[float] = []
    try:
        embedded_url(state)  # started before timing, as a deployment's server is
        for round_ in range(rounds):
            fresh = env | {"DIGEST_ITEMS": str(fresh_items(here, f"r{round_}"))}
            arrivals.clear()
            started = time.perf_counter()
            digest(fresh, here, "run", f"2027-w{round_ + 1:02d}")
            walls.append(time.perf_counter() - started)
            firsts.append(arrivals[0] - started)
            imports.append(sdk_import_time())
    finally:
        stop_embedded(state)
    return walls, firsts, imports


def through_worker(fake: FakeAnthropic, directory: Path, rounds: int) -> list[float]:
    """Enqueue to done, in seconds, of runs delivered to a warm ``celery -A tasks worker``.

    The worker imports the SDK before its pool forks, as a deployment's does; one run first
    warms the pool's child (its store connection and client), untimed.
    """
    from journal.ops.views import inspect_run
    from tests.support import Deployment, wait_until

    deployment = Deployment(
        directory / "worker-state", **fake.env(), DIGEST_CONCURRENCY="3", DIGEST_LEASE_TTL="30"
    )
    os.environ.update(deployment.env)  # this process enqueues and reads as the CLI would
    from tasks import digest
    from tasks.job.workflow import DigestOptions

    try:
        deployment.worker("latency", concurrency=1)
        journal = deployment.runtime().journal
        walls: list[float] = []
        for round_ in range(rounds + 1):
            week = f"2028-w{round_ + 1:02d}"
            items = str(fresh_items(directory, f"w{round_}"))
            started = time.perf_counter()
            digest.start(week, DigestOptions(items=items))

            def done(week: str = week) -> bool:
                return inspect_run(journal, "digest", week).status == "done"

            wait_until(done, 60, f"{week} to be done", every=0.01)
            if round_:
                walls.append(time.perf_counter() - started)
        return walls
    finally:
        deployment.close()


def main(argv: list[str] | None = None) -> None:
    """Start the fake API, time the rounds through the CLI, then through a worker; print."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3)
    rounds = parser.parse_args(argv).rounds
    floor = (math.ceil(len(WEEK) / CONCURRENCY) + 1) * LATENCY
    arrivals: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="latency-bench-") as scratch,
        FakeAnthropic(delay=LATENCY, log=lambda line: arrivals.append(time.perf_counter())) as fake,
    ):
        walls, firsts, imports = through_cli(fake, arrivals, Path(scratch), rounds)
        calls = fake.calls
        delivered = through_worker(fake, Path(scratch), rounds)
    Timings(walls, firsts, imports, delivered).report(floor, floor * SLACK, calls)


if __name__ == "__main__":
    main()
