import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def service(compose: dict[str, Any], name: str) -> dict[str, Any]:
    found = compose["services"][name]
    assert isinstance(found, dict)
    return found


def argv(svc: dict[str, Any]) -> list[str]:
    command = svc["command"]
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


def environment(svc: dict[str, Any]) -> dict[str, str | None]:
    """Compose accepts a list (`K=V`, or `K` to pass the shell's value through) or a mapping."""
    env = svc["environment"]
    if isinstance(env, dict):
        return {key: None if value is None else str(value) for key, value in env.items()}
    pairs = [entry.split("=", 1) for entry in env]
    return {pair[0]: pair[1] if len(pair) == 2 else None for pair in pairs}


def seconds(duration: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "us": 0.000001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|us|m|s)", duration)
    assert "".join(f"{n}{u}" for n, u in parts) == duration, f"not a duration: {duration!r}"
    return sum(float(n) * units[u] for n, u in parts)


def test_the_stack_is_redis_a_worker_beat_the_console_and_monitoring(
    compose: dict[str, Any],
) -> None:
    assert set(compose["services"]) == {
        "redis",
        "worker",
        "beat",
        "console",
        "prometheus",
        "grafana",
    }


def test_redis_persists_every_write_and_never_evicts(compose: dict[str, Any]) -> None:
    redis = service(compose, "redis")
    assert redis["image"] == "redis:7.4"
    args = argv(redis)
    assert args[0] == "redis-server"
    flags = dict(zip(args[1::2], args[2::2], strict=True))
    assert flags == {
        "--appendonly": "yes",
        "--appendfsync": "always",
        "--maxmemory-policy": "noeviction",
    }


def test_redis_data_lives_in_a_named_volume(compose: dict[str, Any]) -> None:
    mounts = [m.split(":") for m in service(compose, "redis")["volumes"]]
    assert [target for _, target in mounts] == ["/data"]
    assert mounts[0][0] in compose["volumes"]


def test_redis_has_a_healthcheck_and_is_not_published(compose: dict[str, Any]) -> None:
    redis = service(compose, "redis")
    assert redis["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    assert "ports" not in redis


def test_the_worker_runs_four_slots_against_the_compose_redis(compose: dict[str, Any]) -> None:
    worker = service(compose, "worker")
    assert worker["build"] == "."
    assert argv(worker) == [
        "celery",
        "-A",
        "tasks",
        "worker",
        "--loglevel=INFO",
        "--concurrency=4",
        "-E",  # task events, for Flower
    ]
    env = environment(worker)
    assert env["REDIS_URL"] == "redis://redis:6379/0"
    # Passed through from the shell, never written into the file.
    assert "ANTHROPIC_API_KEY" in env
    assert env["ANTHROPIC_API_KEY"] is None


def test_the_worker_stops_softly_before_the_grace_period_ends(compose: dict[str, Any]) -> None:
    worker = service(compose, "worker")
    env = environment(worker)
    assert env["REMAP_SIGTERM"] == "SIGQUIT"
    soft = float(env["DIGEST_SOFT_SHUTDOWN_TIMEOUT"] or 0)
    grace = worker["stop_grace_period"]
    assert grace.endswith("m")
    assert 0 < soft <= float(grace[:-1]) * 60 - 10  # the worker exits before Docker kills it


def test_beat_runs_celery_beat_against_the_same_redis(compose: dict[str, Any]) -> None:
    beat = service(compose, "beat")
    assert beat["build"] == "."
    assert argv(beat)[:4] == ["celery", "-A", "tasks", "beat"]
    assert environment(beat)["REDIS_URL"] == environment(service(compose, "worker"))["REDIS_URL"]


@pytest.mark.parametrize("name", ["worker", "beat"])
def test_celery_waits_for_a_healthy_redis(compose: dict[str, Any], name: str) -> None:
    assert service(compose, name)["depends_on"] == {"redis": {"condition": "service_healthy"}}


def test_the_worker_gets_time_for_a_warm_shutdown(compose: dict[str, Any]) -> None:
    # Docker's default of 10 s would kill most digests in the middle of a model call.
    assert seconds(service(compose, "worker")["stop_grace_period"]) >= 60


def test_every_named_volume_is_declared(compose: dict[str, Any]) -> None:
    used = {
        mount.split(":")[0]
        for svc in compose["services"].values()
        for mount in svc.get("volumes", [])
        if not mount.startswith((".", "/"))
    }
    assert used == set(compose["volumes"]) == {"redis-data", "digest-state", "prometheus-data"}


def test_the_dockerfile_installs_the_package_on_python_312_as_a_non_root_user() -> None:
    lines = [
        line.strip()
        for line in (REPO / "Dockerfile").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert lines[0] == "FROM python:3.12-slim"
    assert "RUN pip install ." in lines
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users == ["digest"]


def test_everything_the_dockerfile_copies_exists() -> None:
    sources = [
        source
        for line in (REPO / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY ")
        for source in line.split()[1:-1]
    ]
    assert sources == ["pyproject.toml", "README.md", "journal", "tasks", "data"]
    missing = [source for source in sources if not (REPO / source).exists()]
    assert missing == []
