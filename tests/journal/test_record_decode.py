"""Reading stored step records back as ``Record``: what inspection and the console show.

``Record.decode`` and ``decode_journal`` are the read side of ``inspect_run``: every field of
every record must come back as written (kind and group included, with their defaults when an
older record lacks them), and a record that is not one must be refused naming the run and the
step, with the reason. Found by mutation testing (docs/mutation.md): nothing else read them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest

from journal import ManualClock, Run
from journal._schema.records import Record, decode_journal, ordered
from journal.errors import CorruptJournal
from journal.ops.views import inspect_run
from tests.conftest import MakeJournal
from tests.support import execute

RUN = "wf:r1"
FULL = {
    "result": {"title": "t"},
    "seq": 3,
    "attempt": 2,
    "fence": 7,
    "started_at": 1_000,
    "finished_at": 1_500,
    "kind": "effect",
    "group": "summarize",
}


def test_every_field_of_a_record_comes_back_as_written() -> None:
    record = Record.decode(RUN, "summarize:a", orjson.dumps(FULL))
    assert record == Record(
        key="summarize:a",
        result={"title": "t"},
        seq=3,
        attempt=2,
        fence=7,
        started_at=1_000,
        finished_at=1_500,
        kind="effect",
        group="summarize",
    )


def test_a_record_without_kind_or_group_is_a_plain_step_of_no_group() -> None:
    older = {k: v for k, v in FULL.items() if k not in ("kind", "group")}
    record = Record.decode(RUN, "a", orjson.dumps(older))
    assert (record.kind, record.group) == ("step", None)
    assert (record.seq, record.attempt, record.fence) == (3, 2, 7)
    assert (record.started_at, record.finished_at) == (1_000, 1_500)


def test_a_record_that_is_not_json_names_the_run_the_step_and_the_parse_error() -> None:
    with pytest.raises(CorruptJournal) as caught:
        Record.decode(RUN, "a", b'{"result": ')
    assert (caught.value.run, caught.value.field) == (RUN, "a")
    assert (
        caught.value.detail == "not valid JSON: unexpected end of data: line 1 column 12 (char 11)"
    )


@pytest.mark.parametrize(
    ("stored", "detail"),
    [
        ({"result": 1}, "not a step record: KeyError('seq')"),
        (
            {**FULL, "fence": "seven"},
            "not a step record: ValueError(\"invalid literal for int() with base 10: 'seven'\")",
        ),
        (
            [1, 2],
            "not a step record: TypeError('list indices must be integers or slices, not str')",
        ),
    ],
    ids=["missing-field", "not-a-number", "not-an-object"],
)
def test_a_record_missing_its_fields_names_the_run_the_step_and_what_is_wrong(
    stored: Any, detail: str
) -> None:
    with pytest.raises(CorruptJournal) as caught:
        Record.decode(RUN, "a", orjson.dumps(stored))
    assert (caught.value.run, caught.value.field, caught.value.detail) == (RUN, "a", detail)


def test_a_whole_journal_decodes_by_field_and_a_field_name_that_is_not_utf8_still_reads() -> None:
    raw = {b"a": orjson.dumps(FULL), b"\xffb": orjson.dumps({**FULL, "seq": 1})}
    records = decode_journal(RUN, raw)
    assert sorted(records) == ["a", "\ufffdb"]
    assert records["\ufffdb"].key == "\ufffdb"
    assert [r.key for r in ordered(records.values())] == ["\ufffdb", "a"]


def test_a_corrupt_record_in_a_whole_journal_is_named_by_its_run() -> None:
    with pytest.raises(CorruptJournal) as caught:
        decode_journal(RUN, {b"a": orjson.dumps(FULL), b"b": b"{"})
    assert (caught.value.run, caught.value.field) == (RUN, "b")


def test_inspection_shows_each_kind_and_group_as_recorded(make_journal: MakeJournal) -> None:
    journal = make_journal(clock=ManualClock(1_000.0))

    def body(run: Run) -> object:
        run.now("t")
        run.uuid("u")
        run.version("v", 2)
        return run.map("m", ["x"], lambda item: item, key=str)

    execute(journal, "wf", "r1", body)
    steps = inspect_run(journal, "wf", "r1").steps
    assert [(s.key, s.kind, s.group, s.seq) for s in steps] == [
        ("now:t", "now", None, 1),
        ("uuid:u", "uuid", None, 2),
        ("version:v", "version", None, 3),
        ("m:x", "step", "m", 4),
    ]


@pytest.mark.parametrize(
    "stored",
    [{"seq": 1, "kind": "step"}, {"result": 1, "seq": "1"}, [1]],
    ids=["no-result", "seq-not-an-integer", "not-an-object"],
)
def test_replay_refuses_a_record_without_its_result_or_seq_naming_run_and_step(
    make_journal: MakeJournal, stored: Any
) -> None:
    journal = make_journal()
    journal.client.hset(journal.keys("wf", "r1").steps, "a", orjson.dumps(stored))
    with pytest.raises(CorruptJournal) as caught:
        execute(journal, "wf", "r1", lambda run: run.step("a", lambda: 1))
    assert (caught.value.run, caught.value.field, caught.value.detail) == (
        RUN,
        "a",
        "not a step record: it lacks 'result' or an integer 'seq'",
    )


def test_a_corrupt_record_met_by_a_map_or_a_helper_names_run_and_step(
    make_journal: MakeJournal,
) -> None:
    journal = make_journal()
    steps = journal.keys("wf", "r1").steps
    readers: dict[str, Callable[[Run], object]] = {
        "m:a": lambda run: run.map("m", ["a"], str, key=str),
        "now:t": lambda run: run.now("t"),
    }
    for key, body in readers.items():
        journal.client.hset(steps, key, b'{"seq": 1}')
        with pytest.raises(CorruptJournal) as caught:
            execute(journal, "wf", "r1", body)
        assert (caught.value.run, caught.value.field) == (RUN, key)
        journal.client.hdel(steps, key)
        journal.client.hdel(journal.keys("wf", "r1").meta, "status")
