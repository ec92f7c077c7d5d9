"""What a ``digest run`` costs in client round trips, counted by the server with MONITOR.

A run of S steps is at most S + 2 (an opening and a closing script, one record a step; a
repeatable step's record, and a settled effect's, goes with the next write, so it costs
none). On top of that a process pays once for its start-up checks, which load the scripts as
well (a server that has not seen them costs no more); a model call pays at most one more, the
shared limiter's reservation (its settle goes with the step's record). The targets (issue
39), plus one a model call: a cold run (a new process, a server that knows no script) at most
S + 6; a warm one (a process that made its start-up checks, as a worker's after its first
delivery) at most S + 3. A new ``digest run`` on a server that knows the scripts pays its
process's start-up checks: one more than warm. Counted on the session's own Valkey (MONITOR
sees the whole server), between two markers this test sends, each command a process sends
being a round trip (a MULTI ... EXEC is one, commands a script runs are the script's). A
worker's delivery is counted with its broker on another server, so that only the journal's
round trips are seen.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from celery import Celery

from journal.ops.views import inspect_run
from tests.fakes.anthropic_server import FakeAnthropic
from tests.support import ROOT, Deployment, ThrowawayValkeys, round_trips

pytestmark = pytest.mark.slow  # whole digest processes, as an operator runs them

ITEMS = 5
# The targets, beyond the run's steps (a model call may add one more, its reservation).
COLD_EXTRA = 6
WARM_EXTRA = 3
# What is reached so far, held so that nothing adds a round trip back.
CEILING_COLD = 4
CEILING_AGAIN = 4
# A cold run's first call probes limits nothing has taught yet, and the others ask again
# while it does: up to two reservations a call. A later run's call costs one, its reservation;
# its settle rides in the round trip of the step's record.
CEILING_PER_CALL = 2
# A budgeted run's first reservations find no spend yet: each reads the journal's and asks
# again, as many as are in flight together (DIGEST_CONCURRENCY, 3) before one has written it.
BUDGET_SEED = 2 * 3


def own_deployment(url: str, directory: Path) -> tuple[Deployment, redis.Redis]:
    """A deployment on the session's own Valkey, with a week of ``ITEMS`` updates."""
    # A lease long enough that no heartbeat falls inside a run: renewals are paid by time,
    # not by run, and are not what is counted here.
    deployment = Deployment(directory / "state", REDIS_URL=url, DIGEST_LEASE_TTL="60")
    shipped = json.loads((ROOT / "data" / "items.json").read_text(encoding="utf-8"))
    items = directory / "items.json"
    items.write_text(json.dumps(shipped[:ITEMS]))
    deployment.env["DIGEST_ITEMS"] = str(items)
    return deployment, redis.Redis.from_url(url)


def digest_round_trips(client: redis.Redis, deployment: Deployment, *args: str) -> list[str]:
    """The commands one ``digest`` process sent, one per round trip; it must exit 0."""
    ran: list[subprocess.CompletedProcess[str]] = []
    sent = round_trips(client, lambda: ran.append(deployment.cli(*args)))
    assert ran[0].returncode == 0, ran[0].stderr
    return sent


def steps_of(deployment: Deployment, run_id: str) -> int:
    """How many steps the run recorded (the send, an effect, counts as one)."""
    return len(inspect_run(deployment.runtime().journal, "digest", run_id).steps)


def fresh(deployment: Deployment) -> Path:
    """The same items under new ids, so a second week has them all to summarize."""
    path = Path(deployment.env["DIGEST_ITEMS"])
    items = [{**item, "id": f"again-{item['id']}"} for item in json.loads(path.read_text())]
    again = path.with_name("again.json")
    again.write_text(json.dumps(items))
    return again


@dataclass(frozen=True)
class Counted:
    """Round trips beyond the steps of a cold run and of the next week's, and the calls made.

    ``again``: the next week in a new process, on a server that knows the scripts.
    """

    cold: int
    again: int
    calls: int
    sent: str


def counted(deployment: Deployment, client: redis.Redis, calls: Callable[[], int]) -> Counted:
    """Run a week on a server that knows no script, then the next week in a new process."""
    client.script_flush()  # this session's own server: as a new server, it knows no script
    cold = digest_round_trips(client, deployment, "run", "2026-w40")
    cold_calls = calls()
    again = digest_round_trips(
        client, deployment, "run", "2026-w41", "--items", str(fresh(deployment))
    )
    assert calls() == 2 * cold_calls
    return Counted(
        cold=len(cold) - steps_of(deployment, "2026-w40"),
        again=len(again) - steps_of(deployment, "2026-w41"),
        calls=cold_calls,
        sent="cold:\n" + commands(cold) + "\nagain:\n" + commands(again),
    )


def commands(sent: list[str]) -> str:
    return "\n".join(command[:100] for command in sent)


@pytest.fixture(scope="module")
def offline(own_redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Counted:
    deployment, client = own_deployment(own_redis_url, tmp_path_factory.mktemp("offline"))
    return counted(deployment, client, lambda: 0)


def counted_with_model(url: str, directory: Path, **env: str) -> Counted:
    """A cold week and the next whose calls the fake API answers, with ``env`` set."""
    deployment, client = own_deployment(url, directory)
    deployment.env.update(env)
    with FakeAnthropic() as fake:
        deployment.env.update(fake.env())
        found = counted(deployment, client, lambda: fake.calls)
    assert found.calls == ITEMS + 1
    return found


@pytest.fixture(scope="module")
def with_model(own_redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Counted:
    return counted_with_model(own_redis_url, tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def with_budget(own_redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Counted:
    directory = tmp_path_factory.mktemp("budget")
    return counted_with_model(own_redis_url, directory, DIGEST_MAX_COST_USD="5")


def test_an_offline_run_stays_under_its_ceiling(offline: Counted) -> None:
    print(f"offline, beyond the steps: cold {offline.cold}, again {offline.again}")
    assert offline.cold <= CEILING_COLD, offline.sent
    assert offline.again <= CEILING_AGAIN, offline.sent


def test_a_run_with_the_model_stays_under_its_ceiling(with_model: Counted) -> None:
    calls = with_model.calls
    print(
        f"model, beyond the steps: cold {with_model.cold}, again {with_model.again}, {calls} calls"
    )
    assert with_model.cold <= CEILING_COLD + CEILING_PER_CALL * calls, with_model.sent
    assert with_model.again <= CEILING_AGAIN + calls, with_model.sent


def test_a_run_under_a_budget_pays_one_more_round_trip_a_call_its_reservation(
    with_budget: Counted,
) -> None:
    calls = with_budget.calls
    print(f"budget, beyond the steps: cold {with_budget.cold}, again {with_budget.again}")
    # Each call reserves from the limits and from the budget; both settle with the step's
    # record. A run's first reservations find no spend yet and read it from the journal.
    assert with_budget.again <= CEILING_AGAIN + 2 * calls + BUDGET_SEED, with_budget.sent
    assert with_budget.cold <= CEILING_COLD + (CEILING_PER_CALL + 1) * calls + BUDGET_SEED, (
        with_budget.sent
    )


def test_digest_run_reads_its_run_in_the_start_up_checks_transaction(offline: Counted) -> None:
    """The read that refuses a corrupt journal before anything is written costs no trip."""
    for run in offline.sent.split("again:"):
        before_opening = run.split("EVALSHA", 1)[0].split()
        assert before_opening == ["cold:"] * run.startswith("cold:") + ["MULTI"], offline.sent


def test_a_cold_offline_run_meets_the_target(offline: Counted) -> None:
    assert offline.cold <= COLD_EXTRA, offline.sent


# A worker's delivery, the warm case: its process made its start-up checks before, and no read
# comes before the opening (that is the command line's refusal of a corrupt journal). What is
# left over the journal's opening and closing is the digest's own: the item claims, the send's
# confirmation (which takes its claim) and settlement, and the seen set; the records of the
# send (its receipt saved), mark-seen and done go with the closing. A model call adds its
# reservation.
@pytest.mark.parametrize("model", [False, True], ids=["offline", "model"])
def test_a_worker_delivery_meets_the_warm_target(
    own_redis_url: str, tmp_path: Path, throwaway_valkeys: ThrowawayValkeys, model: bool
) -> None:
    deployment, client = own_deployment(own_redis_url, tmp_path)
    broker = f"redis+socket://{throwaway_valkeys.start()}"
    deployment.env.update(CELERY_BROKER_URL=broker)
    with contextlib.ExitStack() as stack:
        if model:
            deployment.env.update(stack.enter_context(FakeAnthropic()).env())
        else:
            deployment.env.update(DIGEST_OFFLINE="1")
        calls = ITEMS + 1 if model else 0
        beyond, sent = delivery_round_trips(deployment, client, broker)
    print(f"worker delivery, beyond the steps: {beyond}, {calls} calls")
    assert beyond <= WARM_EXTRA + calls, sent


def delivery_round_trips(
    deployment: Deployment, client: redis.Redis, broker: str
) -> tuple[int, str]:
    """A worker's second delivery's round trips beyond its steps (its first started it)."""
    deployment.worker("counted", concurrency=1)
    app = Celery(broker=broker, backend=broker)

    def deliver(run_id: str) -> None:
        report = app.send_task("tasks.digest", args=[run_id]).get(timeout=60)
        assert report["result"]["status"] == "sent", report

    try:
        deliver("2026-w40")  # the pool's process starts, checks the store, loads the scripts
        Path(deployment.env["DIGEST_ITEMS"]).write_text(fresh(deployment).read_text())
        sent = round_trips(client, lambda: deliver("2026-w41"))
    finally:
        app.close()
        deployment.close()
    return len(sent) - steps_of(deployment, "2026-w41"), commands(sent)
