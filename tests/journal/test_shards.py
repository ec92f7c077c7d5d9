"""The key layouts: one index (today's names, unchanged) and sharded (one slot per shard).

The sharded layout also runs on one server (``shards > 1``), which is how the contract below
runs on fakeredis and real Redis alike; ``test_cluster.py`` runs it on a real cluster.
"""

from __future__ import annotations

from collections import Counter

import fakeredis
import pytest

from journal import Journal, Keyspace, ManualClock, Run
from journal.ops.views import list_runs
from tests.support import execute

T0 = 1_800_000_000.0


def test_one_shard_on_one_server_keeps_the_layout_it_always_had() -> None:
    keyspace = Keyspace("journal")
    keys = keyspace.run("digest", "2026-w42")
    assert not keyspace.sharded and keys.shard is None
    assert keys.steps == "journal:{digest:2026-w42}:steps"
    assert keys.lease == "journal:{digest:2026-w42}:lease"
    assert (keys.index.runs, keys.index.due) == ("journal:runs", "journal:due")
    assert [(i.runs, i.due) for i in keyspace.indexes()] == [("journal:runs", "journal:due")]


@pytest.mark.parametrize("keyspace", [Keyspace("j", shards=4), Keyspace("j", cluster=True)])
def test_a_sharded_run_carries_its_shards_hash_tag_as_its_indexes_do(keyspace: Keyspace) -> None:
    keys = keyspace.run("digest", "2026-w42")
    assert keys.shard is not None and 0 <= keys.shard < keyspace.shards
    tag = f"j:{{s{keys.shard}}}"
    assert keys.steps == f"{tag}:digest:2026-w42:steps"
    assert all(name.startswith(tag + ":") for name in keys.all())
    assert (keys.index.runs, keys.index.due) == (f"{tag}:runs", f"{tag}:due")
    assert keys.index in keyspace.indexes()
    assert keyspace.parse_run("digest:2026-w42") == keys


def test_runs_spread_over_every_shard_and_stay_where_they_were_put() -> None:
    keyspace = Keyspace("j", shards=8)
    shards = Counter(keyspace.run("wf", f"r{n}").shard for n in range(800))
    assert set(shards) == set(range(8))
    assert min(shards.values()) > 60  # about 100 each
    assert keyspace.run("wf", "r7") == Keyspace("j", shards=8).run("wf", "r7")


@pytest.mark.parametrize("shards", [0, 1025])
def test_a_shard_count_out_of_range_is_refused(shards: int) -> None:
    with pytest.raises(ValueError, match="shards"):
        Keyspace("j", shards=shards)


def test_sharded_on_one_server_the_sweep_and_the_listing_see_every_shard() -> None:
    clock = ManualClock(T0)
    journal = Journal(fakeredis.FakeRedis(), keyspace=Keyspace("j", shards=4), clock=clock)

    def napper(run: Run) -> str:
        run.sleep("nap", 10)
        return "after"

    runs = [f"r{n}" for n in range(20)]
    for run_id in runs:
        execute(journal, "wf", run_id, napper)
        clock.advance(1)
    assert len({journal.keys("wf", run_id).shard for run_id in runs}) == 4
    assert [row.run_id for row in list_runs(journal)] == runs[::-1]
    clock.advance(10)
    claimed = journal.claim_due(limit=7) + journal.claim_due(limit=100)
    assert Counter(keys.run_id for keys in claimed) == Counter(runs)
    assert journal.claim_due() == []
    for keys in claimed:
        assert execute(journal, "wf", keys.run_id, napper).status == "done"
    assert {row.state for row in list_runs(journal)} == {"done"}
