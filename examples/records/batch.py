"""The batch workflow: one journaled step per record, its status as the step's result.

A batch is a chain of runs. The first, named by the operator (``b1``), processes records
``r00001`` to ``r<count>``; each deliberate retry is a run of its own (``b1.retry1``,
``b1.retry2``, ...) over exactly the ids the previous attempt left failed, with the ids
whose data was fixed meanwhile. Nothing is retried otherwise: a failed record is a recorded
result, so starting a run again replays its failures as failures.

Why one step per record rather than one per chunk: a step is the unit a crash can lose, so
a chunk would process its finished records again after a crash. A record in flight when the
process dies is the one thing done twice (its result was not yet recorded); its document is
written under its id, so that costs a repeat of the work, never a second document.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import journal
from examples.records.config import Config
from examples.records.source import record_id
from journal import Run

WORKFLOW = "records"
STEP = "record"  # each record's step is "record:<id>"


@dataclass(frozen=True)
class BatchOptions:
    """What a run of the batch processes; frozen in the run at its first start.

    Attributes:
        count: the first run's records, ``r00001`` to ``r<count>``.
        ids: a retry's records instead: the failed ids of the attempt before it.
        fixed: ids whose data the operator fixed before this retry.
        retry_of: the batch (its first run's id) a retry belongs to; None for the first run.
        concurrency: records processed at once.
    """

    count: int = 3000
    ids: list[str] | None = None
    fixed: list[str] = field(default_factory=list)
    retry_of: str | None = None
    concurrency: int = 4


def outcome(ids: list[str], statuses: list[dict[str, Any]]) -> dict[str, Any]:
    """What a run returns: its counts and its failed ids with their errors, in id order."""
    failed = {
        rid: s["error"] for rid, s in zip(ids, statuses, strict=True) if s["status"] != "done"
    }
    return {"records": len(ids), "done": len(ids) - len(failed), "failed": failed}


@journal.workflow(WORKFLOW, options=BatchOptions)
def batch(run: Run, options: BatchOptions) -> dict[str, Any]:
    """Process every record of this run once, whatever crashes; list the ones that failed."""
    if options.ids is not None:
        ids = options.ids
    else:
        ids = [record_id(number) for number in range(1, options.count + 1)]
    config = Config.from_env()
    sink = config.runtime().sink(options.retry_of or run.run_id)
    fixed = frozenset(options.fixed)

    def one(rid: str) -> dict[str, Any]:
        # Caught per record, so one bad record is recorded as failed and the rest go on (an
        # error escaping a map's item would stop the items not yet started). Only Exception:
        # a worker's shutdown or a lost lease must still stop the run.
        try:
            return {"status": "done", "document": sink.process(rid, fixed, config.work_ms)}
        except Exception as error:
            return {"status": "failed", "error": f"{type(error).__name__}: {error}"}

    statuses = run.map(STEP, ids, one, key=lambda rid: rid, concurrency=options.concurrency)
    return outcome(ids, statuses)
