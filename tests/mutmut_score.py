"""The mutation score of each mutated module, from the results ``mutmut run`` left in ``mutants/``.

``python -m tests.mutmut_score`` prints one line per module; ``--survivors`` adds the name of
every mutant that was not killed, for ``mutmut show NAME``.

The score is killed / (killed + survived). A timeout counts as killed (the mutant made the tests
hang, which a run notices), and so does a worker that died of a signal, which is how mutmut
ends a test run past its CPU limit. A mutant no fast journal test reaches ("no tests") counts
as survived: nothing would notice it. Anything else (not yet checked, suspicious) is shown
apart and left out of the score, so an unfinished run cannot look better than it is.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from mutmut.stats import status_by_exit_code

MODULES = ("journal/_lease.py", "journal/_run.py", "journal/_journal.py")
KILLED = {"killed", "timeout", "segfault"}
SURVIVED = {"survived", "no tests"}


def statuses(module: str, root: Path = Path("mutants")) -> dict[str, str]:
    """Each mutant of ``module`` and mutmut's word for its result."""
    meta = json.loads((root / f"{module}.meta").read_text())
    exit_codes: dict[str, int | None] = meta["exit_code_by_key"]
    return {name: status_by_exit_code[code] for name, code in exit_codes.items()}


def main(argv: list[str]) -> int:
    """Print the per-module scores (and the survivors with ``--survivors``)."""
    survivors: list[str] = []
    print(f"{'module':<20} {'total':>6} {'killed':>7} {'survived':>9} {'no tests':>9} {'score':>7}")
    for module in MODULES:
        found = statuses(module)
        counts = Counter(found.values())
        killed = sum(counts[s] for s in KILLED)
        survived = sum(counts[s] for s in SURVIVED)
        other = len(found) - killed - survived
        score = f"{100 * killed / (killed + survived):.1f}%" if killed + survived else "-"
        line = f"{module:<20} {len(found):>6} {killed:>7} {survived:>9} {counts['no tests']:>9}"
        print(f"{line} {score:>7}" + (f"  ({other} unchecked or suspicious)" if other else ""))
        survivors += sorted(name for name, status in found.items() if status in SURVIVED)
    if "--survivors" in argv:
        print("\n".join(survivors))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
