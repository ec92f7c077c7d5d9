"""How long the console's runs page takes over 10,000 runs: the first page, then every later
page by its cursor, to the end of the index.

    python -m bench.console_runs [--runs 10000] [--limit 50]

An embedded Valkey of its own; the runs are written as a listing reads them (index and meta),
then the page is asked for through the console's own Flask app, as a browser would.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import redis

from journal.contrib.embedded import embedded_url, stop_embedded
from tasks.ops.console import Names, create_app
from tests.tasks.ops.console_states import many_runs, runtime_for


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--limit", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as state:
        url = embedded_url(state)
        try:
            return measure(redis.Redis.from_url(url), Path(state), args.runs, args.limit)
        finally:
            stop_embedded(state)


def measure(client: redis.Redis, state: Path, runs: int, limit: int) -> int:
    """Page through every run; print the median, 95th percentile and worst page."""
    runtime = runtime_for(client, "bench", state)
    many_runs(runtime.journal, runs, int(time.time() * 1000))
    browser = create_app(runtime, Names.bound("127.0.0.1", 80)).test_client()
    url, took, seen = f"/?limit={limit}", [], 0
    while url:
        started = time.perf_counter()
        page = browser.get(url).get_data(as_text=True)
        took.append((time.perf_counter() - started) * 1000)
        seen += len(re.findall(r'href="/runs/', page))
        older = re.search(r'id="older" href="([^"]+)"', page)
        url = older.group(1).replace("&amp;", "&") if older else ""
    took.sort()
    p95 = took[int(len(took) * 0.95) - 1]
    print(
        f"{runs} runs, {len(took)} pages of {limit}: {seen} rows; median "
        f"{statistics.median(took):.1f} ms, p95 {p95:.1f} ms, worst {took[-1]:.1f} ms"
    )
    return 0 if seen == runs else 1


if __name__ == "__main__":
    sys.exit(main())
