"""What the same week costs synchronously and by Message Batches, and how long each takes.

    python -m bench.cost [--processing 10] [--latency 1]

Eight items (the shipped week), the fake Anthropic API (``tests/fakes/anthropic_server.py``)
answering each synchronous call after ``--latency`` seconds and processing each batch over
``--processing`` seconds. The week runs twice in one throwaway state directory (its embedded
Valkey started before timing), under ids no other run used so both select it whole: once as
``digest run`` (eight summaries three at a time, then the opening), once as ``digest run
--batch`` run again at each look, as an operator would (first look after 1 s, then every
2 s: ``DIGEST_BATCH_FIRST_LOOK``, ``DIGEST_BATCH_MAX_LOOK``). Each run's cost is the sum of its
journaled costs at the published prices (the default price table), cache writes and reads
priced; the target is batch / synchronous at most 0.55. The wall time of each is printed
against its floor: the latencies of the synchronous run, the two batches' processing times
of the batch run (the summaries, then the opening).
"""

from __future__ import annotations

import argparse
import math
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from bench._common import isolated_env, verdict
from journal import Journal
from journal.contrib.embedded import embedded_url, stop_embedded
from journal.ops.views import inspect_run
from tasks.llm.cost import Usage, usage_of
from tests.fakes.anthropic_server import FakeAnthropic
from tests.support import BIN, WEEK, fresh_items

CONCURRENCY = 3
TARGET = 0.55


def journal_in(here: Path) -> Journal:
    """The journal of the state directory's embedded server, read from outside the runs."""
    return Journal(redis.Redis.from_url(embedded_url(here / ".digest")))


def run(env: dict[str, str], here: Path, week: str, *first: str) -> tuple[float, int]:
    """``digest run`` until the week is sent, again at each look; wall seconds, invocations."""
    journal = journal_in(here)
    started = time.perf_counter()
    args = ["run", *first, week]
    for invocation in range(1, 200):
        done = subprocess.run(
            [str(BIN / "digest"), *args], env=env, cwd=here, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise SystemExit(f"digest run {week} failed: {done.stderr.strip()}")
        last = done.stdout.splitlines()[-1]
        if not last.startswith("waiting: batch"):
            return time.perf_counter() - started, invocation
        wait = inspect_run(journal, "digest", week).wait
        assert wait is not None and wait.until is not None
        time.sleep(max(0.0, wait.until - time.time()))
        args = ["run", week]
    raise SystemExit(f"digest run {week} never ended")


def usage(here: Path, week: str) -> Usage:
    """What the week's journal says it cost: the sum of its journaled costs."""
    view = inspect_run(journal_in(here), "digest", week)
    return usage_of(record.result for record in view.steps)


def main(argv: list[str] | None = None) -> None:
    """Start the fake API and the server, run the week both ways, print the lines."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--processing", type=float, default=10.0, help="seconds per batch")
    parser.add_argument("--latency", type=float, default=1.0, help="seconds per call")
    options = parser.parse_args(argv)
    items = len(WEEK)
    with (
        tempfile.TemporaryDirectory(prefix="cost-bench-") as scratch,
        FakeAnthropic(delay=options.latency) as fake,
    ):
        fake.batch_processing_time = options.processing
        here = Path(scratch)
        state = here / ".digest"
        env = isolated_env(
            state,
            **fake.env(),
            DIGEST_CONCURRENCY=str(CONCURRENCY),
            DIGEST_BATCH_FIRST_LOOK="1",
            DIGEST_BATCH_MAX_LOOK="2",
        )
        try:
            embedded_url(state)  # started before timing, as a deployment's server is
            sync_env = env | {"DIGEST_ITEMS": str(fresh_items(here, "sync"))}
            sync_wall, _ = run(sync_env, here, "2029-w01")
            calls = fake.calls
            fake.forget_cache()  # as if the two runs were a week apart
            batch_env = env | {"DIGEST_ITEMS": str(fresh_items(here, "batch"))}
            batch_wall, invocations = run(batch_env, here, "2029-w02", "--batch")
            sync, batch = usage(here, "2029-w01"), usage(here, "2029-w02")
        finally:
            stop_embedded(state)
        batches = [len(b.requests) for b in fake.batches]
    ratio = batch.cost_usd / sync.cost_usd
    print(
        f"the same week, {items} items, at the published prices: synchronous "
        f"${sync.cost_usd:.6f} ({sync.calls} model calls, {sync.input_tokens} input + "
        f"{sync.output_tokens} output tokens, cache hit ratio {sync.cache_hit_ratio:.2f}); "
        f"by batch ${batch.cost_usd:.6f} ({batch.batched} batch requests in "
        f"{len(batches)} batches of {' and '.join(map(str, batches))}, {batch.input_tokens} + "
        f"{batch.output_tokens} tokens, cache hit ratio {batch.cache_hit_ratio:.2f}, "
        f"{batch.calls - batch.batched} synchronous calls)"
    )
    print(f"batch / synchronous: {ratio:.3f}x; target at most {TARGET}x: {verdict(ratio, TARGET)}")
    sync_floor = (math.ceil(items / CONCURRENCY) + 1) * options.latency
    batch_floor = 2 * options.processing
    print(
        f"wall time: synchronous {sync_wall:.1f} s ({calls} calls of {options.latency:g} s, "
        f"concurrency {CONCURRENCY}: floor {sync_floor:.0f} s); by batch {batch_wall:.1f} s "
        f"(two batches of {options.processing:g} s each: floor {batch_floor:.0f} s; "
        f"{invocations} invocations of digest run, one per look)"
    )


if __name__ == "__main__":
    main()
