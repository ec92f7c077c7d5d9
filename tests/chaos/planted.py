"""Planted bugs: does the campaign catch each one? ``python -m tests.chaos.planted``.

Each bug is one or more text substitutions, applied to a scratch copy of the project (as
``tests.mutants`` does), and the campaign runs against that copy for each seed: a bug is
caught by a seed when the campaign exits 1 (a violation). A pattern that no longer occurs
exactly once in today's source fails the whole run before any campaign starts, so the set
cannot go stale silently: update the pattern with the code.

    python -m tests.chaos.planted [--seeds 1,2,3] [--duration S] [--bugs a,f,g] [--focus F]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.chaos.__main__ import stop_cleanly_on_signals
from tests.mutants import scratch_copy
from tests.support import ROOT


@dataclass(frozen=True)
class Bug:
    """One planted bug: ``(path, find, replace)`` substitutions, each found exactly once."""

    letter: str
    name: str
    changes: tuple[tuple[str, str, str], ...]


BUGS = (
    Bug(
        "a",
        # Its last-moment check still stops a sender frozen past its claim: what the missing
        # confirmation breaks is a send lost after the marker, settled released, sent again.
        "the send skips its confirmation before DATA (a send lost after it is sent again)",
        (
            (
                "tasks/mail/smtp.py",
                "                if effect is not None:\n                    effect.confirm()\n"
                "                envelope.transmit(client, effect, progress)",
                "                envelope.transmit(client, effect, progress)",
            ),
        ),
    ),
    Bug(
        "b",
        "the dispatcher skips a week claimed by a dead dispatcher as if it were published",
        (
            (
                "tasks/worker/dispatch.py",
                "    if client.set(marker, claim, xx=True, ex=CLAIM_TTL_S):\n"
                "        return Held.OURS\n    return Held.ELSEWHERE",
                "    return Held.PUBLISHED",
            ),
        ),
    ),
    # A cancel is refused once the send is claimed (cancel.lua), so the takeover's own check
    # of the send claim alone is a second lock that only a cancel landing between a holder's
    # step boundary and its send claim could test: both locks are removed, as before issue 24.
    Bug(
        "c",
        "a run is cancelled while its send is claimed and its claims are handed over",
        (
            (
                "journal/lua/cancel.lua",
                "  if state and state ~= 'released' then",
                "  if state and state ~= 'released' and effects[i] ~= 'send' then",
            ),
            (
                "tasks/job/claims.py",
                'if run_status(runtime, other) in ("cancelled", None) and not send_claimed('
                "runtime, other)",
                'if run_status(runtime, other) in ("cancelled", None)',
            ),
        ),
    ),
    Bug(
        "d",
        "the map holds answers back and records them only in item order",
        (
            (
                "journal/_run.py",
                "        stop = threading.Event()\n\n        def one(index: int) -> T:",
                "        stop = threading.Event()\n"
                "        in_order = [threading.Event() for _ in items]\n\n"
                "        def one(index: int) -> T:",
            ),
            (
                "journal/_run.py",
                "                    call = functools.partial(fn, items[index])\n",
                "                    def call(item=items[index], index=index):\n"
                "                        answer = fn(item)\n"
                "                        for earlier in range(index):\n"
                "                            if recorded[earlier] is None:\n"
                "                                in_order[earlier].wait()\n"
                "                        return answer\n",
            ),
            (
                "journal/_run.py",
                "                finally:\n                    order.done(\n",
                "                finally:\n                    in_order[index].set()\n"
                "                    order.done(\n",
            ),
        ),
    ),
    Bug(
        "e",
        "a lease takeover trusts a missing /proc entry",
        (
            (
                "journal/_holder.py",
                "            return not _exists(self.pid)  # absent from /proc",
                "            return True  # absent from /proc",
            ),
        ),
    ),
    Bug(
        "f",
        "an ambiguous send is settled as released",
        (
            (
                "journal/_effects.py",
                "            else:\n                effect.ambiguous(one_line(error))",
                "            else:\n                effect.release()",
            ),
        ),
    ),
    Bug(
        "g",
        "release accepts a run whose send is ambiguous",
        (
            (
                "tasks/ops/actions.py",
                '    if send != "released":  # read again, atomically, by the cancel below',
                '    if send not in ("released", "ambiguous"):',
            ),
            (
                "journal/lua/cancel.lua",
                "  if state and state ~= 'released' then",
                "  if state and state ~= 'released' and state ~= 'ambiguous' then",
            ),
        ),
    ),
    Bug(
        "h",
        "the rate limiter never returns a dead prober's hold on the probe",
        (
            (
                "tasks/lua/ratelimit_reserve.lua",
                "redis.call('HSET', key, 'probe', tostring(now + tonumber(ARGV[3])))",
                "redis.call('HSET', key, 'probe', tostring(now + 1e12))",
            ),
        ),
    ),
    Bug(
        "i",
        "the dispatcher's watermark moves past a week another dispatcher claims",
        (
            (
                "tasks/worker/dispatch.py",
                "        gap = gap or held is Held.ELSEWHERE",
                "        gap = False",
            ),
        ),
    ),
)


CAMPAIGN = (sys.executable, "-m", "tests.chaos")
# A campaign's start, quiet period and checks after its faults, at most (its waits are bounded).
CAMPAIGN_BOUND_S = 400


def stale(bugs: tuple[Bug, ...]) -> list[str]:
    """The substitutions whose pattern does not occur exactly once in today's source."""
    problems = []
    for bug in bugs:
        for path, find, _ in bug.changes:
            count = (ROOT / path).read_text().count(find)
            if count != 1:
                problems.append(f"bug {bug.letter}: {path} holds its pattern {count} times")
    return problems


def planted_copy(bug: Bug, workspace: Path) -> Path:
    """A scratch copy of the project with ``bug`` in it."""
    copy = scratch_copy(workspace / f"bug-{bug.letter}")
    for path, find, replace in bug.changes:
        target = copy / path
        source = target.read_text()
        if source.count(find) != 1:
            raise SystemExit(f"bug {bug.letter}: its pattern is gone from {path}")
        target.write_text(source.replace(find, replace))
    return copy


def campaign(
    copy: Path, seed: int, duration: float, out: Path, focus: str | None = None
) -> tuple[int, str]:
    """One campaign against the copy; its exit status and its output."""
    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
    aimed = ["--focus", focus] if focus else []
    process = subprocess.Popen(
        [*CAMPAIGN, "--seed", str(seed), "--duration", str(duration), "--out", str(out), *aimed],
        cwd=copy,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = process.communicate(timeout=duration + CAMPAIGN_BOUND_S)
    except BaseException:
        # Stopped (Ctrl-C, the bound): the campaign's own SIGTERM handler kills its processes.
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.communicate(timeout=60)
        process.kill()
        raise
    return process.returncode, output


def main(argv: list[str] | None = None) -> int:
    """Each bug against each seed; the detection rate per bug. Exit 1 if a bug got away."""
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.planted", description=__doc__)
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated (default: 1,2,3)")
    parser.add_argument("--duration", type=float, default=90.0, help="seconds per campaign")
    parser.add_argument("--bugs", default="", help="letters, comma-separated (default: all)")
    parser.add_argument("--min-rate", type=float, default=2 / 3, help="caught/seeds to pass")
    parser.add_argument("--focus", default=None, help="a FOCUS of tests/chaos/plan.py")
    args = parser.parse_args(argv)
    stop_cleanly_on_signals()
    seeds = [int(seed) for seed in args.seeds.split(",") if seed]
    wanted = set(args.bugs.split(",")) - {""}
    bugs = tuple(bug for bug in BUGS if not wanted or bug.letter in wanted)
    problems = stale(bugs)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 2
    out = ROOT / ".chaos" / "planted"
    missed = []
    with tempfile.TemporaryDirectory(prefix="chaos-planted-") as workspace:
        for bug in bugs:
            copy = planted_copy(bug, Path(workspace))
            caught = []
            for seed in seeds:
                started = time.monotonic()
                where = out / f"bug-{bug.letter}"
                code, output = campaign(copy, seed, args.duration, where, args.focus)
                if code not in (0, 1):
                    print(output, file=sys.stderr)
                    raise SystemExit(f"bug {bug.letter}, seed {seed}: the campaign exited {code}")
                rules = sorted(
                    {
                        line.split("]")[0][3:]
                        for line in output.splitlines()
                        if line.startswith("- [")
                    }
                )
                verdict = f"caught ({', '.join(rules)})" if code == 1 else "missed"
                took = time.monotonic() - started
                print(f"bug {bug.letter} seed {seed}: {verdict} in {took:.0f} s", flush=True)
                if code == 1:
                    caught.append(seed)
            rate = len(caught) / len(seeds)
            print(f"bug {bug.letter}: {len(caught)}/{len(seeds)} ({bug.name})", flush=True)
            if rate < args.min_rate:
                missed.append(bug.letter)
    if missed:
        print(f"planted bugs not caught often enough: {', '.join(missed)}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
