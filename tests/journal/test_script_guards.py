"""Guards of the run and effect scripts no other fast test could tell broken, on both backends.

Each test here kills a mutant of ``tests/mutants.py`` that survived the rest of the fast
suite: a close that only deletes fields, a lease taken alone on an ended or parked run, a
corrupt delivery counter, the meta a start reads back, a live claim not yet confirmed, an
ambiguous effect's reason, a confirmation of no claim, an operator's decision on a claim
abandoned while confirmed, a release that leaves a reason behind, and a zombie claimant's
receipt for what a later holder found ambiguous. Each asserts the script's exact reply and
what it left stored.
"""

from __future__ import annotations

import dataclasses

import pytest
import redis

from journal import Journal
from journal._lease import Grant, Lease
from journal._redis.backend import (
    DELETE,
    Claimant,
    Closed,
    Closing,
    Confirming,
    Decided,
    EffectClaimed,
    EffectTerms,
    Opening,
    Renewed,
    Settled,
)
from journal._schema.keys import RunKeys
from journal.errors import CorruptJournal
from tests.conftest import MakeJournal
from tests.support import acquire, as_text, execute, server_ms

LIVE = 9_999_999_999_999  # a deadline no test outlives
PAST = 1  # a deadline long gone
TERMS = EffectTerms(claim_ms=60_000, repeatable=False, unknown="the reply never came")


@pytest.fixture
def journal(make_journal: MakeJournal) -> Journal:
    return make_journal(lease_ttl=30)


@pytest.fixture
def keys(journal: Journal) -> RunKeys:
    return journal.keys("wf", "r")


def hash_of(store: redis.Redis, key: str) -> dict[str, str]:
    return {as_text(k): as_text(v) for k, v in store.hgetall(key).items()}


def take(journal: Journal, keys: RunKeys) -> Grant:
    """The lease, taken alone by a new holder (with the next fence)."""
    return acquire(Lease(keys, journal.backend, 60_000), 1000)


def test_a_close_that_only_deletes_fields_deletes_them_and_gives_the_lease_back(
    journal: Journal, store: redis.Redis, keys: RunKeys
) -> None:
    grant = take(journal, keys)
    store.hset(keys.meta, mapping={"wait": "{}", "retry_at": "5"})
    store.hset(keys.flight, "a", "1000")  # published by the holder's last renewal

    closed = journal.backend.close(keys, grant.holder, Closing({"wait": DELETE}, 2000))

    assert closed is Closed.CLOSED
    meta = hash_of(store, keys.meta)
    assert "wait" not in meta
    assert meta["retry_at"] == "5"
    assert store.exists(keys.lease) == 0
    assert store.exists(keys.flight) == 0  # given back: no step is in flight any more
    assert store.zscore(keys.index.runs, keys.run) == 2000
    assert store.zscore(keys.index.due, keys.run) is None


@pytest.mark.parametrize("state", [{"status": "done"}, {"status": "failed", "parked": "1"}])
def test_the_lease_alone_is_taken_whatever_the_run_is(
    journal: Journal, store: redis.Redis, keys: RunKeys, state: dict[str, str]
) -> None:
    for name, value in {**state, "wait": "not a wait"}.items():  # an opening would refuse it
        store.hset(keys.meta, name, value)

    grant = take(journal, keys)

    assert (grant.fence, grant.meta, grant.steps) == (1, [], [])
    assert as_text(store.get(keys.lease)) == grant.holder
    assert hash_of(store, keys.meta)["status"] == state["status"]


def test_a_delivery_counter_that_is_not_an_integer_is_refused_before_anything_starts(
    journal: Journal, store: redis.Redis, keys: RunKeys
) -> None:
    store.hset(keys.meta, mapping={"deliveries": "two", "status": "waiting"})
    ran: list[str] = []

    with pytest.raises(CorruptJournal) as refused:
        execute(journal, "wf", "r", lambda run: ran.append("body"), delivered=True)

    assert refused.value.field == "meta.deliveries"
    assert ran == []
    assert store.exists(keys.lease) == 0
    assert hash_of(store, keys.meta) == {"deliveries": "two", "status": "waiting"}


def test_a_start_reads_back_only_the_meta_fields_its_caller_reads(
    journal: Journal, store: redis.Redis, keys: RunKeys
) -> None:
    store.hset(
        keys.meta,
        mapping={
            "args": '{"week":42}',
            "created_at": "500",
            "status": "failed",
            "last_error": "plain ascii",
            "note": "caf\u00e9",  # not ASCII: read back, for the caller to check it is UTF-8
        },
    )
    opening = Opening(max_stalled_starts=5, due_at_ms=LIVE, args=None)

    grant = Lease(keys, journal.backend, 60_000).open(1000, opening)

    assert isinstance(grant, Grant)
    pairs = dict(zip(grant.meta[::2], grant.meta[1::2], strict=True))
    assert pairs == {
        b"args": b'{"week":42}',
        b"created_at": b"500",
        b"note": "caf\u00e9".encode(),
    }


def test_a_live_claim_an_earlier_holder_has_not_confirmed_yet_is_waited_for(
    journal: Journal, store: redis.Redis, keys: RunKeys
) -> None:
    first = take(journal, keys)
    claimed = journal.backend.effect_claim(keys, "send", Claimant(first.holder, 1, "p1"), TERMS)
    assert claimed.status is EffectClaimed.CLAIMED
    store.delete(keys.lease)  # the first holder's lease lapsed, its claim did not
    second = take(journal, keys)
    before = hash_of(store, keys.effects)

    waits = journal.backend.effect_claim(keys, "send", Claimant(second.holder, 2, "p2"), TERMS)

    assert waits.status is EffectClaimed.CLAIMED_BY_EARLIER
    assert 0 < waits.remaining_ms <= 60_000
    assert as_text(waits.process) == "p1"
    assert before["send"] == f"1:{waits.deadline}:claimed"
    assert hash_of(store, keys.effects) == before


def test_an_ambiguous_effect_keeps_the_reason_it_was_found_with(
    journal: Journal, store: redis.Redis, keys: RunKeys
) -> None:
    store.hset(keys.effects, mapping={"send": "1:0:ambiguous", "send:detail": "the relay hung up"})
    before = hash_of(store, keys.effects)
    grant = take(journal, keys)

    found = journal.backend.effect_claim(
        keys, "send", Claimant(grant.holder, grant.fence, "p"), TERMS
    )

    assert (found.status, found.fence, found.detail) == (
        EffectClaimed.AMBIGUOUS,
        1,
        "the relay hung up",
    )
    assert hash_of(store, keys.effects) == before


def test_a_confirmation_of_an_effect_never_claimed_is_refused(
    journal: Journal, store: redis.Redis, keys: RunKeys
) -> None:
    grant = take(journal, keys)

    confirming = Confirming("send", grant.fence)  # not asked to take it: it must stand

    confirmed = journal.backend.renew(keys, grant.holder, 60_000, None, {}, confirming)

    assert confirmed is Renewed.NOT_THIS_CLAIM
    assert store.exists(keys.effects) == 0


def test_a_confirmation_takes_the_claim_nobody_has_confirmed_with_its_deadline(
    journal: Journal, store: redis.Redis, keys: RunKeys
) -> None:
    grant = take(journal, keys)
    before = server_ms(store)
    confirming = Confirming("send", grant.fence, 60_000, '{"pid": 7}', revocable=True)

    confirmed = journal.backend.renew(keys, grant.holder, 60_000, None, {}, confirming)

    assert confirmed is Renewed.EXTENDED
    stored = hash_of(store, keys.effects)
    fence, deadline, state = stored.pop("send").split(":")
    assert (int(fence), state) == (grant.fence, "confirmed")
    assert before + 60_000 <= int(deadline) <= server_ms(store) + 60_000
    assert stored == {"send:process": '{"pid": 7}', "send:revocable": "1"}
    plain = Confirming("mail", grant.fence, 60_000, "p")  # not revocable: a cancel waits for it
    assert journal.backend.renew(keys, grant.holder, 60_000, None, {}, plain) is Renewed.EXTENDED
    assert "mail:revocable" not in hash_of(store, keys.effects)


def test_a_confirmation_asked_to_claim_takes_nothing_over_an_earlier_claim(
    journal: Journal, store: redis.Redis, keys: RunKeys
) -> None:
    earlier = take(journal, keys)
    store.hset(keys.effects, "send", f"{earlier.fence}:{LIVE}:claimed")
    store.delete(keys.lease)  # its holder died: the next holder takes over, with a new fence
    grant = take(journal, keys)
    confirming = Confirming("send", grant.fence, 60_000, "p")

    confirmed = journal.backend.renew(keys, grant.holder, 60_000, None, {}, confirming)

    assert confirmed is Renewed.NOT_THIS_CLAIM
    assert hash_of(store, keys.effects) == {"send": f"{earlier.fence}:{LIVE}:claimed"}


def test_a_confirmation_asked_to_claim_while_a_cancel_is_pending_takes_nothing(
    journal: Journal, store: redis.Redis, keys: RunKeys
) -> None:
    grant = take(journal, keys)
    store.hset(keys.meta, "cancel", "operator")
    confirming = Confirming("send", grant.fence, 60_000, "p")

    renewed = journal.backend.renew(keys, grant.holder, 60_000, None, {}, confirming)

    assert renewed is Renewed.CANCEL_PENDING
    assert store.exists(keys.effects) == 0  # no claim: the cancel lands, and nothing acts


def test_releasing_a_claim_never_taken_writes_nothing_and_says_whether_the_lease_held(
    journal: Journal, store: redis.Redis, keys: RunKeys
) -> None:
    grant = take(journal, keys)

    def settle(state: str) -> Settled:
        return journal.backend.effect_settle(keys, grant.holder, "send", grant.fence, state, b"")

    assert settle("released") is Settled.SETTLED
    assert settle("done") is Settled.NOT_THIS_CLAIM  # only a confirmation leads to an act
    assert settle("ambiguous") is Settled.NOT_THIS_CLAIM
    store.delete(keys.lease)
    assert settle("released") is Settled.SETTLED_WITHOUT_LEASE
    assert store.exists(keys.effects) == 0


def test_an_opening_reads_which_effects_have_a_claim(
    journal: Journal, store: redis.Redis, keys: RunKeys
) -> None:
    store.hset(keys.effects, mapping={"send": f"1:{LIVE}:claimed", "send:process": "p"})
    opening = Opening(max_stalled_starts=5, due_at_ms=LIVE, args=None)

    grant = Lease(keys, journal.backend, 60_000).open(1000, opening)

    assert isinstance(grant, Grant)
    assert grant.effects == frozenset({"send", "send:process"})


def test_a_confirmation_while_a_cancel_is_pending_renews_but_confirms_nothing(
    journal: Journal, store: redis.Redis, keys: RunKeys
) -> None:
    grant = take(journal, keys)
    us = Claimant(grant.holder, grant.fence, "p")
    assert journal.backend.effect_claim(keys, "send", us, TERMS).status is EffectClaimed.CLAIMED
    store.hset(keys.meta, "cancel", "operator")
    store.pexpire(keys.lease, 1000)

    renewed = journal.backend.renew(
        keys, grant.holder, 60_000, None, {}, Confirming("send", grant.fence)
    )

    assert renewed is Renewed.CANCEL_PENDING
    assert as_text(store.hget(keys.effects, "send")).endswith(":claimed")  # never acted
    assert store.pttl(keys.lease) > 30_000  # the lease renewed all the same


def test_a_confirmed_claim_abandoned_past_its_deadline_is_decided_done_with_its_receipt(
    journal: Journal, store: redis.Redis, keys: RunKeys
) -> None:
    store.hset(keys.effects, "send", f"1:{PAST}:confirmed")  # its claimant died confirmed

    decided = journal.backend.effect_decide(keys, "send", "done", b'{"id":"m-1"}')

    assert decided == (Decided.DECIDED, "")
    assert hash_of(store, keys.effects) == {"send": "1:0:done", "send:receipt": '{"id":"m-1"}'}


def test_an_ambiguous_effect_decided_resend_saves_no_receipt(
    journal: Journal, store: redis.Redis, keys: RunKeys
) -> None:
    store.hset(keys.effects, mapping={"send": "1:0:ambiguous", "send:detail": "hung up"})

    decided = journal.backend.effect_decide(keys, "send", "resend", b"")

    assert decided == (Decided.DECIDED, "")
    assert hash_of(store, keys.effects) == {"send": "1:0:resend", "send:detail": "hung up"}


@pytest.mark.parametrize(("deadline", "held"), [(LIVE, False), (PAST, True)])
def test_a_confirmed_claim_still_live_or_held_is_not_decided(
    journal: Journal, store: redis.Redis, keys: RunKeys, deadline: int, held: bool
) -> None:
    store.hset(keys.effects, "send", f"1:{deadline}:confirmed")
    if held:
        take(journal, keys)  # its claimant may still settle it itself

    decided = journal.backend.effect_decide(keys, "send", "done", b'{"id":"m-1"}')

    assert decided == (Decided.NOT_AMBIGUOUS, "confirmed")
    assert hash_of(store, keys.effects) == {"send": f"1:{deadline}:confirmed"}


def test_a_released_claim_keeps_no_reason_it_may_have_happened(
    journal: Journal, store: redis.Redis, keys: RunKeys
) -> None:
    grant = take(journal, keys)
    claimed = journal.backend.effect_claim(keys, "send", Claimant(grant.holder, 1, "p1"), TERMS)
    assert claimed.status is EffectClaimed.CLAIMED

    settled = journal.backend.effect_settle(keys, grant.holder, "send", 1, "released", b"")

    assert settled is Settled.SETTLED
    assert hash_of(store, keys.effects) == {"send": "1:0:released", "send:process": "p1"}


def test_the_claimants_own_receipt_settles_what_a_later_holder_found_ambiguous(
    journal: Journal, store: redis.Redis, keys: RunKeys
) -> None:
    # Fence 1 confirmed and lost its lease; fence 2 found the claim past its deadline and
    # made it ambiguous. Fence 1, alive after all, finishes: what it knows beats unknown.
    store.hset(keys.effects, mapping={"send": "1:0:ambiguous", "send:detail": "no reply"})
    take(journal, keys)
    zombie = "1:token-of-fence-1"

    unknown = journal.backend.effect_settle(keys, zombie, "send", 1, "ambiguous", b"again")
    assert unknown is Settled.NOT_THIS_CLAIM  # unknown never overwrites unknown's reason
    assert hash_of(store, keys.effects) == {"send": "1:0:ambiguous", "send:detail": "no reply"}

    known = journal.backend.effect_settle(keys, zombie, "send", 1, "done", b'{"id":"m-1"}')

    assert known is Settled.SETTLED_WITHOUT_LEASE
    assert hash_of(store, keys.effects) == {"send": "1:0:done", "send:receipt": '{"id":"m-1"}'}


def test_a_revocable_claim_is_kept_as_such_for_a_cancel_to_read(
    journal: Journal, store: redis.Redis, keys: RunKeys
) -> None:
    grant = take(journal, keys)
    us = Claimant(grant.holder, grant.fence, "p")
    revocable = dataclasses.replace(TERMS, revocable=True)

    assert (
        journal.backend.effect_claim(keys, "batch", us, revocable).status is EffectClaimed.CLAIMED
    )

    assert hash_of(store, keys.effects)["batch:revocable"] == "1"
