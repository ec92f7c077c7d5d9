"""A million timers: the due index with 1,000,000 runs pending, swept by two racing sweepers.

    python -m bench.timers [--pending 1000000] [--due 100000] [--batch 100]

One throwaway Valkey, configured as the embedded server is (``appendfsync always``). Printed:

- memory per pending timer: ``used_memory`` before and after the pending entries are added,
  per entry (an entry of the due index: a waiting run's wake-up time);
- the claim rate: ``--due`` runs made due, then two sweeper processes racing
  ``Journal.claim_due(--batch)`` until none is left, together, in claims per second
  (target: at least 10,000/s), with every claim checked: no run claimed twice, none missed;
- a sweep costs O(due), not O(pending): one ``claim_due`` that finds 10 due runs, timed with
  the million pending and with a thousand pending, in turns (target ratio: at most 1.5).
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path
from statistics import median

import redis

from journal import Journal, Keyspace, ManualClock
from journal._clock import millis
from journal._redis.scripts import Client
from journal.contrib.embedded import embedded_url, stop_embedded

NOW = 1_800_000_000.0
PREFIX = "timers"
SPARSE = "sparse"  # a due index of a thousand, swept side by side with the million
FEW = 10
CLAIM_TARGET = 10_000
SWEEP_TARGET = 1.5


def member(i: int) -> str:
    """The full run id of timer ``i``, as the due index holds it."""
    return f"bench:t{i:07d}"


def add_timers(client: Client, due: str, start: int, count: int, at_ms: int) -> None:
    """``count`` runs in the due index, all at ``at_ms``, in batches of 10,000."""
    for first in range(start, start + count, 10_000):
        batch = {member(i): at_ms for i in range(first, min(first + 10_000, start + count))}
        client.zadd(due, batch)


def journal(url: str, prefix: str = PREFIX) -> Journal:
    """A sweeper's journal: its own connection, the bench's clock."""
    return Journal(redis.Redis.from_url(url), keyspace=Keyspace(prefix), clock=ManualClock(NOW))


def sweeper(url: str, batch: int, start: multiprocessing.synchronize.Barrier, out: str) -> None:
    """Claim until nothing is due; write every claimed run id, one a line, to ``out``."""
    sweeps = journal(url)
    claimed: list[str] = []
    start.wait()
    while True:
        runs = sweeps.claim_due(batch)
        if not runs:
            break
        claimed += [keys.run for keys in runs]
    Path(out).write_text("\n".join(claimed))


def race(url: str, due: int, batch: int, directory: Path) -> tuple[float, Counter[str], list[int]]:
    """Two sweeper processes claim ``due`` runs: claims/s, how often each run, each's share."""
    context = multiprocessing.get_context("fork")
    start = context.Barrier(3)
    outs = [str(directory / f"sweeper-{n}.txt") for n in range(2)]
    procs = [context.Process(target=sweeper, args=(url, batch, start, out)) for out in outs]
    for proc in procs:
        proc.start()
    start.wait()
    began = time.perf_counter()
    for proc in procs:
        proc.join()
    elapsed = time.perf_counter() - began
    counts: Counter[str] = Counter()
    shares = []
    for out in outs:
        lines = [line for line in Path(out).read_text().splitlines() if line]
        counts.update(lines)
        shares.append(len(lines))
    return due / elapsed, counts, shares


def sweep_costs(url: str, crowded: str, sparse: str, at_ms: int, reps: int) -> list[float]:
    """Median microseconds of one ``claim_due`` finding ``FEW`` due runs, per keyspace.

    The keyspaces take turns, so both see the same server, load and disk.
    """
    sweeps = [journal(url, prefix) for prefix in (crowded, sparse)]
    samples: list[list[float]] = [[], []]
    for rep in range(reps):
        for sweep, times in zip(sweeps, samples, strict=True):
            add_timers(
                sweep.client, sweep.keyspace.indexes()[0].due, 9_000_000 + rep * FEW, FEW, at_ms
            )
            started = time.perf_counter_ns()
            claimed = sweep.claim_due(100)
            times.append((time.perf_counter_ns() - started) / 1000)
            assert len(claimed) == FEW
    return [median(times) for times in samples]


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments, start the server, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--pending", type=int, default=1_000_000)
    parser.add_argument("--due", type=int, default=100_000, help="runs made due for the race")
    parser.add_argument("--batch", type=int, default=100, help="runs per claim (the sweep's)")
    args = parser.parse_args(argv)
    state = Path(tempfile.mkdtemp(prefix="timers-bench-"))
    began = time.monotonic()
    try:
        url = embedded_url(state)
        client = redis.Redis.from_url(url)
        due_key = Keyspace(PREFIX).indexes()[0].due
        later, past = millis(NOW + 86_400), millis(NOW - 1)

        before = int(client.info("memory")["used_memory"])
        add_timers(client, due_key, 0, args.pending, later)
        per_timer = (int(client.info("memory")["used_memory"]) - before) / args.pending
        print(f"{args.pending:,} timers pending: {per_timer:.0f} bytes each (due index entry)")

        add_timers(client, Keyspace(SPARSE).indexes()[0].due, 0, 1_000, later)
        crowded, sparse = sweep_costs(url, PREFIX, SPARSE, past, 300)
        ratio = crowded / sparse
        verdict = "PASS" if ratio <= SWEEP_TARGET else "FAIL"
        print(
            f"a sweep finding {FEW} due: {crowded:.0f} us with {args.pending:,} pending, "
            f"{sparse:.0f} us with 1,000: x{ratio:.2f}  (target <= {SWEEP_TARGET}: {verdict})"
        )

        add_timers(client, due_key, args.pending, args.due, past)
        rate, counts, shares = race(url, args.due, args.batch, state)
        twice = sum(1 for n in counts.values() if n > 1)
        missed = args.due - len(counts)
        verdict = "PASS" if rate >= CLAIM_TARGET and not twice and not missed else "FAIL"
        print(
            f"two sweepers, {args.due:,} due among {args.pending:,} pending, {args.batch} per "
            f"claim: {rate:,.0f} claims/s together ({shares[0]:,} + {shares[1]:,}), "
            f"{twice} claimed twice, {missed} missed  "
            f"(target >= {CLAIM_TARGET:,}/s, none twice: {verdict})"
        )
        client.close()
    finally:
        stop_embedded(state)
        shutil.rmtree(state, ignore_errors=True)
    print(f"\n{time.monotonic() - began:.1f}s")


if __name__ == "__main__":
    main()
