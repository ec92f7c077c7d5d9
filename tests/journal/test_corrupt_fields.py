"""Every field the journal reads back, corrupted: CorruptJournal naming the run and the field.

Never a KeyError, a TypeError or a Lua error from deep inside: the caller (the command line, a
worker) turns CorruptJournal into one line that says which field to repair.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from journal import Journal, Run
from journal.errors import CorruptJournal
from journal.ops.views import inspect_run, list_runs
from tests.conftest import MakeJournal
from tests.support import execute


def waits_for_approval(run: Run) -> object:
    return run.wait_for_signal("approval", timeout=600).payload


def waiting(journal: Journal) -> None:
    assert execute(journal, "wf", "r1", waits_for_approval).status == "waiting"


@pytest.mark.parametrize(
    ("stored", "says"),
    [
        (b'{"kind": "sig', "not valid JSON"),
        (b'["signal"]', "not a wait"),
        (b'{"kind": "signal"}', "not a wait: KeyError('step')"),
        (b'{"kind": "sleep", "step": "s", "until": "soon"}', "not a wait: ValueError"),
    ],
    ids=["not-json", "a-list", "no-step", "bad-until"],
)
def test_a_corrupt_wait_is_named_by_every_reader(
    make_journal: MakeJournal, stored: bytes, says: str
) -> None:
    journal = make_journal()
    waiting(journal)
    meta = journal.keys("wf", "r1").meta
    journal.client.hset(meta, "wait", stored)

    readers: dict[str, Callable[[], object]] = {
        "execute": lambda: execute(journal, "wf", "r1", waits_for_approval),
        "send_signal": lambda: journal.send_signal("wf", "r1", "approval", {"ok": True}),
        "inspect": lambda: inspect_run(journal, "wf", "r1"),
    }
    for reader, read in readers.items():
        with pytest.raises(CorruptJournal) as caught:
            read()
        assert (caught.value.run, caught.value.field) == ("wf:r1", "meta.wait"), reader
        assert says in str(caught.value), reader
        assert "repair or delete that field" in str(caught.value)
    assert journal.client.hget(meta, "wait") == stored  # never repaired behind anyone's back


def test_a_corrupt_signal_payload_is_named_by_the_run_and_by_inspection(
    make_journal: MakeJournal,
) -> None:
    journal = make_journal()
    waiting(journal)
    keys = journal.keys("wf", "r1")
    journal.client.hset(keys.signals, "approval", b'{"approved": tr')

    with pytest.raises(CorruptJournal) as caught:
        inspect_run(journal, "wf", "r1")
    assert (caught.value.run, caught.value.field) == ("wf:r1", "signals.approval")
    with pytest.raises(CorruptJournal) as caught:
        execute(journal, "wf", "r1", waits_for_approval)
    assert (caught.value.run, caught.value.field) == ("wf:r1", "signals.approval")
    assert journal.meta(keys)["status"] == "failed"
    assert "signals.approval" in journal.meta(keys)["last_error"]


@pytest.mark.parametrize(
    ("field", "stored"),
    [("args", b'["not", "an", "object"]'), ("args", b"{half"), ("holder", b"\xff\xfe")],
    ids=["args-a-list", "args-not-json", "not-utf8"],
)
def test_corrupt_meta_fields_are_refused_before_the_body_runs(
    make_journal: MakeJournal, field: str, stored: bytes
) -> None:
    journal = make_journal()
    keys = journal.keys("wf", "r1")
    execute(journal, "wf", "r1", lambda run: run.sleep("nap", 60), args={"to": "a@b"})
    journal.client.hset(keys.meta, field, stored)
    ran: list[int] = []

    with pytest.raises(CorruptJournal) as caught:
        execute(journal, "wf", "r1", lambda run: ran.append(1))
    assert (caught.value.run, caught.value.field) == ("wf:r1", f"meta.{field}")
    assert ran == []
    assert not journal.client.exists(keys.lease)  # given back: the next start is not delayed


@pytest.mark.parametrize(
    ("key", "field", "stored"),
    [
        ("fence", None, b"seven"),
        ("meta", "starts", b"1.5"),
        ("meta", "starts_without_progress", b"-"),
    ],
    ids=["fence", "starts", "starts-without-progress"],
)
def test_a_corrupt_counter_is_named_and_nothing_is_written(
    make_journal: MakeJournal, key: str, field: str | None, stored: bytes
) -> None:
    journal = make_journal()
    keys = journal.keys("wf", "r1")
    execute(journal, "wf", "r1", lambda run: run.sleep("nap", 60))
    name = getattr(keys, key)
    if field is None:
        journal.client.set(name, stored)
    else:
        journal.client.hset(name, field, stored)
    meta_before = journal.client.hgetall(keys.meta)

    with pytest.raises(CorruptJournal) as caught:
        execute(journal, "wf", "r1", lambda run: None)
    assert caught.value.field == (f"meta.{field}" if field else "fence")
    assert "not an integer" in str(caught.value)
    assert journal.client.hgetall(keys.meta) == meta_before
    assert not journal.client.exists(keys.lease)


def test_a_parked_run_with_a_corrupt_count_is_named_not_a_value_error(
    make_journal: MakeJournal,
) -> None:
    journal = make_journal()
    keys = journal.keys("wf", "r1")
    journal.client.hset(keys.meta, mapping={"parked": "1", "starts_without_progress": "many"})
    with pytest.raises(CorruptJournal) as caught:
        execute(journal, "wf", "r1", lambda run: None)
    assert caught.value.field == "meta.starts_without_progress"


def test_a_listing_names_a_run_whose_meta_is_not_text(make_journal: MakeJournal) -> None:
    journal = make_journal()
    execute(journal, "wf", "r1", lambda run: None)
    journal.client.hset(journal.keys("wf", "r1").meta, "last_error", b"\xc3\x28")
    with pytest.raises(CorruptJournal) as caught:
        list_runs(journal)
    assert (caught.value.run, caught.value.field) == ("wf:r1", "meta.last_error")
    assert "not UTF-8" in str(caught.value)


def test_an_effects_hash_field_that_is_not_text_never_stops_a_run(
    make_journal: MakeJournal,
) -> None:
    """The opening reads the effects hash's fields; one no step key could be is not one."""
    journal = make_journal()
    journal.client.hset(journal.keys("wf", "r1").effects, b"\xff\xfe", b"junk")

    def send(run: Run) -> str:
        return str(run.effect("send", lambda effect: effect.confirm() or "sent", timeout=5))

    outcome = execute(journal, "wf", "r1", send)

    assert (outcome.status, outcome.result) == ("done", "sent")
