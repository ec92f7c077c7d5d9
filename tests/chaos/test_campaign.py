"""A tiny campaign end to end: the real deployment, a seed's faults, the checker's verdict.

Slow (real processes, about a minute and a half): it proves the campaign starts, breaks,
quiets and judges a deployment, and that current code keeps the promise under seed 1.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.chaos.__main__ import run_seed

pytestmark = pytest.mark.slow


@pytest.mark.timeout(400)
def test_a_short_campaign_keeps_the_promise_and_logs_its_faults(tmp_path: Path) -> None:
    status = run_seed(1, 40.0, tmp_path)
    directory = tmp_path / "seed-1"
    violations = json.loads((directory / "violations.json").read_text())
    assert status == 0, violations
    timeline = [
        json.loads(line) for line in (directory / "timeline.jsonl").read_text().splitlines()
    ]
    kinds = {entry["kind"] for entry in timeline}
    assert {"week", "dispatcher", "settled"} <= kinds
    observation = json.loads((directory / "observation.json").read_text())
    assert observation["emails"], "a campaign that sent nothing checked nothing"
    assert observation["weeks"] == sorted(observation["weeks"])
