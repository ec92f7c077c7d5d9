"""``make chaos-ci``: the regression seeds, then a few planted bugs that must be caught.

Bounded: the seeds of ``tests/chaos/seeds.txt`` at their own short durations, then
``CI_BUGS`` against one seed each at ``CI_BUG_DURATION`` seconds, under 8 minutes on a
2-core machine. Deterministic in what it checks: a violation on a regression seed is a bug
(exit 1), never a flake to retry; a planted bug the campaign misses fails it too, since the
campaign has lost the power it had.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tests.chaos import planted
from tests.chaos.__main__ import run_seed
from tests.support import ROOT

SEEDS = Path(__file__).with_name("seeds.txt")
# Bugs the campaign catches under their seed whatever the machine's timing (see the report
# in docs/development.md), each against one seed, short.
CI_BUGS = "f,g"
CI_BUG_SEED = "1"
CI_BUG_DURATION = 45.0


def regression_seeds(path: Path = SEEDS) -> list[tuple[int, float]]:
    """``(seed, duration)`` of each line of the seeds file; comments and blanks skipped."""
    seeds = []
    for line in path.read_text().splitlines():
        fields = line.split("#", 1)[0].split()
        if fields:
            seeds.append((int(fields[0]), float(fields[1])))
    return seeds


def main() -> int:
    """Every regression seed, then the planted bugs; 0 only when all kept their promise."""
    started = time.monotonic()
    failed = []
    for seed, duration in regression_seeds():
        print(f"chaos-ci: seed {seed}, {duration:g} s", flush=True)
        if run_seed(seed, duration, ROOT / ".chaos" / "ci") != 0:
            failed.append(f"seed {seed}")
    print(f"chaos-ci: planted bugs {CI_BUGS}, seed {CI_BUG_SEED}", flush=True)
    args = ["--seeds", CI_BUG_SEED, "--duration", str(CI_BUG_DURATION), "--bugs", CI_BUGS]
    if planted.main([*args, "--min-rate", "1"]) != 0:
        failed.append("planted bugs")
    took = time.monotonic() - started
    verdict = "failed: " + ", ".join(failed) if failed else "passed"
    print(f"chaos-ci: {verdict} in {took:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
