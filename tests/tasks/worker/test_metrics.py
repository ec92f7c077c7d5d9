"""Prometheus metrics scraped from a real prefork worker, checked against the journal.

A pool child is killed mid run (``CRASH``, like a kill -9); its counts must survive it, summed
with the next child's through ``prometheus_client``'s multiprocess mode.
"""

from __future__ import annotations

import socket
import subprocess
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tasks.llm.cost import is_call
from tests.fakes.anthropic_server import FakeAnthropic
from tests.support import CALLS, JOURNAL, Deployment, item_ordered, wait_until

pytestmark = pytest.mark.slow

RUN = "2026-w42"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_a_prefork_workers_metrics_add_up_its_children_and_match_the_journal(
    deployment: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    port = free_port()
    env = {**fake_anthropic.env(), "DIGEST_CONCURRENCY": "1", "DIGEST_METRICS_PORT": str(port)}
    worker = deployment.worker(
        "w1", concurrency=2, env={**env, "CRASH": "after:summarize:i3"}, extra=("--pool=prefork",)
    )
    children = worker.children()
    assert deployment.cli("enqueue", RUN).returncode == 0

    wait_until(lambda: deployment.view(RUN).status == "done", 60, "the run to finish")
    assert worker.children() != children or "exited with exitcode 137" in worker.text()
    view = deployment.view(RUN)
    assert item_ordered(view.steps) == JOURNAL
    calls = [r.result for r in view.steps if is_call(r.result)]
    metrics = scrape(port)

    def steps(outcome: str, step: str | None = None) -> float:
        return sum(
            value
            for (name, labels), value in metrics.items()
            if name == "journal_steps_total"
            and ("outcome", outcome) in labels
            and ("workflow", "digest") in labels
            and (step is None or ("step", step) in labels)
        )

    assert steps("ran") == len(JOURNAL)
    assert steps("replayed") == 4  # select, i1..i3
    assert steps("ran", "summarize") == 8  # three in the dead child, five in the next
    summarize = (("step", "summarize"), ("workflow", "digest"))
    assert metrics[("journal_step_duration_seconds_count", summarize)] == 8
    assert metrics[("journal_step_duration_seconds_bucket", (("le", "+Inf"), *summarize))] == 8
    sent = (("outcome", "sent"), ("workflow", "digest"))
    assert metrics[("journal_runs_finished_total", sent)] == 1
    assert metrics[("journal_run_duration_seconds_count", sent)] == 1
    assert 0 < metrics[("journal_run_duration_seconds_sum", sent)] < 60
    by_model: dict[str, list[dict[str, Any]]] = {}  # the calls as their steps recorded them
    for call in calls:
        by_model.setdefault(str(call["model"]), []).append(call)
    assert sum(len(v) for v in by_model.values()) == CALLS == fake_anthropic.calls
    for model, made in by_model.items():
        label = (("model", model),)
        assert metrics[("digest_model_calls_total", label)] == len(made)
        assert metrics[("digest_model_call_duration_seconds_count", label)] == len(made)
        for kind in ("input", "output"):
            expected = sum(int(c[f"{kind}_tokens"]) for c in made)
            assert metrics[("digest_model_tokens_total", (("kind", kind), *label))] == expected
        spent = sum(float(c["cost_usd"]) for c in made)
        assert metrics[("digest_model_cost_usd_total", label)] == pytest.approx(spent)
    assert metrics[("digest_send_duration_seconds_count", (("transport", "FileOutbox"),))] == 1
    assert ("process_cpu_seconds_total", ()) in metrics
    assert any(name == "digest_build_info" for name, _ in metrics)
    # What Redis holds is exported once, by the console or `digest metrics`: not here.
    assert not {"journal_runs", "journal_due_lag_seconds"} & {name for name, _ in metrics}


def test_a_worker_removes_the_metrics_directories_of_dead_workers_and_its_own_at_exit(
    deployment: Deployment,
) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = deployment.state_dir / f"metrics-{dead.pid}"
    stale.mkdir()
    (stale / "counter_1.db").write_bytes(b"old")
    worker = deployment.worker("w1", env={"DIGEST_METRICS_PORT": str(free_port())})
    own = deployment.state_dir / f"metrics-{worker.process.pid}"
    assert own.is_dir()
    assert not stale.exists()
    assert worker.stop() == 0  # a warm shutdown (SIGTERM)
    assert not own.exists()
