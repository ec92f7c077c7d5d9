"""The Celery app ``bench/throughput.py`` runs its workers on: three tasks, one set of settings.

    celery -A bench.throughput_app worker     # with BENCH_REDIS_URL and BENCH_PREFIX set

- ``bench.noop``: returns at once; the queue's floor.
- ``bench.hand``: a minimal hand-written fenced journal of 10 steps: one acquire script
  (``SET NX PX`` and an ``INCR`` fence), ten fenced ``HSETNX`` scripts, one release.
- ``bench.durable``: the same 10 steps through ``journal.integrations.celery``.

Every task gets the same settings (``at_least_once_settings``, the same broker and result
backend, results kept), so the only difference between them is what each does per run.
"""

from __future__ import annotations

import functools
import os
import secrets
from collections.abc import Callable
from typing import Any

import orjson
import redis
from celery import Celery

from journal import Journal, Keyspace, Run, workflow
from journal.integrations.celery import Durable, at_least_once_settings

STEPS = 10
URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
BROKER = os.environ.get("BENCH_BROKER_URL", URL)  # kombu spells a unix socket its own way
PREFIX = os.environ.get("BENCH_PREFIX", "bench")

app = Celery("bench", broker=BROKER, backend=BROKER)
app.conf.update(
    at_least_once_settings(visibility_timeout=3600, task_time_limit=600),
    task_ignore_result=False,
    worker_hijack_root_logger=False,
)

ACQUIRE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return 0
"""
RECORD = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return -1
end
return redis.call('HSETNX', KEYS[2], ARGV[2], ARGV[3])
"""
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


@functools.cache
def client() -> redis.Redis:
    """This process's client, made after the pool forked."""
    return redis.Redis.from_url(URL)


@functools.cache
def hand_scripts() -> tuple[Any, Any, Any]:
    """The hand-written journal's three scripts, registered once per process."""
    c = client()
    return c.register_script(ACQUIRE), c.register_script(RECORD), c.register_script(RELEASE)


@functools.cache
def journal() -> Journal:
    """This process's journal."""
    return Journal(client(), keyspace=Keyspace(PREFIX))


@app.task(name="bench.noop")
def noop(run_id: str) -> str:
    """Nothing: what the queue costs by itself."""
    return run_id


@app.task(name="bench.hand")
def hand(run_id: str) -> int:
    """Ten fenced records under a lease, written by hand, with no replay and no indexes."""
    acquire, record, release = hand_scripts()
    lease, fence, steps = (f"{PREFIX}:hand:{{{run_id}}}:{part}" for part in ("l", "f", "s"))
    token = secrets.token_hex(8)
    held = int(acquire(keys=[lease, fence], args=[token, 30_000]))
    if not held:
        raise RuntimeError(f"{run_id} is held")
    for i in range(STEPS):
        data = orjson.dumps({"result": i, "seq": i + 1, "fence": held})
        if int(record(keys=[lease, steps], args=[token, f"s{i}", data])) < 0:
            raise RuntimeError(f"{run_id}: lease lost")
    release(keys=[lease], args=[token])
    return STEPS


def returning(value: int) -> Callable[[], int]:
    """A step body that returns ``value``; a lambda made in a loop would see the last value."""
    return lambda: value


durable = Durable(app, journal)


@workflow("bench")
def ten_steps(run: Run) -> int:
    """The same ten steps through the journal: replayable, indexed, fenced."""
    for i in range(STEPS):
        run.step(f"s{i}", returning(i))
    return STEPS


durable.register(ten_steps, task_name="bench.durable")
