"""The budget and item-claim scripts' contracts, on real Redis and on fakeredis.

``budget_reserve.lua`` adds a call's hold only if the spend, every live hold but its own and
the call fit the budget; ``budget_settle.lua`` turns a step's batch holds into spend once;
``claim_items.lua`` claims unseen, unheld items and, previewing, claims none. Each reply and
each field written is asserted exactly: a flipped comparison in any of them changes one
(``tests/mutants.py`` breaks each in turn). Lapsing is tested with expiries set either side of
the server's own clock, never by waiting.
"""

from __future__ import annotations

import pytest
import redis

from tasks.scripts import script
from tests.support import as_text, server_ms

BUDGET = 1000


@pytest.fixture
def usage(prefix: str) -> str:
    return f"{prefix}:usage"


def fields(store: redis.Redis, key: str) -> dict[str, str]:
    return {as_text(k): as_text(v) for k, v in store.hgetall(key).items()}


HOLDER = '{"pid":7}'  # the reserving process, as the script keeps it: opaque to it


def reserve(
    store: redis.Redis,
    usage: str,
    hold: str,
    amount: int,
    seed: str = "",
    gone: tuple[str, ...] = (),
) -> list[int]:
    args: list[str | int] = [hold, amount, BUDGET, 60_000, seed, HOLDER, *gone]
    reply = script(store, "budget_reserve")(keys=[usage], args=args)
    return [int(part) for part in reply]


def test_an_unknown_spend_is_asked_for_and_nothing_is_written(
    store: redis.Redis, usage: str
) -> None:
    assert reserve(store, usage, "a", 10) == [-2, 0, 0]
    assert store.exists(usage) == 0
    # Seeded with the journal's spend, the hash starts from it and the call is held.
    assert reserve(store, usage, "a", 10, seed="300") == [1, 300, 10]
    assert sorted(fields(store, usage)) == ["r:a", "spent"]
    assert fields(store, usage)["spent"] == "300"
    # Known from then on, the seed is not needed (and not taken over the stored spend).
    assert reserve(store, usage, "b", 20, seed="999") == [1, 300, 30]
    assert fields(store, usage)["spent"] == "300"


def test_live_holds_but_the_callers_own_count_and_lapsed_ones_go(
    store: redis.Redis, usage: str
) -> None:
    now = server_ms(store)
    store.hset(
        usage,
        mapping={
            "spent": 100,
            "r:live": f"200:{now + 60_000}",
            "r:lapsed": f"400:{now - 1}",
            "r:mine": f"50:{now + 60_000}",  # replaced by this reservation, not added to
            "settled:step-1": 1,  # not a hold
        },
    )

    assert reserve(store, usage, "mine", 70) == [1, 100, 270]

    held = fields(store, usage)
    assert sorted(held) == ["r:live", "r:mine", "settled:step-1", "spent"]
    assert held["r:live"] == f"200:{now + 60_000}"
    amount, expiry, holder = held["r:mine"].split(":", 2)
    assert (amount, holder) == ("70", HOLDER)
    assert now + 60_000 <= int(expiry) <= server_ms(store) + 60_000


def test_holds_proved_gone_go_whatever_their_expiry_and_only_with_the_value_read(
    store: redis.Redis, usage: str
) -> None:
    later = server_ms(store) + 60_000
    dead, live = f'300:{later}:{{"pid":1}}', f'200:{later}:{{"pid":2}}'
    store.hset(usage, mapping={"spent": 500, "r:dead": dead, "r:live": live})

    # Proved gone, but under a value no hold has any more (taken over meanwhile): it stays.
    assert reserve(store, usage, "call", 301, gone=(f'300:{later}:{{"pid":3}}',)) == [0, 500, 500]
    assert sorted(fields(store, usage)) == ["r:dead", "r:live", "spent"]
    # With the value read, the dead hold's money comes back and the call is held at once.
    assert reserve(store, usage, "call", 300, gone=(dead,)) == [1, 500, 500]
    assert sorted(fields(store, usage)) == ["r:call", "r:live", "spent"]
    assert fields(store, usage)["r:live"] == live


def test_a_call_that_fits_only_once_holds_settle_waits_and_one_that_never_fits_stops(
    store: redis.Redis, usage: str
) -> None:
    now = server_ms(store)
    store.hset(usage, mapping={"spent": 500, "r:other": f"300:{now + 60_000}"})

    assert reserve(store, usage, "fits", 200) == [1, 500, 500]  # 500 + 300 + 200: exactly
    assert reserve(store, usage, "waits", 1) == [0, 500, 500]  # only if holds settle for less
    assert reserve(store, usage, "never", 501) == [-1, 500, 500]  # not even if they are free
    assert sorted(fields(store, usage)) == ["r:fits", "r:other", "spent"]


def settle(store: redis.Redis, usage: str, name: str, prefix: str, cost: int) -> int:
    return int(script(store, "budget_settle")(keys=[usage], args=[name, prefix, cost]))


def test_a_steps_batch_holds_become_spend_once(store: redis.Redis, usage: str) -> None:
    store.hset(
        usage,
        mapping={
            "spent": 100,
            "r:batch-summaries-1": "300:9999999999999",
            "r:batch-summaries-2": "200:9999999999999",
            "r:batch-other-1": "50:9999999999999",
            "r:call": "10:9999999999999",
        },
    )

    assert settle(store, usage, "summaries", "batch-summaries-", 120) == 1
    after = {
        "spent": "220",
        "r:batch-other-1": "50:9999999999999",
        "r:call": "10:9999999999999",
        "settled:summaries": "1",
    }
    assert fields(store, usage) == after
    # Again (a replay), and nothing changes: the batch is paid for once.
    assert settle(store, usage, "summaries", "batch-summaries-", 120) == 0
    assert fields(store, usage) == after


def test_a_settled_step_is_not_settled_again_though_it_holds_again(
    store: redis.Redis, usage: str
) -> None:
    store.hset(usage, mapping={"spent": 100, "r:batch-summaries-1": "300:9999999999999"})
    assert settle(store, usage, "summaries", "batch-summaries-", 120) == 1
    # A resumed run reserves the step's batch again before it finds the batch's results.
    store.hset(usage, "r:batch-summaries-1", "300:9999999999999")
    again = fields(store, usage)

    assert settle(store, usage, "summaries", "batch-summaries-", 120) == 0

    assert fields(store, usage) == again  # counted once: the spend stays at 220
    assert again["spent"] == "220"


def test_no_hold_to_settle_counts_nothing_and_marks_nothing(store: redis.Redis, usage: str) -> None:
    store.hset(usage, mapping={"spent": 100, "r:call": "10:9999999999999"})

    assert settle(store, usage, "summaries", "batch-summaries-", 120) == 0

    assert fields(store, usage) == {"spent": "100", "r:call": "10:9999999999999"}


def claim(store: redis.Redis, prefix: str, claimant: str, *ids: str, mine: bool) -> list[object]:
    reply = script(store, "claim_items")(
        keys=[f"{prefix}:seen", f"{prefix}:claims"], args=[claimant, "1" if mine else "0", *ids]
    )
    return [part.decode() if isinstance(part, bytes) else part for part in reply]


def test_unseen_unheld_items_are_claimed_and_the_rest_answered_as_they_are(
    store: redis.Redis, prefix: str
) -> None:
    store.sadd(f"{prefix}:seen", "old")
    store.hset(f"{prefix}:claims", "taken", "digest:w40")

    assert claim(store, prefix, "digest:w41", "old", "taken", "new", mine=True) == [
        0,
        "digest:w40",
        "digest:w41",
    ]
    assert fields(store, f"{prefix}:claims") == {"taken": "digest:w40", "new": "digest:w41"}


def test_a_preview_claims_nothing(store: redis.Redis, prefix: str) -> None:
    store.sadd(f"{prefix}:seen", "old")
    store.hset(f"{prefix}:claims", "taken", "digest:w40")

    assert claim(store, prefix, "digest:w41", "old", "taken", "new", mine=False) == [
        0,
        "digest:w40",
        None,
    ]
    assert fields(store, f"{prefix}:claims") == {"taken": "digest:w40"}
