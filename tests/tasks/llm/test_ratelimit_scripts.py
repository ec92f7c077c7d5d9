"""The rate-limit scripts' contracts, on real Redis and on fakeredis.

``ratelimit_reserve.lua`` lets one probing call through while nothing is learned, honours a
429's hold, and takes a call from each learned (or operator-set) token bucket only when every
bucket has room; ``ratelimit_settle.lua`` gives back what a call did not use (everything, for a
429), learns each limit the headers state, and keeps the averages the next estimate uses.
Replies and fields are asserted exactly; where the server's clock enters (the script reads
``TIME``), between the server's time read just before and just after the call. Nothing waits.
"""

from __future__ import annotations

import math

import pytest
import redis
from redis.typing import EncodableT, FieldT

from tasks.llm.ratelimit import KEEP_MS, PROBE_MS
from tasks.scripts import script
from tests.support import as_text

BLANK = ("", "", "")


@pytest.fixture
def limits(prefix: str) -> str:
    return f"{prefix}:limits"


# Lua writes a number with 14 significant digits: an instant in ms keeps a tenth of one, so
# a probe stamped within 50 us of ``before`` may read up to 0.05 ms under it.
LUA_ROUNDING = 0.1


def server_ms(store: redis.Redis) -> float:
    seconds, micros = store.time()
    return int(seconds) * 1000 + int(micros) / 1000


def numbers(store: redis.Redis, key: str) -> dict[str, float]:
    return {as_text(k): float(v) for k, v in store.hgetall(key).items()}


def reserve(
    store: redis.Redis,
    key: str,
    tokens: int,
    max_tokens: int,
    overrides: tuple[int, ...] = (0,) * 3,
) -> list[int]:
    reply = script(store, "ratelimit_reserve")(
        keys=[key], args=[tokens, max_tokens, PROBE_MS, KEEP_MS, *overrides]
    )
    return [int(part) for part in reply]


def learned(store: redis.Redis, key: str, now: float, **fields: float) -> None:
    """A hash settled before: requests 60/min, input and output 60000/min, buckets full."""
    mapping: dict[FieldT, EncodableT] = {
        "learned": 1,
        "requests:cap": 60,
        "requests:rate": 0.001,
        "requests:tat": now - 120_000,
        "input:cap": 60_000,
        "input:rate": 1,
        "input:tat": now - 120_000,
        "output:cap": 60_000,
        "output:rate": 1,
        "output:tat": now - 120_000,
    }
    mapping.update(fields)
    store.hset(key, mapping=mapping)


def test_while_nothing_is_learned_one_call_probes_and_the_next_waits_for_it(
    store: redis.Redis, limits: str
) -> None:
    before = server_ms(store)
    assert reserve(store, limits, 100, 1000) == [1, 0, 100, 1000, 1]  # the probe
    probe = numbers(store, limits)["probe"]
    assert before + PROBE_MS - LUA_ROUNDING <= probe <= server_ms(store) + PROBE_MS
    assert 0 < store.pttl(limits) <= KEEP_MS

    status, wait, holds = reserve(store, limits, 100, 1000)
    assert (status, wait) == (0, 50)  # asks again soon, not in 10 s
    assert PROBE_MS - 1000 < holds <= PROBE_MS  # unless its own process hears the probe end
    assert numbers(store, limits) == {"probe": probe}

    store.hset(limits, "probe", server_ms(store) - 1)  # the probing call died unsettled
    before = server_ms(store)
    assert reserve(store, limits, 100, 1000) == [1, 0, 100, 1000, 1]
    assert numbers(store, limits)["probe"] >= before + PROBE_MS - LUA_ROUNDING


def test_a_429s_hold_stops_every_call_until_it_ends(store: redis.Redis, limits: str) -> None:
    now = server_ms(store)
    learned(store, limits, now, hold=now + 60_000)
    before = numbers(store, limits)

    [status, wait] = reserve(store, limits, 100, 1000)

    assert status == 0
    assert now + 60_000 - server_ms(store) <= wait <= 60_000
    assert numbers(store, limits) == before

    store.hset(limits, "hold", server_ms(store) - 1)
    assert reserve(store, limits, 100, 1000) == [1, 0, 100, 1000]


def test_a_call_is_taken_from_every_learned_bucket_scaled_by_what_calls_used(
    store: redis.Redis, limits: str
) -> None:
    now = server_ms(store)
    learned(store, limits, now, **{"input:ratio": 1.5, "output:avg": 100.2})
    before = server_ms(store)

    assert reserve(store, limits, 100, 1000) == [1, 0, 150, 101]

    after = server_ms(store)
    state = numbers(store, limits)
    # Each bucket's time moves from now by what the call takes, at its rate.
    for kind, taken in (("requests", 1000), ("input", 150), ("output", 101)):
        assert before + taken <= state.pop(f"{kind}:tat") <= after + taken, kind
    assert state == {
        "learned": 1,
        "requests:cap": 60,
        "requests:rate": 0.001,
        "input:cap": 60_000,
        "input:rate": 1,
        "output:cap": 60_000,
        "output:rate": 1,
        "input:ratio": 1.5,
        "output:avg": 100.2,
    }


def test_a_call_waits_for_the_one_bucket_without_room_and_takes_nothing(
    store: redis.Redis, limits: str
) -> None:
    now = server_ms(store)
    # A minute's 60 requests spent ahead: the next one fits when one refills, in a second.
    learned(store, limits, now, **{"requests:tat": now + 60_000})
    before = numbers(store, limits)

    [status, wait] = reserve(store, limits, 100, 1000)

    assert status == 0
    assert math.floor(now + 1000 - server_ms(store)) <= wait <= 1000
    assert numbers(store, limits) == before


def test_an_operators_limit_is_a_bucket_of_its_own_though_nothing_is_learned(
    store: redis.Redis, limits: str
) -> None:
    before = server_ms(store)
    assert reserve(store, limits, 100, 1000, overrides=(1, 0, 0)) == [1, 0, 100, 1000]
    state = numbers(store, limits)
    assert list(state) == ["requests:tat"]  # no probe: the operator said what the limit is
    assert before + 60_000 <= state["requests:tat"] <= server_ms(store) + 60_000

    [status, wait] = reserve(store, limits, 100, 1000, overrides=(1, 0, 0))
    assert status == 0
    assert 59_000 < wait <= 60_000
    # The learned limits do not count when the operator set one: a fuller learned bucket.
    learned(store, limits, before, **{"requests:tat": before + 120_000})
    store.hdel(limits, "requests:cap", "requests:rate")
    store.hset(limits, "requests:tat", server_ms(store) - 120_000)
    assert reserve(store, limits, 100, 1000, overrides=(1, 0, 0))[0] == 1


def settle(
    store: redis.Redis,
    key: str,
    *,
    taken: tuple[int, int] = (100, 1000),
    used: tuple[int, int] | None = None,
    refused: bool = False,
    headers: tuple[str, ...] = BLANK * 3,
    hold: str = "",
    estimated: int = 80,
) -> None:
    args = [
        taken[0],
        "" if used is None else used[0],
        taken[1],
        "" if used is None else used[1],
        int(refused),
        *headers,
        hold,
        estimated,
        5,
        int(refused),
        KEEP_MS,
    ]
    assert script(store, "ratelimit_settle")(keys=[key], args=args) == 1


COUNTED = {"learned": 1, "calls": 1, "waited_ms": 5}


def test_an_answered_call_gives_back_what_it_did_not_use_and_is_learned_from(
    store: redis.Redis, limits: str
) -> None:
    store.hset(
        limits,
        mapping={
            "requests:rate": 0.001,
            "requests:tat": 500_000,
            "input:rate": 2,
            "input:tat": 500_000,
            "probe": 1,
        },
    )  # output never learned: nothing to give back to it

    settle(store, limits, taken=(100, 1000), used=(40, 200), estimated=80)

    assert numbers(store, limits) == {
        **COUNTED,
        "refused": 0,
        "requests:rate": 0.001,
        "requests:tat": 500_000,  # the request counted
        "input:rate": 2,
        "input:tat": 500_000 - 60 / 2,
        "input:ratio": 0.5,
        "output:avg": 200,
    }


def test_an_answered_call_gives_back_the_output_it_did_not_write(
    store: redis.Redis, limits: str
) -> None:
    now = server_ms(store)
    learned(
        store, limits, now, **{f"{kind}:tat": 500_000 for kind in ("requests", "input", "output")}
    )

    settle(store, limits, taken=(100, 1000), used=(100, 250))

    state = numbers(store, limits)
    assert {kind: state[f"{kind}:tat"] for kind in ("requests", "input", "output")} == {
        "requests": 500_000,
        "input": 500_000,  # it used what it took
        "output": 500_000 - 750,
    }
    assert (state["refused"], state["calls"], state["output:avg"]) == (0, 1, 250)


def test_a_refused_call_gives_everything_back_and_learns_no_usage(
    store: redis.Redis, limits: str
) -> None:
    now = server_ms(store)
    learned(
        store, limits, now, **{f"{kind}:tat": 500_000 for kind in ("requests", "input", "output")}
    )

    settle(store, limits, taken=(100, 1000), refused=True)

    state = numbers(store, limits)
    assert {kind: state[f"{kind}:tat"] for kind in ("requests", "input", "output")} == {
        "requests": 500_000 - 1 / 0.001,
        "input": 500_000 - 100,
        "output": 500_000 - 1000,
    }
    assert (state["refused"], state["calls"]) == (1, 1)
    assert "input:ratio" not in state
    assert "output:avg" not in state


def test_a_failed_call_gives_nothing_back(store: redis.Redis, limits: str) -> None:
    now = server_ms(store)
    learned(
        store, limits, now, **{f"{kind}:tat": 500_000 for kind in ("requests", "input", "output")}
    )
    before = numbers(store, limits)

    settle(store, limits, taken=(100, 1000))  # no answer, not refused: it may have counted

    assert numbers(store, limits) == {**before, **COUNTED, "refused": 0}


def test_the_limits_the_headers_state_are_learned_and_a_hold_kept(
    store: redis.Redis, limits: str
) -> None:
    reset = int(server_ms(store)) - 1000  # past: the bucket is what remains
    settle(
        store,
        limits,
        used=(40, 200),
        estimated=0,
        headers=("60", "10", str(reset), *BLANK, *BLANK),
        hold="9000000000000",
    )

    assert numbers(store, limits) == {
        **COUNTED,
        "refused": 0,
        "requests:rate": 0.001,
        "requests:cap": 10,
        "requests:tat": reset,
        "requests:limit": 60,
        "requests:remaining": 10,
        "requests:reset": reset,
        "hold": 9_000_000_000_000,
        "output:avg": 200,
    }
