"""How long the ``digest`` command takes next to the floor, ``python -c "import redis"``.

    python -m bench.cli            # 15 rounds
    python -m bench.cli --rounds 5

Every command runs as a whole process, in its own throwaway state directory (its embedded
Valkey started once, before timing, and stopped at the end), offline, with the same
interpreter. Rounds interleave the commands so each sees the same machine at the same moment;
each row is the median wall time and its ratio to the floor's median. The targets:

- ``digest --help``, ``digest show``: at most 1.3x the floor;
- ``digest runs``: at most 1.5x the floor;
- ``digest run`` of a run that is already done: at most 2x the floor;
- a ``digest run`` that runs every step exits within 0.1 s of printing its last line.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

from bench._common import digest, isolated_env, verdict
from journal.contrib.embedded import stop_embedded
from tests.support import BIN, fresh_items

RUN = "2026-w42"
FLOOR = [sys.executable, "-c", "import redis"]
COMMANDS: dict[str, tuple[list[str], float | None]] = {
    "python -c 'import redis' (floor)": (FLOOR, None),
    "digest --help": ([str(BIN / "digest"), "--help"], 1.3),
    f"digest show {RUN}": ([str(BIN / "digest"), "show", RUN], 1.3),
    "digest runs": ([str(BIN / "digest"), "runs"], 1.5),
    f"digest run {RUN} (already done)": ([str(BIN / "digest"), "run", RUN], 2.0),
}
EXIT_TARGET_S = 0.1


def timed(command: list[str], env: dict[str, str], cwd: Path) -> float:
    """Wall seconds of one whole process."""
    started = time.perf_counter()
    subprocess.run(command, env=env, cwd=cwd, capture_output=True, check=True)
    return time.perf_counter() - started


def exit_lag(command: list[str], env: dict[str, str], cwd: Path) -> float:
    """Seconds from the last line the process printed to its exit."""
    process = subprocess.Popen(
        command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert process.stdout is not None
    last = time.perf_counter()
    for _ in process.stdout:
        last = time.perf_counter()
    process.wait()
    return time.perf_counter() - last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    rounds = parser.parse_args().rounds

    with tempfile.TemporaryDirectory(prefix="digest-bench-") as scratch:
        here = Path(scratch)
        state = here / ".digest"
        env = isolated_env(state, DIGEST_ITEMS=str(fresh_items(here, "w42")))
        try:
            digest(env, here, "run", RUN)  # the done run, and the server, before timing
            times: dict[str, list[float]] = {name: [] for name in COMMANDS}
            lags: list[float] = []
            for round_ in range(rounds):
                for name, (command, _) in COMMANDS.items():
                    times[name].append(timed(command, env, here))
                fresh = env | {"DIGEST_ITEMS": str(fresh_items(here, f"r{round_}"))}
                lags.append(
                    exit_lag([str(BIN / "digest"), "run", f"2027-w{round_ + 1:02d}"], fresh, here)
                )
        finally:
            stop_embedded(state)

    floor = median(times[next(iter(COMMANDS))])
    print(f"{rounds} rounds, Python {sys.version.split()[0]}, medians of whole processes\n")
    print(f"{'command':38} {'wall s':>8} {'x floor':>8} {'target':>8}")
    for name, (_, target) in COMMANDS.items():
        wall = median(times[name])
        judged = "" if target is None else f"{target:.1f}x {verdict(wall / floor, target)}"
        print(f"{name:38} {wall:8.3f} {wall / floor:8.2f} {judged:>8}")
    lag = median(lags)
    print(
        f"\nexit after the last line of a full run: {lag:.3f} s median "
        f"(min {min(lags):.3f}, max {max(lags):.3f}); target {EXIT_TARGET_S} s: "
        f"{verdict(lag, EXIT_TARGET_S)}"
    )


if __name__ == "__main__":
    main()
