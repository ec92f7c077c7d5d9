"""The resumable batch of ``examples/records`` on real Celery workers, counted per record.

Every test starts ``celery -A examples.records worker`` against a throwaway Valkey of its own
and drives the batch through its command line, as an operator would. What each record's
processing did is read back from the example's sink (a call counter and a document per
record id), what the journal recorded from the journal itself: the counts are exact.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from examples.records.config import Config
from examples.records.report import Report, report
from examples.records.source import BAD_EVERY, Sink, record_id
from journal.ops.views import inspect_run
from tests.support import BIN, ROOT, ThrowawayValkeys, Worker, wait_until

pytestmark = pytest.mark.slow

RECORDS = 3000
BAD = [record_id(n) for n in range(BAD_EVERY, RECORDS + 1, BAD_EVERY)]  # 30 of them
GOOD = sorted({record_id(n) for n in range(1, RECORDS + 1)} - set(BAD))
CONCURRENCY = 4  # the batch's own default: records processed at once by one run
ERROR = "ValueError: record {} has no amount"


class Batches:
    """One isolated deployment of the example: its own Valkey, key prefix, workers and CLI."""

    def __init__(self, servers: ThrowawayValkeys, directory: Path) -> None:
        self.directory = directory
        socket = servers.start("--appendonly", "no")
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("RECORDS_")},
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
            "RECORDS_REDIS_URL": f"unix://{socket}",
            "RECORDS_PREFIX": f"t{uuid.uuid4().hex[:8]}",
            "RECORDS_LEASE_TTL": "2",
            "RECORDS_RECOVERY_GRACE": "0.5",
            "RECORDS_SWEEP_INTERVAL": "0.5",
        }
        self.config = Config.from_env(self.env)
        self.workers: list[Worker] = []

    def worker(self, name: str, *, beat: bool = False, work_ms: int = 0) -> Worker:
        """Start ``celery -A examples.records worker`` (one pool child) and wait until ready."""
        log = self.directory / f"worker-{name}.log"
        command = [str(BIN / "celery"), "-A", "examples.records", "worker"]
        command += [f"--hostname={name}@%h", "--concurrency=1", "--loglevel=INFO"]
        command += ["--without-gossip", "--without-mingle", *(["--beat"] if beat else [])]
        if beat:
            command.append(f"--schedule={self.directory / f'beat-{name}'}")
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**self.env, "RECORDS_WORK_MS": str(work_ms)},
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        worker = Worker(process, log)
        self.workers.append(worker)
        wait_until(worker.ready, 30, f"worker {name} to be ready (log: {log})")
        return worker

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``python -m examples.records ARGS``, to completion."""
        return subprocess.run(
            [sys.executable, "-m", "examples.records", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def report(self, batch: str) -> Report:
        return report(self.config.runtime().journal, batch)

    def status(self, run_id: str) -> str:
        return inspect_run(self.config.runtime().journal, "records", run_id).status

    def wait_done(self, run_id: str, timeout: float) -> None:
        wait_until(lambda: self.status(run_id) == "done", timeout, f"run {run_id} done", 0.1)

    def sink(self, batch: str) -> Sink:
        return self.config.runtime().sink(batch)

    def close(self) -> None:
        for worker in self.workers:
            if worker.process.poll() is None:
                worker.kill()
            worker.process.wait(timeout=10)


@pytest.fixture
def batches(throwaway_valkeys: ThrowawayValkeys, tmp_path: Path) -> Iterator[Batches]:
    deployed = Batches(throwaway_valkeys, tmp_path)
    yield deployed
    deployed.close()


def recorded(batches: Batches, run_id: str) -> set[str]:
    """The ids of the records whose step the journal holds for a run."""
    view = inspect_run(batches.config.runtime().journal, "records", run_id)
    return {step.key.removeprefix("record:") for step in view.steps}


def test_a_batch_on_a_worker_processes_every_record_once_and_lists_the_bad_ones(
    batches: Batches,
) -> None:
    worker = batches.worker("a")
    sent = batches.cli("run", "b1", "--count", str(RECORDS))
    assert sent.returncode == 0, sent.stderr
    batches.wait_done("b1", 40)

    sink = batches.sink("b1")
    assert sink.calls() == dict.fromkeys(sorted(BAD + GOOD), 1)  # each record once, none twice
    assert sorted(sink.documents()) == GOOD  # a document for every good record, none for a bad
    done = batches.report("b1")
    assert (done.records, done.done, done.pending) == (RECORDS, RECORDS - len(BAD), 0)
    assert done.failed == {rid: ERROR.format(rid) for rid in BAD}

    status = batches.cli("status", "b1")
    assert status.returncode == 0, status.stderr
    assert "batch b1: 3000 records, 2970 done, 30 failed, 0 pending" in status.stdout
    listed = re.findall(r"^  (r\d{5})  (.+)$", status.stdout, re.MULTILINE)
    assert listed == [(rid, ERROR.format(rid)) for rid in BAD]
    assert "ERROR/" not in worker.text() and "Traceback" not in worker.text()


def test_a_worker_killed_mid_batch_is_resumed_by_a_new_one_without_redoing_a_record(
    batches: Batches,
) -> None:
    first = batches.worker("a", work_ms=2)
    assert batches.cli("run", "b1", "--count", str(RECORDS)).returncode == 0
    wait_until(lambda: len(recorded(batches, "b1")) >= 600, 40, "600 records recorded", 0.02)
    first.kill(signal.SIGKILL)  # the whole worker: its main process and its pool child
    first.process.wait(timeout=10)
    before = recorded(batches, "b1")  # nothing writes now: the one holder is dead
    assert 600 <= len(before) < RECORDS
    assert batches.status("b1") == "running"  # as the dead holder left it

    killed = time.monotonic()
    batches.worker("b", beat=True)  # its due sweep finds the run once the dead lease expires
    batches.wait_done("b1", 40)
    resumed_in = time.monotonic() - killed

    fences = {
        step.key.removeprefix("record:"): step.fence
        for step in inspect_run(batches.config.runtime().journal, "records", "b1").steps
    }
    assert {rid: fences[rid] for rid in before} == dict.fromkeys(before, 1)  # the dead holder's
    assert set(fences.values()) == {1, 2}  # the rest recorded by the new worker, fenced anew
    calls = batches.sink("b1").calls()
    assert sorted(calls) == sorted(BAD + GOOD)
    assert {rid: calls[rid] for rid in before} == dict.fromkeys(before, 1)  # never redone
    twice = {rid: n for rid, n in calls.items() if n != 1}
    # Only a record in flight at the kill (processed, its step not yet recorded) runs again:
    # at most one per thread of the map. Its document is keyed by its id, so it is one still.
    assert set(twice.values()) <= {2} and len(twice) <= CONCURRENCY, twice
    assert sorted(batches.sink("b1").documents()) == GOOD
    done = batches.report("b1")
    assert (done.records, done.done, done.pending) == (RECORDS, RECORDS - len(BAD), 0)
    assert done.failed == {rid: ERROR.format(rid) for rid in BAD}
    print(
        f"recorded before the kill: {len(before)}, processed twice: {len(twice)}, "
        f"resumed and finished {resumed_in:.1f}s after the kill"
    )


def test_the_failed_ids_are_retried_only_deliberately_and_only_they(batches: Batches) -> None:
    batches.worker("a")
    assert batches.cli("run", "b1", "--count", str(RECORDS)).returncode == 0
    batches.wait_done("b1", 40)

    # Starting the batch again replays it: a failed record is not retried behind anyone's back.
    again = batches.cli("run", "b1", "--count", str(RECORDS), "--here")
    assert again.returncode == 0, again.stderr
    assert set(batches.sink("b1").calls().values()) == {1}

    fixed = BAD[:20]  # the operator repaired 20 of the 30; the other 10 are still bad
    retry = batches.cli("retry-failed", "b1", "--fixed", ",".join(fixed))
    assert retry.returncode == 0, retry.stderr
    assert "retrying 30 failed records of b1 as b1.retry1" in retry.stdout
    batches.wait_done("b1.retry1", 40)

    calls = batches.sink("b1").calls()
    assert {rid: calls[rid] for rid in BAD} == dict.fromkeys(BAD, 2)  # exactly the failed ones
    assert {rid: calls[rid] for rid in GOOD} == dict.fromkeys(GOOD, 1)  # never a done one
    assert sorted(batches.sink("b1").documents()) == sorted(GOOD + fixed)
    after = batches.report("b1")
    assert (after.records, after.done, after.pending) == (RECORDS, RECORDS - 10, 0)
    assert after.failed == {rid: ERROR.format(rid) for rid in BAD[20:]}

    last = batches.cli("retry-failed", "b1", "--fixed", "all")
    assert last.returncode == 0, last.stderr
    batches.wait_done("b1.retry2", 40)
    calls = batches.sink("b1").calls()
    assert {rid: calls[rid] for rid in BAD[20:]} == dict.fromkeys(BAD[20:], 3)
    assert sum(calls.values()) == RECORDS + len(BAD) + 10
    assert batches.report("b1").failed == {}
    nothing = batches.cli("retry-failed", "b1")
    assert nothing.returncode == 0 and "nothing to retry" in nothing.stdout
