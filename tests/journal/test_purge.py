"""The purge script's guards, on real Redis and on fakeredis: only a settled, ended run goes.

``purge.lua`` deletes a run's keys only when nobody holds it, its meta is as the caller read
it, and its status is one of the ended ones asked for; ``purge_index.lua`` unlists it only if
it is still listed as it was. A purge that deletes a live run's journal makes its next start
repeat every step, paid model calls and sent emails included, so each guard has a test here
that breaks when the guard alone is broken (``tests/mutants.py`` proves they do).
"""

from __future__ import annotations

import pytest
import redis

from journal import Effect, Journal, Run
from journal._clock import millis
from journal._lease import Lease
from journal._redis.backend import Purging
from journal._schema.keys import RunKeys
from journal.ops.actions import PURGEABLE
from tests.conftest import MakeJournal
from tests.support import acquire, as_text, execute


@pytest.fixture
def journal(make_journal: MakeJournal) -> Journal:
    return make_journal(lease_ttl=30)


def failed_run(journal: Journal, run_id: str = "r") -> RunKeys:
    """A run that recorded one step, then failed: ended, unheld, purgeable."""

    def body(run: Run) -> str:
        run.step("fetch", lambda: "items")
        raise RuntimeError("the model refused")

    with pytest.raises(RuntimeError, match="the model refused"):
        execute(journal, "wf", run_id, body)
    keys = journal.keys("wf", run_id)
    assert journal.meta(keys)["status"] == "failed"
    return keys


def stored(store: redis.Redis, keys: RunKeys) -> dict[str, object]:
    """Every key of the run with its content, and its places in the indexes."""
    contents: dict[str, object] = {}
    for key in keys.all():
        kind = as_text(store.type(key))
        if kind == "hash":
            contents[key] = store.hgetall(key)
        elif kind == "string":
            contents[key] = store.get(key)
        else:
            assert kind == "none", f"{key} is a {kind}"
    contents["runs index"] = store.zscore(keys.index.runs, keys.run)
    contents["due index"] = store.zscore(keys.index.due, keys.run)
    return contents


def listed_at(store: redis.Redis, keys: RunKeys) -> float:
    score = store.zscore(keys.index.runs, keys.run)
    assert score is not None
    return score


def test_a_held_run_is_kept_though_its_meta_is_as_read_and_ended(
    journal: Journal, store: redis.Redis
) -> None:
    keys = failed_run(journal)
    # A delivery takes the lease to start the run again; the purge reads the meta after.
    acquire(Lease(keys, journal.backend, 60_000), millis(journal.clock.now()))
    meta = journal.meta(keys)
    assert (meta["status"], store.exists(keys.lease)) == ("failed", 1)
    before = stored(store, keys)

    purged = journal.backend.purge(keys, meta["updated_at"], listed_at(store, keys), PURGEABLE)

    assert purged is Purging.KEPT
    assert stored(store, keys) == before
    assert journal.effect_states(keys) == {}
    assert store.hkeys(keys.steps) == [b"fetch"]


def test_a_run_updated_since_its_meta_was_read_is_kept(
    journal: Journal, store: redis.Redis
) -> None:
    keys = failed_run(journal)
    read = journal.meta(keys)
    # Meanwhile a delivery took the lease (writing the run's meta) and its lease lapsed.
    acquire(Lease(keys, journal.backend, 60_000), int(read["updated_at"]) + 1)
    store.delete(keys.lease)
    assert journal.meta(keys)["status"] == "failed"  # ended still, unheld: only newer
    before = stored(store, keys)

    stale = journal.backend.purge(keys, read["updated_at"], listed_at(store, keys), PURGEABLE)

    assert stale is Purging.KEPT
    assert stored(store, keys) == before
    # Read again, the same run goes: the stale read was the only reason it stayed.
    fresh = journal.meta(keys)["updated_at"]
    assert fresh == str(int(read["updated_at"]) + 1)
    deleted = journal.backend.purge(keys, fresh, listed_at(store, keys), PURGEABLE)
    assert deleted is Purging.DELETED
    assert stored(store, keys) == {"runs index": None, "due index": None}


def test_a_run_that_has_not_ended_is_kept(journal: Journal, store: redis.Redis) -> None:
    def body(run: Run) -> str:
        run.step("fetch", lambda: "items")
        run.sleep("until monday", 3600)
        return "sent"

    assert execute(journal, "wf", "r", body).status == "waiting"
    keys = journal.keys("wf", "r")
    meta = journal.meta(keys)
    assert store.exists(keys.lease) == 0  # unheld, unchanged: only its status says no
    before = stored(store, keys)

    purged = journal.backend.purge(keys, meta["updated_at"], listed_at(store, keys), PURGEABLE)

    assert purged is Purging.KEPT
    assert stored(store, keys) == before


def test_a_done_run_goes_with_its_settled_effect_and_leaves_both_indexes(
    journal: Journal, store: redis.Redis
) -> None:
    def send(effect: Effect) -> str:
        effect.confirm()
        return "message-1"

    def body(run: Run) -> str:
        return run.effect("send", send, timeout=10)

    assert execute(journal, "wf", "r", body).status == "done"
    keys = journal.keys("wf", "r")
    # Its result is a step of a finished run: the claim can stay confirmed, nothing is open.
    assert journal.effect_states(keys) == {"send": "confirmed"}
    store.zadd(keys.index.due, {keys.run: 1})  # as a sweep's re-arm might have left it
    meta = journal.meta(keys)

    purged = journal.backend.purge(keys, meta["updated_at"], listed_at(store, keys), ["done"])

    assert purged is Purging.DELETED
    assert stored(store, keys) == {"runs index": None, "due index": None}


def test_a_purged_run_listed_again_since_stays_listed(journal: Journal, store: redis.Redis) -> None:
    keys = failed_run(journal)
    score = listed_at(store, keys)
    unlist = journal.backend.scripts.purge_index
    index = [keys.index.runs, keys.index.due]
    # Between the keys' deletion and the unlisting, a new start lists the run at a later time.
    store.zadd(keys.index.runs, {keys.run: score + 1000})
    store.zadd(keys.index.due, {keys.run: score + 5000})

    assert unlist(keys=index, args=[keys.run, repr(score)]) == 0
    assert (listed_at(store, keys), store.zscore(keys.index.due, keys.run)) == (
        score + 1000,
        score + 5000,
    )
    assert unlist(keys=index, args=[keys.run, repr(score + 1000)]) == 1
    assert stored(store, keys)["runs index"] is None
    assert stored(store, keys)["due index"] is None
    # Not listed at all, it is unlisted all the same: nothing is left to keep it listed.
    store.zadd(keys.index.due, {keys.run: score})
    assert unlist(keys=index, args=[keys.run, repr(score)]) == 1
    assert store.zscore(keys.index.due, keys.run) is None
