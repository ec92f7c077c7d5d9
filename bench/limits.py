"""Digests against a model API that enforces rate limits: how close to the limit's pace, how
many requests refused.

    python -m bench.limits [--rounds 3]

The fake Anthropic API (``tests/fakes/anthropic_server.py``) enforces its limits per model as
the real one does (token buckets, ``anthropic-ratelimit-*`` headers, 429 with ``retry-after``)
and answers each call after 0.25 s. Three cases, each run ``--rounds`` times:

1. one week of 40 items, ``digest run``, 4 requests a second with a burst of 4;
2. three weeks of 20 different items each, enqueued at once to two workers (two processes
   each) sharing the same 4 requests a second;
3. one week of 40 items, ``digest run``, with an input-tokens limit that binds before the
   request limit (4 requests a second, but tokens for fewer).

The floor is what the limit allows: the calls answered over the request rate (cases 1, 2), or
the summary model's input tokens answered over the token rate, plus the opening's latency
(case 3: each model has buckets of its own). Wall time runs from the command's
start (case 1, 3, the SDK's import included) or the enqueue (case 2) to the end; the span
runs from the first request's arrival at the API to the last answer. The limit sets the span;
the wall adds the process's start-up, which on a loaded machine is seconds (the SDK's import
alone), so the ratio judged is the span's, and the wall's is printed beside it. Targets: at
most 1.1x the floor, at most 2% of requests refused.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from statistics import median

from tests.fakes.anthropic_server import FakeAnthropic, prompt_tokens
from tests.support import Deployment, fresh_items, wait_until

LATENCY = 0.25
RATE = 4.0  # requests a second, burst 4
TOKEN_RATE = 120.0  # input tokens a second in case 3 (a burst of as many)
RATIO_TARGET = 1.1
REFUSED_TARGET = 0.02


@dataclass(frozen=True)
class Round:
    """One round's figures."""

    wall: float
    floor: float
    answered: int
    refused: int
    span: float  # first request's arrival to the last one's answer

    @property
    def ratio(self) -> float:
        """The span over the floor: what the limiter is judged on."""
        return self.span / self.floor

    @property
    def refused_share(self) -> float:
        return self.refused / max(1, self.answered + self.refused)


def token_floor(fake: FakeAnthropic) -> float:
    """The input-token floor: each model's answered input tokens over the token rate (each
    model has buckets of its own), the slowest model's, plus the last call's latency.

    Counted as the fake counts them: the prompt's words.
    """
    per_model: dict[str, int] = {}
    for request in fake.requests:
        if request.status == 200:
            per_model[request.model] = per_model.get(request.model, 0) + prompt_tokens(request.body)
    return max(per_model.values()) / TOKEN_RATE + LATENCY


def one_week(directory: Path, tag: str, *, tokens: bool) -> Round:
    """Cases 1 and 3: ``digest run`` of 40 items, timed as a whole process."""
    arrivals: list[float] = []
    with FakeAnthropic(
        delay=LATENCY, log=lambda line: arrivals.append(time.perf_counter())
    ) as fake:
        fake.limit(requests=RATE, input_tokens=TOKEN_RATE if tokens else None, per=1)
        deployment = Deployment(directory / tag, **fake.env(), DIGEST_LEASE_TTL="30")
        try:
            deployment.client().ping()  # the embedded server starts before timing
            items = fresh_items(directory, tag, 40)
            started = time.perf_counter()
            done = deployment.cli("run", "2029-w01", env={"DIGEST_ITEMS": str(items)})
            wall = time.perf_counter() - started
            if done.returncode != 0:
                raise SystemExit(f"digest run failed: {done.stderr}")
        finally:
            deployment.close()
        floor = token_floor(fake) if tokens else fake.answered() / RATE
        span = arrivals[-1] + LATENCY - arrivals[0]
        return Round(wall, floor, fake.answered(), fake.refused, span)


def three_weeks(directory: Path, rounds: int) -> list[Round]:
    """Case 2: three weeks enqueued at once to two workers, timed enqueue to all done.

    One deployment and one fake API for every round (this process's Celery app stays bound to
    the first store it met); before each round the fake's buckets start full again and the
    limiter's learned state is deleted, so each round starts cold.
    """
    arrivals: list[float] = []
    with FakeAnthropic(
        delay=LATENCY, log=lambda line: arrivals.append(time.perf_counter())
    ) as fake:
        deployment = Deployment(directory / "c2", **fake.env(), DIGEST_LEASE_TTL="30")
        saved = dict(os.environ)
        os.environ.update(deployment.env)  # this process enqueues as the CLI would
        try:
            from journal.ops.views import inspect_run
            from tasks import digest
            from tasks.job.workflow import DigestOptions

            deployment.worker("c2-a", concurrency=2)
            deployment.worker("c2-b", concurrency=2)
            journal = deployment.runtime().journal
            client = deployment.client()
            results: list[Round] = []
            for round_ in range(rounds):
                fake.limit(requests=RATE, per=1)
                learned = client.keys(f"{deployment.env['DIGEST_KEY_PREFIX']}:{{model-api:*")
                if learned:
                    client.delete(*learned)
                answered, refused, first = fake.answered(), fake.refused, len(arrivals)
                weeks = [f"20{30 + round_}-w{n:02d}" for n in (1, 2, 3)]
                tag = f"c2r{round_}"
                files = [str(fresh_items(directory, f"{tag}-{n}", 20)) for n in range(3)]
                started = time.perf_counter()
                for week, items in zip(weeks, files, strict=True):
                    digest.start(week, DigestOptions(items=items))

                def all_done(weeks: list[str] = weeks) -> bool:
                    return all(inspect_run(journal, "digest", w).status == "done" for w in weeks)

                wait_until(all_done, 180, "three weeks to be done", every=0.02)
                wall = time.perf_counter() - started
                span = arrivals[-1] + LATENCY - arrivals[first]
                done = fake.answered() - answered
                results.append(Round(wall, done / RATE, done, fake.refused - refused, span))
        finally:
            deployment.close()
            os.environ.clear()
            os.environ.update(saved)
        return results


def report(name: str, rounds: list[Round]) -> None:
    for n, r in enumerate(rounds, 1):
        print(
            f"  round {n}: first request to last answer {r.span:.2f} s, floor {r.floor:.2f} s, "
            f"{r.ratio:.2f}x; wall {r.wall:.2f} s ({r.wall / r.floor:.2f}x), "
            f"{r.answered} answered, {r.refused} refused ({r.refused_share:.1%})"
        )
    ratio = median(r.ratio for r in rounds)
    share = max(r.refused_share for r in rounds)
    verdict = "met" if ratio <= RATIO_TARGET and share <= REFUSED_TARGET else "MISSED"
    print(
        f"{name}: median {median(r.span for r in rounds):.2f} s = {ratio:.2f}x the floor, "
        f"at most {share:.1%} refused; targets {RATIO_TARGET}x and {REFUSED_TARGET:.0%}: {verdict}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--case", choices=["1", "2", "3"], action="append")
    args = parser.parse_args(argv)

    def weeks(tokens: bool) -> Callable[[Path, int], list[Round]]:
        def run(directory: Path, rounds: int) -> list[Round]:
            tag = f"c{3 if tokens else 1}r"
            return [one_week(directory, f"{tag}{n}", tokens=tokens) for n in range(rounds)]

        return run

    cases: dict[str, tuple[str, Callable[[Path, int], list[Round]]]] = {
        "1": ("one week, 40 items, 4 requests/s", weeks(False)),
        "2": ("three weeks of 20 items, two workers, 4 requests/s", three_weeks),
        "3": (
            f"one week, 40 items, {TOKEN_RATE:.0f} input tokens/s binding before 4 requests/s",
            weeks(True),
        ),
    }
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(prefix="limits-bench-") as scratch:
        for case in args.case or sorted(cases):
            name, run = cases[case]
            report(name, run(Path(scratch), args.rounds))


if __name__ == "__main__":
    main()
