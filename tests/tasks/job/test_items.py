import json
from pathlib import Path

import pytest

from tasks.errors import BadInput, DigestError
from tasks.job.items import Item, load_items

REPO = Path(__file__).resolve().parents[3]


def write(tmp_path: Path, content: str | bytes, name: str = "items.json") -> Path:
    path = tmp_path / name
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_bytes(content)
    return path


def entries(n: int = 4) -> list[dict[str, object]]:
    return [{"id": f"i{k}", "title": f"Title {k}", "body": f"Body {k}."} for k in range(1, n + 1)]


def refused(path: Path) -> str:
    with pytest.raises(BadInput) as caught:
        load_items(path)
    message = str(caught.value)
    assert "\n" not in message
    assert isinstance(caught.value, DigestError)
    return message


def test_the_shipped_file_loads_its_eight_updates_in_order() -> None:
    items = load_items(REPO / "data" / "items.json")
    assert [item.id for item in items] == [f"i{k}" for k in range(1, 9)]
    assert items[3] == Item(
        id="i4",
        title="SSO for the Team plan",
        body="Single sign-on with Okta and Google Workspace is now included in the Team plan, "
        "not only Enterprise.",
    )


def test_an_item_round_trips_through_json_text() -> None:
    item = Item(id="a.b_c-1", title='Quotes " and <tags>', body="Line one\nline two\tend")
    assert Item.from_json(json.loads(json.dumps(item.to_json()))) == item
    assert item.to_json() == {"id": "a.b_c-1", "title": 'Quotes " and <tags>', "body": item.body}


def test_an_empty_list_is_a_week_without_updates(tmp_path: Path) -> None:
    assert load_items(write(tmp_path, "[]")) == []


def test_a_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    path = write(tmp_path, b"\xef\xbb\xbf" + json.dumps(entries(1)).encode())
    assert load_items(path) == [Item("i1", "Title 1", "Body 1.")]


def test_the_example_message_names_file_entry_id_and_problem(tmp_path: Path) -> None:
    data = entries(4)
    data[3]["title"] = ""
    path = write(tmp_path, json.dumps(data))
    assert refused(path) == f'{path}: entry 3 (id "i4"): "title" must be a non-empty string'


def test_a_missing_file_says_how_to_point_at_one(tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    assert refused(path) == (
        f"{path}: file not found; create it or set DIGEST_ITEMS to this week's updates file"
    )


def test_a_directory_is_refused(tmp_path: Path) -> None:
    assert refused(tmp_path) == f"{tmp_path}: is a directory; point DIGEST_ITEMS at a JSON file"


def test_invalid_utf8_names_the_byte_offset(tmp_path: Path) -> None:
    raw = json.dumps(entries(1)).encode()
    offset = raw.index(b"Body")
    path = write(tmp_path, raw[:offset] + b"\xff" + raw[offset:])
    assert refused(path) == (
        f"{path}: not valid UTF-8 at byte offset {offset} (byte 0xff); save the file as UTF-8"
    )


def test_latin1_text_is_caught_at_the_accented_byte(tmp_path: Path) -> None:
    path = write(tmp_path, '[{"id": "i1", "title": "Café", "body": "b"}]'.encode("latin-1"))
    assert "not valid UTF-8 at byte offset 27 (byte 0xe9)" in refused(path)


def test_broken_json_names_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, '[\n  {"id": "i1", "title": "t", "body": "b"},\n]')
    assert refused(path) == (
        f"{path}: not valid JSON at line 3 column 1 (Expecting value); fix the syntax"
    )


def test_a_top_level_object_is_refused_with_the_expected_shape(tmp_path: Path) -> None:
    path = write(tmp_path, json.dumps({"items": entries(1)}))
    assert refused(path) == (
        f"{path}: expected a JSON list of updates, found an object; "
        'wrap the entries in [ ] as [{"id": ..., "title": ..., "body": ...}]'
    )


def test_deep_nesting_is_a_clean_error(tmp_path: Path) -> None:
    path = write(tmp_path, "[" * 200_000 + "]" * 200_000)
    assert refused(path) == (
        f"{path}: nested too deeply to be a list of updates; fix its structure"
    )


def test_a_field_given_twice_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, '[{"id": "i1", "title": "a", "title": "b", "body": "c"}]')
    assert refused(path) == f'{path}: an entry has the field "title" twice; keep one of them'


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("just text", 'expected an object with "id", "title" and "body", found a string'),
        (None, 'expected an object with "id", "title" and "body", found null'),
        ({"title": "t", "body": "b"}, "found nothing"),
        ({"id": 7, "title": "t", "body": "b"}, "found 7"),
        ({"id": "", "title": "t", "body": "b"}, 'found ""'),
        ({"id": "a b", "title": "t", "body": "b"}, 'found "a b"'),
        ({"id": "x/../y", "title": "t", "body": "b"}, 'found "x/../y"'),
        ({"id": "x" * 65, "title": "t", "body": "b"}, 'found "' + "x" * 36 + "..."),
    ],
)
def test_an_entry_without_a_usable_id_is_named_by_index(
    tmp_path: Path, entry: object, problem: str
) -> None:
    data: list[object] = [*entries(2), entry]
    message = refused(write(tmp_path, json.dumps(data)))
    assert message.startswith(f"{tmp_path / 'items.json'}: entry 2: ")
    assert message.endswith(problem)


def test_an_id_of_exactly_64_allowed_characters_is_fine(tmp_path: Path) -> None:
    ident = ("Az09._-" * 10)[:64]
    path = write(tmp_path, json.dumps([{"id": ident, "title": "t", "body": "b"}]))
    assert [item.id for item in load_items(path)] == [ident]


@pytest.mark.parametrize(
    ("field", "value"),
    [("title", None), ("title", 3), ("title", "   "), ("body", ""), ("body", ["x"])],
)
def test_title_and_body_must_be_non_empty_strings(
    tmp_path: Path, field: str, value: object
) -> None:
    data = entries(2)
    data[1][field] = value
    path = write(tmp_path, json.dumps(data))
    assert refused(path) == f'{path}: entry 1 (id "i2"): "{field}" must be a non-empty string'


def test_a_missing_body_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, json.dumps([{"id": "i1", "title": "t"}]))
    assert refused(path) == f'{path}: entry 0 (id "i1"): "body" must be a non-empty string'


def test_an_unknown_field_is_refused_rather_than_dropped(tmp_path: Path) -> None:
    path = write(tmp_path, json.dumps([{"id": "i1", "title": "t", "body": "b", "link": "x"}]))
    assert refused(path) == (
        f'{path}: entry 0 (id "i1"): unknown field "link"; '
        'the digest uses only "id", "title" and "body"'
    )


def test_duplicate_ids_name_both_entries(tmp_path: Path) -> None:
    data = entries(5)
    data[4]["id"] = "i2"
    path = write(tmp_path, json.dumps(data))
    assert refused(path) == (
        f'{path}: entry 4 (id "i2"): duplicate id, also used by entry 1; '
        "give each update its own id"
    )


def test_a_one_megabyte_body_is_one_clean_line(tmp_path: Path) -> None:
    data = entries(3)
    data[2]["body"] = "x" * 1_000_000
    path = write(tmp_path, json.dumps(data))
    assert refused(path) == (
        f'{path}: entry 2 (id "i3"): "body" is 1,000,000 characters, over the 100,000 limit; '
        "shorten it or split the update"
    )


def test_a_body_of_exactly_the_limit_is_accepted(tmp_path: Path) -> None:
    path = write(tmp_path, json.dumps([{"id": "i1", "title": "t", "body": "y" * 100_000}]))
    assert len(load_items(path)[0].body) == 100_000


def test_an_overlong_title_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, json.dumps([{"id": "i1", "title": "t" * 501, "body": "b"}]))
    assert refused(path) == (
        f'{path}: entry 0 (id "i1"): "title" is 501 characters, over the 500 limit; shorten it'
    )


@pytest.mark.parametrize(
    ("field", "value", "code", "position"),
    [
        ("title", "two\nlines", "000A", 3),
        ("title", "tab\there", "0009", 3),
        ("body", "bell \x07 here", "0007", 5),
        ("body", "lone \ud800 surrogate", "D800", 5),
        ("body", "not a character \uffff", "FFFF", 16),
    ],
)
def test_characters_that_break_email_or_prompt_markup_are_refused(
    tmp_path: Path, field: str, value: str, code: str, position: int
) -> None:
    data = entries(1)
    data[0][field] = value
    path = write(tmp_path, json.dumps(data))
    assert refused(path) == (
        f'{path}: entry 0 (id "i1"): "{field}" holds the control or invalid character '
        f"U+{code} at position {position}; remove it"
    )


def test_a_body_keeps_its_newlines_tabs_and_carriage_returns(tmp_path: Path) -> None:
    body = "Line one\r\n\tindented\nend"
    path = write(tmp_path, json.dumps([{"id": "i1", "title": "t", "body": body}]))
    assert load_items(path)[0].body == body


def test_the_first_problem_in_file_order_is_reported(tmp_path: Path) -> None:
    data = entries(4)
    data[1]["title"] = ""
    data[3]["id"] = "bad id"
    path = write(tmp_path, json.dumps(data))
    assert refused(path).startswith(f'{path}: entry 1 (id "i2"): ')
