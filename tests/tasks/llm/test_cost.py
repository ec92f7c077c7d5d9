"""Cost per run: tokens times the price table, journaled with each call, and the budget.

The price table's parsing is checked in-process; the budget with the real CLI, the real SDK
and the fake Anthropic API counting calls.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks.config import Config
from tasks.config.prices import Price, PriceTable
from tasks.errors import BadInput
from tasks.job.items import Item
from tasks.llm.client import MAX_TOKENS
from tasks.llm.cost import is_call, usage_of
from tasks.llm.prompts import SUMMARY_SYSTEM, estimated_tokens, summary_prompt
from tests.fakes.anthropic_server import FakeAnthropic
from tests.support import CALLS, WEEK, Deployment

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
    budget = "0.0055"  # one call reserves ~$0.0052 (max_tokens at the output price), costs less

    stopped = deployment.cli("run", RUN, env={"DIGEST_MAX_COST_USD": budget})

    assert stopped.returncode == 1
    [line] = stopped.stderr.splitlines()
    found = re.fullmatch(
        rf"failed: run digest:{RUN} has spent \$(\d\.\d{{4}}) of its \$0\.0055 budget "
        rf"\(DIGEST_MAX_COST_USD\) and stopped before (summarize:(i\d)); nothing was sent: "
        rf"raise the budget, then `digest retry {RUN}`",
        line,
    )
    assert found, line
    view = deployment.view(RUN)
    costs = [r.result["cost_usd"] for r in view.steps if r.key.startswith("summarize:")]
    assert view.status == "failed"
    assert fake_anthropic.calls == len(costs) >= 1  # no call was made past the budget
    assert found.group(1) == f"{sum(costs):.4f}"
    [item] = [item for item in WEEK if item["id"] == found.group(3)]
    prompt = summary_prompt(Item(item["id"], item["title"], item["body"]))
    reserved = PriceTable.from_env({}).cost(
        "claude-haiku-5-5", estimated_tokens(SUMMARY_SYSTEM, prompt), MAX_TOKENS
    )
    assert reserved is not None
    assert sum(costs) <= float(budget) < sum(costs) + reserved
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


def test_cache_tokens_are_priced_as_writes_and_reads_of_the_input() -> None:
    table = PriceTable.from_env({})
    # The list prices' ratios: a cache write costs 1.25x the input, a read 0.1x.
    assert table.cost("claude-haiku-5-5", 0, 0, cache_write=1_000_000) == pytest.approx(1.25)
    assert table.cost("claude-haiku-5-5", 0, 0, cache_read=1_000_000) == pytest.approx(0.1)
    own = PriceTable.from_env(
        {"DIGEST_PRICES": '{"m": {"input": 1, "output": 2, "cache_write": 3, "cache_read": 4}}'}
    )
    assert own.cost("m", 1e6, 1e6, cache_write=1e6, cache_read=1e6) == pytest.approx(10.0)


def test_a_batch_request_costs_half_cache_writes_and_reads_included() -> None:
    table = PriceTable.from_env({})
    synchronous = table.cost("claude-sonnet-5-5", 1200, 400, cache_write=3000, cache_read=50_000)
    batched = table.cost(
        "claude-sonnet-5-5", 1200, 400, cache_write=3000, cache_read=50_000, batch=True
    )
    assert synchronous is not None and batched == pytest.approx(synchronous / 2)
    assert batched == pytest.approx((1200 * 3 + 400 * 15 + 3000 * 3.75 + 50_000 * 0.3) / 2e6)
    usage = usage_of(
        [
            {
                "input_tokens": 10,
                "output_tokens": 1,
                "model": "m",
                "batch": True,
                "cache_creation_input_tokens": 30,
                "cache_read_input_tokens": 60,
            },
            {"input_tokens": 10, "output_tokens": 1, "model": "m"},
        ]
    )
    assert (usage.batched, usage.cache_write_tokens, usage.cache_read_tokens) == (1, 30, 60)
    assert usage.cache_hit_ratio == pytest.approx(60 / 110)


def test_a_dated_model_id_is_priced_as_its_alias() -> None:
    table = PriceTable.from_env({})
    assert table.cost("claude-haiku-5-5-20261001", 1_000_000, 0) == 1.0
    assert table.cost("claude-haiku-5-5-latest", 1_000_000, 0) is None


# A reply of a thousand words costs about what a call reserves (max_tokens 1024 at the output
# price), so a budget of a few calls lets through exactly the calls that fit.
LONG_REPLY = " ".join(["word"] * 1000)
TIGHT_BUDGET = 0.012  # two haiku calls of ~$0.0051 each, not three


@pytest.fixture
def verbose_api(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAnthropic]:
    with FakeAnthropic(reply=lambda request: LONG_REPLY) as server:
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        yield server


def spend(deployment: Deployment) -> list[float | None]:
    """The recorded cost of every model call of the run, in step order."""
    return [r.result.get("cost_usd") for r in deployment.view(RUN).steps if is_call(r.result)]


@pytest.mark.slow
def test_an_alias_answered_with_a_dated_id_is_priced_and_the_budget_holds(
    deployment: Deployment, verbose_api: FakeAnthropic
) -> None:
    verbose_api.dated_models = {
        "claude-haiku-5-5": "claude-haiku-5-5-20261001",
        "claude-sonnet-5-5": "claude-sonnet-5-5-20261001",
    }
    deployment.env.update(verbose_api.env(), DIGEST_CONCURRENCY="1")

    stopped = deployment.cli("run", RUN, env={"DIGEST_MAX_COST_USD": str(TIGHT_BUDGET)})

    costs = spend(deployment)
    assert None not in costs, costs  # priced as the alias asked for, never as free
    assert stopped.returncode == 1, stopped.stdout + stopped.stderr
    [line] = stopped.stderr.splitlines()
    assert "budget (DIGEST_MAX_COST_USD) and stopped before summarize:i3" in line
    assert verbose_api.calls == len(costs) == 2
    assert sum(c or 0 for c in costs) <= TIGHT_BUDGET
    assert deployment.outbox() == []


@pytest.mark.slow
def test_concurrent_calls_reserve_the_budget_and_cannot_all_pass(
    deployment: Deployment, verbose_api: FakeAnthropic
) -> None:
    verbose_api.delay = 0.3  # three calls in flight together
    deployment.env.update(verbose_api.env(), DIGEST_CONCURRENCY="3")

    stopped = deployment.cli("run", RUN, env={"DIGEST_MAX_COST_USD": str(TIGHT_BUDGET)})

    assert stopped.returncode == 1, stopped.stdout + stopped.stderr
    costs = [c or 0.0 for c in spend(deployment)]
    # The third call waited for the first two to settle, then found no room left.
    assert verbose_api.calls == len(costs) == 2
    assert sum(costs) <= TIGHT_BUDGET  # overshoot: none (the estimate covered each call)
    assert "budget (DIGEST_MAX_COST_USD)" in stopped.stderr
    assert deployment.outbox() == []


@pytest.mark.slow
def test_an_answer_from_a_model_with_no_price_fails_the_run_in_one_line(
    deployment: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    fake_anthropic.dated_models = {"claude-haiku-5-5": "claude-mystery-1"}
    deployment.env.update(fake_anthropic.env(), DIGEST_CONCURRENCY="1")

    failed = deployment.cli("run", RUN, env={"DIGEST_MAX_COST_USD": "1"})

    assert failed.returncode == 1, failed.stdout + failed.stderr
    [line] = failed.stderr.splitlines()
    assert "claude-mystery-1" in line and "has no price" in line and "DIGEST_PRICES" in line
    assert fake_anthropic.calls == 1
    assert deployment.outbox() == []
