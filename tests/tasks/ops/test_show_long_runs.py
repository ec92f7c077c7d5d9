"""``digest show`` of a week of thousands of items: its first and last steps, the rest counted.

Rendered from a view built in memory: the text is the renderer's alone, and a real run of
thousands of steps would take the suite minutes to make.
"""

from __future__ import annotations

from typing import Any

from journal import Record, RunMeta
from journal.ops.views import RunView
from tasks.ops.cli.parser import build_parser
from tasks.ops.cli.render import STEPS_SHOWN, render_view

ITEMS = 5000
T0 = 1_790_000_000_000


def record(seq: int, key: str, result: Any, attempt: int = 1) -> Record:
    return Record(key, result, seq, attempt, 1, T0 + seq, T0 + seq)


def week(items: int) -> RunView:
    """A sent week of ``items`` offline summaries: two retried, one refused."""
    steps = [record(0, "select", [{"id": f"i{n}"} for n in range(3)])]
    for n in range(1, items + 1):
        result: dict[str, Any] = {"text": f"summary {n}", "model": "offline"}
        if n == 700:
            result = {"error": "the model refused this item: no"}
        steps.append(record(n, f"summarize:i{n}", result, attempt=2 if n in (900, 1000) else 1))
    steps += [
        record(items + 1, "compose", {"text": "opening", "model": "offline"}),
        record(items + 2, "mark-seen", items),
        record(items + 3, "done", True),
    ]
    meta = RunMeta("digest:2026-w42", {"status": "done", "starts": "1", "fence": "1"})
    return RunView("digest:2026-w42", meta, steps, None, None, None, {}, {}, {})


def step_rows(shown: str) -> list[str]:
    lines = shown.splitlines()
    first = next(n for n, line in enumerate(lines) if line.startswith("step "))
    last = next(n for n, line in enumerate(lines) if line.startswith(f"{ITEMS + 4} steps"))
    return [line for line in lines[first + 1 : last] if line.strip()]


def test_a_long_run_lists_its_first_and_last_steps_and_counts_the_rest() -> None:
    rows = step_rows(render_view(week(ITEMS)))

    half = STEPS_SHOWN // 2
    assert len(rows) == STEPS_SHOWN + 1
    assert [row.split()[0] for row in rows[:3]] == ["select", "summarize:i1", "summarize:i2"]
    assert rows[half].split()[0] == "..."
    assert rows[half].endswith(
        f"{ITEMS + 4 - STEPS_SHOWN} steps not shown ({ITEMS + 4 - STEPS_SHOWN} summarize, "
        "2 retried, 1 skipped): digest show 2026-w42 --all"
    )
    assert [row.split()[0] for row in rows[-3:]] == ["compose", "mark-seen", "done"]


def test_all_lists_every_step_and_a_short_run_is_never_cut() -> None:
    every = step_rows(render_view(week(ITEMS), every_step=True))
    assert [row.split()[0] for row in every] == [step.key for step in week(ITEMS).steps]

    short = week(STEPS_SHOWN - 4)  # exactly STEPS_SHOWN steps
    assert len(short.steps) == STEPS_SHOWN
    shown = render_view(short).splitlines()
    assert not any(line.startswith("...") for line in shown)
    assert sum(line.startswith("summarize:") for line in shown) == STEPS_SHOWN - 4


def test_show_takes_all() -> None:
    assert build_parser().parse_args(["show", "2026-w42", "--all"]).all is True
    assert build_parser().parse_args(["show", "2026-w42"]).all is False
