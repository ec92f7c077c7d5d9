"""``python -m examples.records run|status|retry-failed``: the operator's side of a batch.

``run`` and ``retry-failed`` send the run to the workers (``--here`` runs it in this process
instead, under the same lease a worker takes); ``status`` reads the journal and prints every
failed id with its error. A retry is never automatic: ``retry-failed`` is the operator saying
the failures are worth another try, usually after fixing their data (``--fixed``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from examples.records.batch import BatchOptions, batch
from examples.records.config import Config
from examples.records.report import Report, attempt_id, report
from journal.errors import JournalError


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit status (0 done, 1 refused, 2 a usage error)."""
    parser = argparse.ArgumentParser(prog="python -m examples.records", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="start (or resume) a batch")
    run.add_argument("batch", help="the batch's name, its first run's id (b1)")
    run.add_argument("--count", type=int, default=BatchOptions.count, help="records r00001..")
    run.add_argument("--here", action="store_true", help="run it in this process")
    status = commands.add_parser("status", help="each record's latest status, failures listed")
    status.add_argument("batch")
    retry = commands.add_parser("retry-failed", help="retry exactly the failed ids, as a new run")
    retry.add_argument("batch")
    retry.add_argument("--fixed", default="", help="ids whose data was fixed (a,b,... or all)")
    retry.add_argument("--here", action="store_true", help="run it in this process")
    args = parser.parse_args(argv)
    config = Config.from_env()
    try:
        if args.command == "run":
            return _start(config, args.batch, BatchOptions(count=args.count), args.here)
        if args.command == "status":
            print(_summary(report(config.runtime().journal, args.batch)))
            return 0
        return _retry(config, args.batch, args.fixed, args.here)
    except (JournalError, ValueError) as refused:
        print(f"records: {refused}", file=sys.stderr)
        return 1


def _start(config: Config, run_id: str, options: BatchOptions, here: bool) -> int:
    if here:
        outcome = batch.start(run_id, options, journal=config.runtime().journal)
        print(f"{run_id}: {outcome.status}")
        print(_summary(report(config.runtime().journal, options.retry_of or run_id)))
        return 0
    from examples.records.worker import records  # Celery is imported only to send

    sent = records.start(run_id, options)
    print(f"{run_id} sent to the workers (task {sent.id}); follow it with `status`")
    return 0


def _retry(config: Config, name: str, fixed: str, here: bool) -> int:
    batch_report = report(config.runtime().journal, name)
    if not batch_report.attempts:
        print(f"records: no batch {name}", file=sys.stderr)
        return 1
    last = batch_report.attempts[-1]
    if last.state != "done":
        print(f"records: {last.run_id} is {last.state}; retry once it is done", file=sys.stderr)
        return 1
    failed = sorted(batch_report.failed)
    if not failed:
        print(f"{name}: nothing to retry, no record failed")
        return 0
    repaired = failed if fixed == "all" else [rid for rid in fixed.split(",") if rid]
    unknown = sorted(set(repaired) - set(failed))
    if unknown:
        print(f"records: not failed in {name}: {', '.join(unknown)}", file=sys.stderr)
        return 1
    run_id = attempt_id(name, len(batch_report.attempts))
    print(f"retrying {len(failed)} failed records of {name} as {run_id} ({len(repaired)} fixed)")
    options = BatchOptions(ids=failed, fixed=sorted(repaired), retry_of=name)
    return _start(config, run_id, options, here)


def _summary(batch_report: Report) -> str:
    """A batch in a few lines: its counts, each attempt, then every failed id and its error."""
    name = batch_report.batch
    if not batch_report.attempts:
        return f"batch {name}: not started"
    failed = batch_report.failed
    lines = [
        f"batch {name}: {batch_report.records} records, {batch_report.done} done, "
        f"{len(failed)} failed, {batch_report.pending} pending"
    ]
    for attempt in batch_report.attempts:
        lines.append(
            f"  {attempt.run_id:<16} {attempt.state:<8} {len(attempt.statuses)}/"
            f"{attempt.records} processed, {len(attempt.failed)} failed"
        )
    if failed:
        lines.append(f"failed (retry them: python -m examples.records retry-failed {name}):")
        lines += [f"  {rid}  {error}" for rid, error in failed.items()]
    return "\n".join(lines)
