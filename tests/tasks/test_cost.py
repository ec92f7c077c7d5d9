"""Cost per run: tokens times the price table, journaled with each call, and the budget.

The price table's parsing is checked in-process; the budget with the real CLI, the real SDK
and the fake Anthropic API counting calls.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tasks.config import Config
from tasks.cost import Price, PriceTable, is_call, usage_of
from tasks.errors import BadInput
from tests.fakes.anthropic_server import FakeAnthropic
from tests.support import CALLS, Deployment

RUN = "2026-w42"


def test_the_defaults_price_the_two_default_models_per_million_tokens() -> None:
    table = PriceTable.from_env({})
    assert table.cost("claude-haiku-5-5", 1_000_000, 0) == 1.0
    assert table.cost("claude-sonnet-5-5", 1000, 2000) == pytest.approx(0.003 + 0.03)
    assert table.cost("someone-elses-model", 10, 10) is None


def test_a_file_then_the_environment_override_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    path.write_text(
        json.dumps({"claude-haiku-5-5": {"input": 2, "output": 4}, "x": {"input": 1, "output": 1}})
    )
    env = {"DIGEST_PRICES_FILE": str(path), "DIGEST_PRICES": '{"x": {"input": 9, "output": 9}}'}
    prices = PriceTable.from_env(env).prices
    assert prices["claude-haiku-5-5"] == Price(2.0, 4.0)
    assert prices["x"] == Price(9.0, 9.0)
    assert prices["claude-sonnet-5-5"] == Price(3.0, 15.0)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DIGEST_PRICES": "{"}, "DIGEST_PRICES='{': not JSON"),
        ({"DIGEST_PRICES": '{"m": {"input": -1, "output": 1}}'}, "the price of 'm' is not"),
        ({"DIGEST_PRICES_FILE": "/nonexistent/p.json"}, "cannot read it"),
        (
            {"DIGEST_MAX_COST_USD": "1", "DIGEST_SUMMARY_MODEL": "other"},
            "DIGEST_MAX_COST_USD is set but other has no price",
        ),
        ({"DIGEST_MAX_COST_USD": "lots"}, "DIGEST_MAX_COST_USD='lots': not a number"),
    ],
)
def test_a_bad_price_or_an_unpriceable_budget_is_refused_in_one_line(
    env: dict[str, str], message: str
) -> None:
    with pytest.raises(BadInput, match=re.escape(message)) as refused:
        Config.from_env(env)
    assert "\n" not in str(refused.value)


def test_usage_sums_calls_and_counts_unpriced_ones_apart() -> None:
    results = [
        {"text": "a", "input_tokens": 10, "output_tokens": 2, "model": "m", "cost_usd": 0.5},
        {"text": "b", "input_tokens": 5, "output_tokens": 1, "model": "n", "cost_usd": None},
        {"id": "not a call"},
        True,
    ]
    usage = usage_of(results)
    assert (usage.calls, usage.input_tokens, usage.output_tokens) == (2, 15, 3)
    assert (usage.cost_usd, usage.unpriced, usage.tokens) == (0.5, 1, 18)


@pytest.mark.slow
def test_a_run_over_budget_stops_before_its_next_call_and_resumes_at_no_extra_cost(
    deployment: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    deployment.env.update(fake_anthropic.env(), DIGEST_CONCURRENCY="1")
    budget = "0.0005"

    stopped = deployment.cli("run", RUN, env={"DIGEST_MAX_COST_USD": budget})

    assert stopped.returncode == 1
    [line] = stopped.stderr.splitlines()
    found = re.fullmatch(
        rf"failed: run digest:{RUN} has spent \$(\d\.\d{{4}}) of its \$0\.0005 budget "
        rf"\(DIGEST_MAX_COST_USD\) and stopped before (summarize:i\d); nothing was sent: raise "
        rf"the budget, then `digest retry {RUN}`",
        line,
    )
    assert found, line
    view = deployment.view(RUN)
    costs = [r.result["cost_usd"] for r in view.steps if r.key.startswith("summarize:")]
    assert view.status == "failed"
    assert fake_anthropic.calls == len(costs) >= 1  # no call was made past the budget
    assert found.group(1) == f"{sum(costs):.4f}"
    assert sum(costs) + max(costs) > float(budget) >= sum(costs[:-1]) + max(costs[:-1], default=0)
    assert view.step(found.group(2)) is None
    assert deployment.outbox() == []

    resumed = deployment.cli("run", RUN, env={"DIGEST_MAX_COST_USD": "1"})

    assert resumed.returncode == 0, resumed.stderr
    assert fake_anthropic.calls == CALLS  # the calls paid for before are replayed, not repeated
    shown = deployment.cli("show", RUN).stdout
    every = [r.result["cost_usd"] for r in deployment.view(RUN).steps if is_call(r.result)]
    assert len(every) == CALLS
    assert shown.rstrip().endswith(f"output tokens, ${sum(every):.4f}")
    runs = deployment.cli("runs").stdout
    assert f" {CALLS} calls ${sum(every):.4f}" in runs
