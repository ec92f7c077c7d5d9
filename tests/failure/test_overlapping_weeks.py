"""Overlapping weeks never put one item in two emails, and lose none.

After an outage the dispatcher enqueues several weeks at once. Here week 45 stops right after
selecting (a crash), week 46 runs meanwhile, then week 45 resumes: each item is claimed by one
run when it is selected, so week 46 finds nothing of its own and week 45 sends them all, once.
A run that ends without sending (rejected) lets its claims go, and the next week covers them.
"""

from __future__ import annotations

import json

import pytest

from tests.support import TITLES, Deployment

pytestmark = pytest.mark.slow


def emails(deployment: Deployment) -> list[str]:
    return [json.loads(path.read_text())["body"] for path in deployment.outbox()]


def test_overlapping_weeks_send_each_item_once(deployment: Deployment) -> None:
    deployment.env.update(DIGEST_OFFLINE="1")
    crashed = deployment.cli("run", "2026-w45", env={"CRASH": "after:select"})
    assert crashed.returncode == 137

    overlapping = deployment.cli("run", "2026-w46")
    assert overlapping.stdout.splitlines()[-1] == (
        "nothing-new: 0 new items, 0 model calls in this attempt; "
        "8 are held by digest:2026-w45 (running)"
    )
    resumed = deployment.cli("run", "2026-w45")
    assert resumed.stdout.splitlines()[-1].startswith("sent: 8 items")

    [body] = emails(deployment)
    assert all(body.count(f"* {title}:") == 1 for title in TITLES)
    select = deployment.view("2026-w46").step("select")
    assert select is not None and select.result == []
    assert deployment.client().hlen(f"{deployment.env['DIGEST_KEY_PREFIX']}:digest:claims") == 0


def test_a_rejected_week_lets_its_items_go_to_the_next(deployment: Deployment) -> None:
    deployment.env.update(DIGEST_OFFLINE="1")
    waiting = deployment.cli("run", "2026-w45", "--approval")
    assert "waiting: signal approval" in waiting.stdout
    meanwhile = deployment.cli("run", "2026-w46")
    assert meanwhile.stdout.splitlines()[-1] == (  # claimed, and said so
        "nothing-new: 0 new items, 0 model calls in this attempt; "
        "8 are held by digest:2026-w45 (waiting)"
    )

    assert deployment.cli("reject", "2026-w45", "--reason", "no").returncode == 0
    ended = deployment.cli("run", "2026-w45")
    assert ended.stdout.splitlines()[-1].startswith("rejected: 0 items")
    following = deployment.cli("run", "2026-w47")
    assert following.stdout.splitlines()[-1].startswith("sent: 8 items")
    [body] = emails(deployment)
    assert all(body.count(f"* {title}:") == 1 for title in TITLES)
