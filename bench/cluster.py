"""What each record durability setting costs on a Redis Cluster: per step, on loopback.

    python -m bench.cluster            # a throwaway 3-master, 3-replica Valkey cluster

One run of ``STEPS`` fenced steps through ``Journal.execute`` per setting, the settings
interleaved over ``ROUNDS`` rounds so that each sees the same machine and the same moment;
the figure is the median time per step, opening and closing included. The nodes run
``appendfsync everysec``, the setting that WAITAOF exists for (under ``always`` each write is
on disk before its reply anyway):

- none: the master's acknowledgement; a failover may lose what its replica had not received;
- WAIT 1: one replica has the record in memory, in the same round trip (``wait_replicas=1``);
- WAITAOF: the master's own AOF has it on disk (``fsync_records``);
- both: WAIT 1, then WAITAOF, still one round trip.

Loopback hides the network: across hosts, WAIT adds the replica's round trip on top.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from statistics import median

from journal import Journal, Keyspace, Run, Settings, connect, workflow
from tests.cluster import valkey_cluster
from tests.support import returning

STEPS = 200
ROUNDS = 7
SETTINGS = {
    "none": Settings(),
    "WAIT 1": Settings(wait_replicas=1),
    "WAITAOF": Settings(fsync_records=True),
    "WAIT 1 + WAITAOF": Settings(wait_replicas=1, fsync_records=True),
}


def body(run: Run) -> int:
    for n in range(STEPS):
        run.step(f"s{n}", returning(n))
    return STEPS


def main() -> None:
    with (
        tempfile.TemporaryDirectory() as scratch,
        valkey_cluster(
            Path(scratch), "--appendonly", "yes", "--appendfsync", "everysec"
        ) as cluster,
    ):
        journals = {
            name: Journal(connect(cluster.url), keyspace=Keyspace("bench", shards=3), settings=s)
            for name, s in SETTINGS.items()
        }
        per_step: dict[str, list[float]] = {name: [] for name in SETTINGS}
        for round_ in range(ROUNDS):
            for name, journal in journals.items():
                start = time.perf_counter()
                run_id = f"{list(SETTINGS).index(name)}-{round_}"
                workflow("bench")(body).start(run_id, journal=journal)
                per_step[name].append((time.perf_counter() - start) / STEPS)
        base = median(per_step["none"])
        print(f"{STEPS} steps per run, {ROUNDS} rounds, median per step (3x3 cluster, loopback)")
        print(f"{'setting':<18} {'per step':>10} {'vs none':>8}")
        for name, times in per_step.items():
            cost = median(times)
            print(f"{name:<18} {cost * 1e6:>8.0f} us {cost / base:>7.2f}x")


if __name__ == "__main__":
    main()
