"""``Heartbeat.confirm``, the check right before an irreversible act, against a silent takeover.

The beat has not noticed anything (its TTL is long, it never ran): only the synchronous renewal
inside ``confirm`` can learn that another holder took the lease, or that the run was
cancelled, and it must say which run. Found by mutation testing (docs/mutation.md): with
``or`` turned into ``and`` confirm stopped renewing at all, and no test noticed.
"""

from __future__ import annotations

import threading

import pytest

from journal import Journal
from journal._cancel import CANCEL_FIELD, Cancelled
from journal._lease import Heartbeat, Lease
from journal.errors import CorruptJournal, LeaseLost
from tests.conftest import MakeJournal
from tests.support import acquire, recorded_events

TTL_MS = 60_000


def held(journal: Journal) -> tuple[Lease, Heartbeat]:
    """The lease of wf:r1 and a heartbeat for it that was never started."""
    lease = Lease(journal.keys("wf", "r1"), journal.backend, TTL_MS)
    grant = acquire(lease, 0)
    return lease, Heartbeat(lease, grant.holder, grant.confirmed_at)


def test_confirm_learns_of_a_takeover_the_beat_never_saw(make_journal: MakeJournal) -> None:
    journal = make_journal()
    _, heartbeat = held(journal)
    journal.client.delete(journal.keys("wf", "r1").lease)  # expired while this holder slept
    acquire(Lease(journal.keys("wf", "r1"), journal.backend, TTL_MS), 0)  # and another took it
    with recorded_events() as events, pytest.raises(LeaseLost) as caught:
        heartbeat.confirm()
    assert events == [("renewal_failed", "", 1.0)]  # what the operator's counter sees
    assert (caught.value.run, caught.value.detail) == (
        "wf:r1",
        "the lease expired or was taken over",
    )
    assert heartbeat.lost.is_set()
    assert heartbeat.renewals == 0


def test_confirm_renews_and_returns_when_the_lease_is_still_ours(make_journal: MakeJournal) -> None:
    journal = make_journal()
    _, heartbeat = held(journal)
    heartbeat.confirm()
    assert heartbeat.renewals == 1
    assert not heartbeat.lost.is_set()


def test_confirm_refuses_a_cancelled_run_naming_it(make_journal: MakeJournal) -> None:
    journal = make_journal()
    _, heartbeat = held(journal)
    journal.client.hset(journal.keys("wf", "r1").meta, CANCEL_FIELD, "operator")
    with pytest.raises(Cancelled) as caught:
        heartbeat.confirm()
    assert caught.value.run == "wf:r1"
    assert heartbeat.cancelled.is_set()


def test_ensure_names_the_run_when_the_lease_is_lost_or_the_run_cancelled(
    make_journal: MakeJournal,
) -> None:
    journal = make_journal()
    _, heartbeat = held(journal)
    heartbeat.ensure()  # fresh: nothing to say
    heartbeat.cancelled.set()  # a record reported a pending cancel
    with pytest.raises(Cancelled) as cancelled:
        heartbeat.ensure()
    assert cancelled.value.run == "wf:r1"
    heartbeat.lost.set()  # a renewal found the lease gone
    with pytest.raises(LeaseLost) as lost:
        heartbeat.ensure()
    assert (lost.value.run, lost.value.detail) == ("wf:r1", "the lease expired or was taken over")


def test_heartbeats_share_one_daemon_thread_that_never_holds_the_process_open(
    make_journal: MakeJournal,
) -> None:
    """One thread renews every heartbeat of the process; a daemon, so a crashing process is
    never held open by it (its leases must then expire)."""
    journal = make_journal()
    _, heartbeat = held(journal)
    heartbeat.start()
    beats = [t for t in threading.enumerate() if t.name == "lease-beats"]
    assert [t.daemon for t in beats] == [True]
    heartbeat.stop()


def test_a_fence_counter_that_is_not_an_integer_is_refused_naming_run_and_key(
    make_journal: MakeJournal,
) -> None:
    journal = make_journal()
    keys = journal.keys("wf", "r1")
    journal.client.set(keys.fence, "seven")
    with pytest.raises(CorruptJournal) as caught:
        acquire(Lease(keys, journal.backend, TTL_MS), 0)
    assert (caught.value.run, caught.value.field, caught.value.detail) == (
        "wf:r1",
        "fence",  # the script names the counter it could not read
        "not an integer counter",
    )
