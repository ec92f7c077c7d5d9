"""Run ids are checked before any key is built, and a run's keys share one cluster slot."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis
from redis.crc import key_slot

from journal import Journal, Run
from journal.errors import InvalidRunId
from tests.conftest import MakeJournal
from tests.support import execute

INVALID = {
    "": "it is empty",
    "x" * 200: "it is 200 characters long",
    "x" * 129: "it is 129 characters long",
    "a{b}": "it contains '{'",
    "a}b": "it contains '}'",
    "../x": "it must not start with '..'",
    "..": "it must not start with '..'",
    "a/b": "it contains '/'",
    "a\nb": "it contains '\\n'",
    "2026-w42\n": "it contains '\\n'",
    "2026 w42": "it contains ' '",
    "café": "it contains 'é'",
    "\uff12\uff10\uff12\uff16": "it contains '\uff12'",  # fullwidth digits are not 0-9
}

VALID = ["2026-w42", "a.b_c-1", "x" * 128, "A", "a..b"]


def keys_under(store: redis.Redis, prefix: str) -> list[bytes]:
    return sorted(store.scan_iter(match=f"{prefix}:*", count=1000))


def every_entry_point(journal: Journal, run_id: str) -> list[str]:
    """Call each public operation that takes a run id; return the ones that did not refuse."""
    calls: dict[str, Callable[[], object]] = {
        "execute": lambda: execute(journal, "digest", run_id, lambda run: run.step("x", int)),
        "keys": lambda: journal.keys("digest", run_id),
        "reset": lambda: journal.reset("digest", run_id),
        "delete": lambda: journal.delete("digest", run_id),
        "send_signal": lambda: journal.send_signal("digest", run_id, "approve", {"ok": True}),
    }
    accepted = []
    for name, call in calls.items():
        try:
            call()
        except InvalidRunId:
            continue
        accepted.append(name)
    return accepted


@pytest.mark.parametrize("run_id", list(INVALID), ids=repr)
def test_an_invalid_run_id_is_refused_before_any_key_exists(
    make_journal: MakeJournal, store: redis.Redis, prefix: str, run_id: str
) -> None:
    journal = make_journal()
    assert every_entry_point(journal, run_id) == []
    assert keys_under(store, prefix) == []


@pytest.mark.parametrize("run_id", list(INVALID), ids=repr)
def test_the_refusal_is_one_line_naming_the_problem(make_journal: MakeJournal, run_id: str) -> None:
    journal = make_journal()
    body_ran: list[Run] = []
    with pytest.raises(InvalidRunId) as info:
        execute(journal, "digest", run_id, body_ran.append)
    message = str(info.value)
    assert body_ran == []
    assert "\n" not in message
    assert INVALID[run_id] in message
    assert message.startswith("invalid run id ")
    assert message.endswith("(for example 2026-w42)")
    assert len(message) < 200  # a 200-character id is cut, not echoed whole


def test_a_non_string_run_id_is_refused_too(make_journal: MakeJournal) -> None:
    with pytest.raises(InvalidRunId, match="it must be a string"):
        # The wrong type is the point: callers without a type checker pass anything.
        execute(make_journal(), "digest", 2026, lambda run: None)  # type: ignore[arg-type]


@pytest.mark.parametrize("run_id", VALID, ids=lambda r: r if len(r) < 20 else f"{len(r)} chars")
def test_a_valid_run_id_is_accepted_and_keyed_by_itself(
    make_journal: MakeJournal, store: redis.Redis, prefix: str, run_id: str
) -> None:
    journal = make_journal()
    outcome = execute(journal, "digest", run_id, lambda run: run.step("x", lambda: run.run_id))
    assert (outcome.status, outcome.result, outcome.run) == ("done", run_id, f"digest:{run_id}")
    assert store.hget(f"{prefix}:{{digest:{run_id}}}:steps", "x") is not None


def hash_tag(key: str) -> str:
    """The part of a key Redis Cluster hashes: the text between the first '{' and the next '}'."""
    start = key.index("{")
    end = key.index("}", start + 1)
    assert end > start + 1, f"{key!r} has an empty hash tag, so the whole key is hashed"
    return key[start + 1 : end]


def test_every_key_a_run_creates_shares_its_hash_tag_and_slot(
    make_journal: MakeJournal, store: redis.Redis, prefix: str
) -> None:
    journal = make_journal()
    seen: set[bytes] = set()

    def body(run: Run) -> str:
        def select() -> str:
            run._guard.confirm()  # a renewal, as the beat makes one, publishes it in flight
            seen.update(keys_under(store, prefix))
            return "items"

        result = run.step("select", select)
        run.effect("send", lambda effect: effect.confirm(), timeout=5)
        seen.update(keys_under(store, prefix))  # lease and fence exist only while running
        return result

    execute(journal, "digest", "2026-w42", body)
    journal.send_signal("digest", "2026-w42", "approve", {"by": "ops"})
    seen.update(keys_under(store, prefix))
    indexes = {f"{prefix}:runs", f"{prefix}:due"}
    seen_names = {key.decode() for key in seen}
    run_keys = seen_names - indexes
    assert seen_names & indexes == indexes  # the only keys outside the run's slot
    keys = journal.keys("digest", "2026-w42")
    assert run_keys == set(keys.all()) - {keys.usage}  # the application's hash, unused here
    assert {hash_tag(key) for key in run_keys} == {"digest:2026-w42"}
    assert {key_slot(key.encode()) for key in run_keys} == {key_slot(b"digest:2026-w42")}


def test_the_key_layout_is_the_documented_one(make_journal: MakeJournal, prefix: str) -> None:
    keys = make_journal().keys("digest", "2026-w42")
    tagged = f"{prefix}:{{digest:2026-w42}}"
    assert keys.all() == (
        f"{tagged}:steps",
        f"{tagged}:meta",
        f"{tagged}:lease",
        f"{tagged}:flight",
        f"{tagged}:fence",
        f"{tagged}:signals",
        f"{tagged}:effects",
        f"{tagged}:usage",
    )
    assert len({key_slot(key.encode()) for key in keys.all()}) == 1


def test_runs_with_different_ids_land_on_their_own_tags(make_journal: MakeJournal) -> None:
    journal = make_journal()
    tags = {hash_tag(journal.keys("digest", run_id).steps) for run_id in ["2026-w42", "2026-w43"]}
    assert tags == {"digest:2026-w42", "digest:2026-w43"}
