"""The mutants' own checks, in the fast suite: a Lua script without tests fails here first.

``python -m tests.mutants`` runs last in ``make test`` and takes minutes; a new script with no
entry in ``LUA_TESTS``, a renamed test file or a stale equivalent should fail in seconds, where
the rest of the fast suite runs, and say which.
"""

from __future__ import annotations

from tests import mutants


def test_every_script_has_tests_every_mutant_fits_and_no_name_is_taken_twice() -> None:
    generation = mutants.generated()

    assert mutants.problems_with(mutants.MUTANTS + generation, generation) == []
    assert {m.path for m in generation} <= set(mutants.LUA_TESTS)
    assert all(m.tests == mutants.LUA_TESTS[m.path] for m in generation)


def test_each_comparison_is_flipped_and_each_condition_forced_both_ways() -> None:
    made = mutants.script_mutants("journal/lua/purge_index.lua", ("t",))

    assert [(m.name, m.find, m.replace) for m in made] == [
        (
            "purge_index.lua:8: if forced true",
            "score and tonumber(score) ~= tonumber(ARGV[2])",
            "true",
        ),
        (
            "purge_index.lua:8: if forced false",
            "score and tonumber(score) ~= tonumber(ARGV[2])",
            "false",
        ),
        ("purge_index.lua:8: ~= -> ==", "~=", "=="),
    ]
    source = (mutants.ROOT / "journal/lua/purge_index.lua").read_text()
    flipped = made[2].apply(source)
    assert flipped.count("tonumber(score) == tonumber(ARGV[2])") == 1
    assert len(flipped) == len(source)


def test_a_line_with_one_operator_twice_names_each_and_comments_yield_none() -> None:
    made = mutants.script_mutants("journal/lua/cancel.lua", ("t",))
    names = [m.name for m in made]

    # Line 20: `if status == 'done' or status == 'cancelled' then`.
    assert [n for n in names if n.startswith("cancel.lua:20:")] == [
        "cancel.lua:20: if forced true",
        "cancel.lua:20: if forced false",
        "cancel.lua:20: 1st == -> ~=",
        "cancel.lua:20: 2nd == -> ~=",
    ]
    # The header (lines 1-15) is comment: nothing in it is mutated.
    assert min(int(n.split(":")[1]) for n in names) == 16
