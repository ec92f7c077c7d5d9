"""``python -m tests.chaos --seed N --duration S``: one fault campaign, judged by the checker.

Prints the seed first (so any failure can be replayed); every fault and action is written to
``.chaos/seed-N/timeline.jsonl`` as it happens. Exit 0 with a summary when the promise held;
exit 1 with the seed, each violation, its evidence and the timeline around it when not; exit
3 when the campaign itself could not run (no verdict).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

from tests.chaos.campaign import Campaign, Timeline
from tests.chaos.checker import Observation, Violation
from tests.chaos.plan import FOCUS, Power
from tests.support import ROOT

# The exit status of a campaign that could not run: distinct from 1, a violation found.
CAMPAIGN_BROKE = 3
# The faults aimed at batch runs (their kill or crash is logged when it falls).
BATCH_FAULTS = frozenset({"batch-create-kill", "batch-results-kill", "batch-deadline-kill"})
# Kinds of timeline entry that are the campaign's own doings, not faults or operators.
NOT_FAULTS = frozenset(
    {
        "week",
        "dispatched",
        "worker-start",
        "beat-start",
        "valkey-start",
        "quiet",
        "settled",
        "operator-done",
        "skipped",
        "campaign-error",
        "settle-timeout",
    }
)


def main(argv: list[str] | None = None) -> int:
    """Run one campaign; the exit status says whether the promise held."""
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--seed", type=int, default=None, help="default: a random one, printed")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of faults")
    parser.add_argument("--out", type=Path, default=ROOT / ".chaos", help="default: .chaos/")
    parser.add_argument(
        "--focus",
        choices=sorted(FOCUS),
        help="aim the faults at one kind of bug (tests/chaos/plan.py FOCUS) instead of all",
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting of the deployment under test (your own: DIGEST_SMTP_TIMEOUT=10 ...)",
    )
    args = parser.parse_args(argv)
    stop_cleanly_on_signals()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 10**6)
    replay = f"make chaos SEED={seed} DURATION={args.duration:g}"
    if args.focus or args.env:
        replay = f"python -m tests.chaos {' '.join(sys.argv[1:] if argv is None else argv)}"
        replay += "" if args.seed is not None else f" --seed {seed}"
    print(f"chaos: seed {seed} (replay: {replay})")
    sys.stdout.flush()
    env = dict(pair.split("=", 1) for pair in args.env)
    power = FOCUS[args.focus] if args.focus else None
    try:
        return run_seed(seed, args.duration, args.out, power=power, env=env)
    except Exception:
        # The campaign itself broke (a process that would not start...): not a verdict.
        traceback.print_exc()
        print(f"chaos: seed {seed}: the campaign could not run (exit {CAMPAIGN_BROKE})")
        return CAMPAIGN_BROKE


def stop_cleanly_on_signals() -> None:
    """SIGINT and SIGTERM end the campaign through its ``finally``: every process killed.

    Set explicitly: a campaign started in the background by a shell ignores SIGINT, and
    SIGTERM's default ends the interpreter without running any ``finally``.
    """

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)


def run_seed(
    seed: int,
    duration: float,
    out: Path,
    *,
    power: Power | None = None,
    env: dict[str, str] | None = None,
    quiet: bool = False,
) -> int:
    """One campaign in ``out/seed-N``; prints its verdict; 0 kept, 1 violated."""
    directory = out / f"seed-{seed}"
    campaign = Campaign(seed, duration, directory, power=power, env=env)
    started = time.monotonic()
    observation, violations = campaign.run()
    took = time.monotonic() - started
    assert campaign.timeline is not None
    (directory / "violations.json").write_text(
        json.dumps([v.__dict__ for v in violations], indent=1, default=str)
    )
    if violations:
        print(violation_report(seed, violations, campaign.timeline, directory))
    elif not quiet:
        print(summary(seed, observation, campaign.timeline, took))
    return 1 if violations else 0


def summary(seed: int, observation: Observation, timeline: Timeline, took: float) -> str:
    """The verdict of a campaign that kept the promise."""
    kinds = Counter(
        name for name in (fault_name(entry) for entry in timeline.entries) if name is not None
    )
    refused = sum(1 for e in timeline.entries if e["kind"] == "operator-done" and e["exit"])
    skipped = Counter(e["fault"] for e in timeline.entries if e["kind"] == "skipped")
    statuses = Counter(run.status or "new" for run in observation.runs.values())
    lines = [
        f"chaos: seed {seed}: the promise held ({took:.0f} s)",
        "  faults and actions: "
        + ", ".join(f"{kind} {count}" for kind, count in sorted(kinds.items())),
        f"  operator commands refused (exit 2, expected): {refused}",
        f"  runs: {len(observation.runs)} ("
        + ", ".join(f"{status} {n}" for status, n in sorted(statuses.items()))
        + f"), weeks reached: {len(observation.weeks)}",
        f"  emails: {len(observation.emails)}, items: {len(observation.items)}, "
        f"paid model calls: {len(observation.calls)}",
        "  violations: 0",
    ]
    if skipped:
        lines.insert(3, "  skipped: " + ", ".join(f"{k} {n}" for k, n in sorted(skipped.items())))
    fired = batch_faults_fired(timeline.entries)
    if any(scheduled for scheduled, _ in fired.values()):
        lines.insert(
            3,
            "  batch faults fired/scheduled: "
            + ", ".join(f"{kind} {n}/{of}" for kind, (of, n) in sorted(fired.items())),
        )
    return "\n".join(lines)


def batch_faults_fired(entries: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """Each batch fault: how often it was scheduled, and how often its kill or crash fell.

    A fault fires only where a batch run is where it aims (a creation, a result, a fallback
    past the deadline); otherwise it lapses and says so in the timeline.
    """
    scheduled = Counter(e["kind"] for e in entries if e["kind"] in BATCH_FAULTS)
    bursts = {
        (e.get("why"), e.get("burst"))
        for e in entries
        if e["kind"] == "kill-child" and "burst" in e
    }
    fired = Counter(why for why, _ in bursts)
    fired["batch-results-kill"] = sum(1 for e in entries if e["kind"] == "batch-results-crash")
    return {kind: (scheduled[kind], fired[kind]) for kind in sorted(BATCH_FAULTS)}


def fault_name(entry: dict[str, Any]) -> str | None:
    """What a timeline entry counts as in the summary; None for the workload's own doings."""
    kind = entry["kind"]
    if kind == "operator":
        return f"operator {entry['verb']}"
    if kind == "dispatcher":
        if entry.get("fault"):
            return f"dispatcher {entry['fault']}"
        return "second dispatcher" if entry.get("second") else None
    return None if kind in NOT_FAULTS else str(kind)


def violation_report(
    seed: int, violations: list[Violation], timeline: Timeline, directory: Path
) -> str:
    """Each violation with its evidence and the timeline around it; the seed to replay."""
    lines = [f"chaos: seed {seed}: {len(violations)} violations of the promise"]
    for violation in violations:
        lines.append(f"- [{violation.rule}] {violation.message}")
        lines.append("  evidence: " + _short(violation.evidence))
        if violation.at is not None:
            lines.append("  timeline around it:")
            lines += [f"    {_short(entry, 240)}" for entry in timeline.around(violation.at)]
    lines.append(f"replay: the seed's line above; files: {os.path.relpath(directory)}")
    return "\n".join(lines)


def _short(value: Any, limit: int = 2000) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit] + " ..."


if __name__ == "__main__":
    sys.exit(main())
