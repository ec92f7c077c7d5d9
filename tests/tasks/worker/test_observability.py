"""The shipped alert rules, dashboard and compose stack fit the metrics the code exports.

The rules are checked and unit-tested by Prometheus's own ``promtool`` (skipped, saying so,
without it: ``.ci/run`` installs it); the dashboard's and the rules' every metric name must be
one a worker or the exporter serves; ``digest metrics`` is a real process scraped over HTTP,
counting every run of the index, not the newest thousand.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from prometheus_client import generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from journal import Journal, Keyspace, Run
from tasks.config import Config
from tasks.keys import DigestKeys
from tasks.llm.client import OfflineSummarizer
from tasks.mail.smtp import FileOutbox
from tasks.runtime import Runtime
from tasks.worker import metrics
from tests.support import Deployment, execute, wait_until

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool absent (Debian: apt-get install prometheus)"
)
# A metric name as PromQL writes one of ours.
OURS = re.compile(r"\b(?:journal|digest)_[a-z_]+\b")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.slow
@needs_promtool
def test_the_alert_rules_are_valid_and_fire_exactly_when_their_tests_say() -> None:
    checked = promtool("check", "rules", str(DEPLOY / "prometheus" / "alerts.yml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "4 rules found" in checked.stdout
    tested = promtool("test", "rules", str(DEPLOY / "prometheus" / "alerts_test.yml"))
    assert tested.returncode == 0, tested.stdout + tested.stderr


@pytest.mark.slow
@needs_promtool
def test_the_prometheus_config_is_valid() -> None:
    checked = promtool("check", "config", str(DEPLOY / "prometheus" / "prometheus.yml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.fixture
def runtime(real_redis: redis.Redis, prefix: str, tmp_path: Path) -> Runtime:
    return Runtime(
        config=Config(key_prefix=prefix, state_dir=tmp_path, max_cost_usd=1.0),
        client=real_redis,
        journal=Journal(real_redis, keyspace=Keyspace(prefix)),
        keys=DigestKeys(prefix),
        summarizer=OfflineSummarizer(),
        mailer=FileOutbox(tmp_path / "outbox"),
    )


def exported_names(runtime: Runtime) -> set[str]:
    """Every sample name a worker's counters and histograms and the exporter's gauges give."""
    names = {
        sample
        for metric in vars(metrics).values()
        if isinstance(metric, MetricWrapperBase)
        for family in metric.describe()
        for sample in (
            f"{family.name}_total",
            f"{family.name}_bucket",
            f"{family.name}_sum",
            f"{family.name}_count",
        )
    }
    text = generate_latest(metrics.store_registry(lambda: runtime.journal, 1.0)).decode()
    names |= {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    return names


def expressions(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            else:
                yield from expressions(value)
    elif isinstance(node, list):
        for value in node:
            yield from expressions(value)


def test_every_metric_the_dashboard_and_rules_use_is_exported(runtime: Runtime) -> None:
    exported = exported_names(runtime)
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "digest.json").read_text())
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    used = {
        name
        for source in (dashboard, rules)
        for expr in expressions(source)
        for name in OURS.findall(expr)
    }
    assert len(used) >= 12, used
    assert used <= exported, used - exported
    assert len(dashboard["panels"]) >= 12
    assert all(panel["targets"] for panel in dashboard["panels"])


def test_the_compose_stack_scrapes_the_workers_and_the_console_into_grafana() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"console", "prometheus", "grafana"} <= set(services)
    worker_env = services["worker"]["environment"]
    assert "DIGEST_METRICS_PORT=9808" in worker_env
    scrape = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets = {
        config["job_name"]: config["static_configs"][0]["targets"]
        for config in scrape["scrape_configs"]
    }
    assert targets == {"digest-worker": ["worker:9808"], "digest-console": ["console:8765"]}
    console = " ".join(services["console"]["command"])
    assert "--port 8765" in console and "--host 0.0.0.0" in console
    mounts = {m.split(":")[0]: m.split(":")[1] for m in services["prometheus"]["volumes"][:1]}
    assert mounts["./deploy/prometheus"] == "/etc/prometheus"
    grafana = {m.split(":")[0]: m.split(":")[1] for m in services["grafana"]["volumes"]}
    assert grafana["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    assert grafana["./deploy/grafana/dashboards"] == "/var/lib/grafana/dashboards"
    for path in (*mounts, *grafana):
        assert (ROOT / path).is_dir(), path


def finished(run: Run) -> dict[str, Any]:
    return run.step("done", lambda: {"status": "sent"})


@pytest.mark.slow
def test_the_exporter_counts_every_run_of_the_index(deployment: Deployment) -> None:
    journal = deployment.runtime().journal
    for n in range(1050):  # past the thousand the old gauges stopped at
        execute(journal, "digest", f"2026-b{n}", finished)
    port = _free_port()
    exporter = subprocess.Popen(
        [str(ROOT / ".venv" / "bin" / "digest"), "metrics", "--port", str(port)],
        cwd=ROOT,
        env=deployment.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deployment.processes.append(exporter)  # type: ignore[arg-type]
    text = wait_until(lambda: _scrape(port), 30, "the exporter to answer")

    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("journal_runs", (("state", "done"), ("workflow", "digest")))] == 1050
    assert samples[("digest_last_week_done_timestamp_seconds", ())] > 0
    assert samples[("journal_due_lag_seconds", ())] == 0
    assert ("process_resident_memory_bytes", ()) in samples


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            return str(answer.read().decode())
    except OSError:
        return None
