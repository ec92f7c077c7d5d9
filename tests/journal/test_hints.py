"""Errors tell their reader what to do in the application's words, never the library's guess."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import redis

from journal import Hints, Journal, Keyspace
from journal.errors import RunParked, StoreUnavailable
from tests.support import execute


def test_a_journal_without_hints_names_its_own_api() -> None:
    assert str(RunParked("wf:r1", 6)).endswith("reset it deliberately (Journal.reset)")
    down = StoreUnavailable("redis://:secret@db:6379/0", "refused")
    assert str(down) == (
        "cannot reach the journal store at redis://:***@db:6379/0 (refused); "
        "check that the server is running and the journal's URL is right"
    )


def test_the_application_s_hints_reach_the_store_error(tmp_path: Path, prefix: str) -> None:
    gone = redis.Redis(unix_socket_path=str(tmp_path / "nobody.sock"))
    journal = Journal(
        gone, keyspace=Keyspace(prefix), url="unix://nobody", hints=Hints(store_down="run X")
    )
    with pytest.raises(StoreUnavailable) as caught:
        execute(journal, "wf", "r1", lambda run: run.step("a", lambda: 1))
    assert str(caught.value).endswith("; run X")


def test_a_hint_survives_pickling_across_celery() -> None:
    parked = pickle.loads(pickle.dumps(RunParked("wf:r1", 6, "digest run RUN --retry")))
    assert str(parked).endswith("; digest run RUN --retry")
    down = pickle.loads(pickle.dumps(StoreUnavailable("redis://db", "refused", "set REDIS_URL")))
    assert str(down).endswith("; set REDIS_URL")
