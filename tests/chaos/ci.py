"""``make chaos-ci``: the regression seeds, then a few planted bugs that must be caught.

Bounded: the seeds of ``tests/chaos/seeds.txt`` at their own short durations, then each of
``CI_BUGS`` planted and run under its focus on one seed for ``CI_BUG_DURATION`` seconds,
under 8 minutes on a 2-core machine. Deterministic in what it checks: a violation on a
regression seed is a bug (exit 1), never a flake to retry; a planted bug the campaign misses
fails it too, since the campaign has lost the power it had.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tests.chaos import planted
from tests.chaos.__main__ import run_seed, stop_cleanly_on_signals
from tests.chaos.plan import FOCUS
from tests.support import ROOT

SEEDS = Path(__file__).with_name("seeds.txt")
# Planted bugs, each under the focus that catches it whatever the machine's timing, on one seed.
CI_BUGS = (
    ("b", "dispatch"),
    ("c", "cancel-send"),
    ("f", "ambiguous-send"),
    ("g", "failed-ambiguous"),
)
CI_BUG_SEED = "1"
CI_BUG_DURATION = 45.0


def regression_seeds(path: Path = SEEDS) -> list[tuple[int, float, str | None]]:
    """``(seed, duration, focus)`` of each line of the seeds file; comments, blanks skipped."""
    seeds = []
    for line in path.read_text().splitlines():
        fields = line.split("#", 1)[0].split()
        if fields:
            focus = fields[2] if len(fields) > 2 else None
            seeds.append((int(fields[0]), float(fields[1]), focus))
    return seeds


def main() -> int:
    """Every regression seed, then the planted bugs; 0 only when all kept their promise."""
    stop_cleanly_on_signals()
    started = time.monotonic()
    failed = []
    for seed, duration, focus in regression_seeds():
        aimed = f", focus {focus}" if focus else ""
        print(f"chaos-ci: seed {seed}, {duration:g} s{aimed}", flush=True)
        out = ROOT / ".chaos" / "ci" / (focus or "default")
        if run_seed(seed, duration, out, power=FOCUS[focus] if focus else None) != 0:
            failed.append(f"seed {seed}{aimed}")
    for bug, focus in CI_BUGS:
        print(f"chaos-ci: planted bug {bug}, seed {CI_BUG_SEED}, focus {focus}", flush=True)
        args = ["--seeds", CI_BUG_SEED, "--duration", str(CI_BUG_DURATION), "--bugs", bug]
        if planted.main([*args, "--focus", focus, "--min-rate", "1"]) != 0:
            failed.append(f"planted bug {bug}")
    took = time.monotonic() - started
    verdict = "failed: " + ", ".join(failed) if failed else "passed"
    print(f"chaos-ci: {verdict} in {took:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
