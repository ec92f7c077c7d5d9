"""A real ``celery -A tasks worker`` completing digests handed to it with ``digest enqueue``."""

from __future__ import annotations

import ast
import json
import re
import subprocess
from typing import Any

import pytest

from journal.contrib.embedded import embedded_broker_url, embedded_url
from tests.fakes.anthropic_server import FakeAnthropic
from tests.support import BIN, ROOT, Deployment, Worker, wait_until

pytestmark = pytest.mark.slow

RUN = "2026-w42"


def enqueue(deployment: Deployment, run_id: str = RUN) -> str:
    """Hand the run to the workers; returns the Celery task id the CLI printed."""
    done = deployment.cli("enqueue", run_id)
    assert done.returncode == 0, done.stderr
    found = re.search(r" as task (\S+);", done.stdout)
    assert found, done.stdout
    return found.group(1)


def task_result(worker: Worker, task_id: str) -> dict[str, Any] | None:
    """The value the worker logged for ``task_id`` once it succeeded, if it has."""
    found = re.search(
        rf"Task tasks\.digest\[{re.escape(task_id)}\] succeeded in [\d.e-]+s: (.*)$",
        worker.text(),
        re.MULTILINE,
    )
    return ast.literal_eval(found.group(1)) if found else None


def test_a_worker_runs_the_digest_once_and_a_second_delivery_is_already_done(
    deployment: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    deployment.env.update(fake_anthropic.env())
    worker = deployment.worker("w1", concurrency=1)

    first = enqueue(deployment)
    result = wait_until(lambda: task_result(worker, first), 30, "the first delivery")
    assert result["status"] == "done"
    assert result["result"] == {
        "status": "sent",
        "items": 8,
        "model_calls": 9,
        "receipt": {"id": "digest-2026-w42", "sent": True},
    }
    assert (result["ran"], result["replayed"]) == (13, 0)
    assert fake_anthropic.calls == 9
    assert [p.name for p in deployment.outbox()] == ["digest-2026-w42.json"]

    second = enqueue(deployment)
    again = wait_until(lambda: task_result(worker, second), 30, "the second delivery")
    assert (again["status"], again["ran"], again["replayed"]) == ("already-done", 0, 0)
    assert again["result"] == result["result"]  # the outcome recorded by the first delivery
    assert fake_anthropic.calls == 9
    assert len(deployment.outbox()) == 1
    assert deployment.view(RUN).meta["deliveries"] == "2"


OFFLINE_LOG = "no ANTHROPIC_API_KEY: summarizing offline"


def test_on_the_embedded_default_a_worker_without_a_key_summarizes_offline_like_the_cli(
    deployment: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    deployment.env.pop("ANTHROPIC_API_KEY", None)
    deployment.env["ANTHROPIC_BASE_URL"] = fake_anthropic.url
    deployment.env.pop("DIGEST_OFFLINE", None)
    # What `digest run` makes offline (a dry run: nothing sent, nothing marked seen).
    by_cli = deployment.cli("run", RUN, "--dry-run")
    assert by_cli.returncode == 0, by_cli.stderr
    worker = deployment.worker("nokey", concurrency=2)

    task_id = enqueue(deployment)
    result = wait_until(lambda: task_result(worker, task_id), 30, "the delivery")
    assert result["result"]["status"] == "sent"
    assert fake_anthropic.calls == 0
    assert [p.name for p in deployment.outbox()] == ["digest-2026-w42.json"]
    sent = json.loads(deployment.outbox()[0].read_text())
    assert sent["body"].split("\n\n", 1)[1] in by_cli.stdout
    assert worker.text().count(OFFLINE_LOG) == 1


def test_with_redis_url_set_a_worker_without_a_key_refuses_instead_of_summarizing_offline(
    deployment: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    deployment.env.pop("ANTHROPIC_API_KEY", None)
    deployment.env["ANTHROPIC_BASE_URL"] = fake_anthropic.url
    deployment.env.pop("DIGEST_OFFLINE", None)
    # A real deployment names its Redis: the same server, given explicitly.
    deployment.env["REDIS_URL"] = embedded_url(deployment.state_dir)
    deployment.env["CELERY_BROKER_URL"] = embedded_broker_url(deployment.state_dir)
    worker = deployment.worker("nokey", concurrency=1)

    task_id = enqueue(deployment)
    wait_until(lambda: deployment.view(RUN).status == "failed", 30, "the run to fail")
    view = deployment.view(RUN)
    assert view.meta["last_error"].startswith("ModelNotConfigured: ANTHROPIC_API_KEY is not set")
    assert "DIGEST_OFFLINE=1" in view.meta["last_error"]
    assert [r.key for r in view.steps] == ["select"]
    wait_until(lambda: f"tasks.digest[{task_id}] raised" in worker.text(), 10, "the failure log")
    assert fake_anthropic.calls == 0
    assert deployment.outbox() == []
    assert OFFLINE_LOG not in worker.text()


def test_the_pool_children_share_the_sdk_the_main_process_imported(
    deployment: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    # With -X importtime the main process reports each module it imports: the SDK must be one,
    # before the pool is ready, so the children forked after it share the imported modules.
    deployment.env.update(fake_anthropic.env(), PYTHONPROFILEIMPORTTIME="1")
    worker = deployment.worker("w1", concurrency=2)
    task_id = enqueue(deployment)
    result = wait_until(lambda: task_result(worker, task_id), 30, "the delivery")
    assert result["result"]["model_calls"] == 9
    log = worker.text()
    sdk = re.findall(r"^import time:.*\| anthropic$", log, re.MULTILINE)
    assert len(sdk) == 1
    assert log.index(sdk[0]) < log.index(" ready.")


@pytest.mark.parametrize("program", ["worker", "beat"])
def test_with_rabbitmq_a_time_limit_at_its_consumer_timeout_is_refused_at_start(
    deployment: Deployment, program: str
) -> None:
    # Nothing listens on port 9: the refusal comes before any connection is tried. The default
    # limit is derived from the broker; one set explicitly is still checked.
    env = {
        **deployment.env,
        "CELERY_BROKER_URL": "amqp://guest:s3cret@127.0.0.1:9//",
        "DIGEST_TASK_TIME_LIMIT": "1800",
    }
    started = subprocess.run(
        [str(BIN / "celery"), "-A", "tasks", program],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (started.returncode, started.stdout) == (2, ""), started.stderr
    assert started.stderr.splitlines() == [
        "digest: DIGEST_TASK_TIME_LIMIT=1800 must stay below 90% of RabbitMQ's consumer timeout "
        "(DIGEST_CONSUMER_TIMEOUT=1800), or RabbitMQ closes the channel of a delivery still "
        "running and redelivers it; lower DIGEST_TASK_TIME_LIMIT to 1619 or less, or raise "
        "consumer_timeout on the broker and DIGEST_CONSUMER_TIMEOUT to match"
    ]
