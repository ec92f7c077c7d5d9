"""A worker's metrics listen where the console and ``digest metrics`` do: on this host only.

Prometheus counters name runs and models; an address reachable from every network a worker
is on is not a default. ``DIGEST_METRICS_HOST`` says where else to listen.
"""

from __future__ import annotations

from typing import Any

import pytest

from tasks.config import Config
from tasks.worker import signals
from tasks.worker.app import app


class TheDigestsWorker:
    """What Celery's worker_init passes as its sender: the worker, with its app."""

    app = app


def served_on(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> dict[str, Any]:
    """What ``start_http_server`` was asked, by a worker started with ``env``."""
    import prometheus_client

    asked: dict[str, Any] = {}
    monkeypatch.setattr(
        prometheus_client, "start_http_server", lambda port, **kw: asked.update(port=port, **kw)
    )
    monkeypatch.setattr(signals, "settings", lambda: Config.from_env(env))
    signals.serve_metrics(sender=TheDigestsWorker())
    return asked


def test_a_workers_metrics_listen_on_the_loopback_address_by_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    env = {"DIGEST_METRICS_PORT": "9464", "DIGEST_STATE_DIR": str(tmp_path)}
    assert served_on(monkeypatch, env)["addr"] == "127.0.0.1"


def test_the_metrics_address_is_a_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    env = {
        "DIGEST_METRICS_PORT": "9464",
        "DIGEST_METRICS_HOST": "0.0.0.0",
        "DIGEST_STATE_DIR": str(tmp_path),
    }
    assert served_on(monkeypatch, env)["addr"] == "0.0.0.0"
