"""Real digest runs replayed: as a fixture in this process, before a deploy, as a dry-run fork.

Each run is made by the ``digest`` command against the fake Anthropic API over real HTTP, in a
deployment of its own (embedded Valkey, file outbox); model calls are counted at the server.
The fake API is set up before the deployment, which copies the environment it points at.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import redis

from journal.testing import replay
from journal.testing.fixture import Fixture
from tasks.job.workflow import digest, preview
from tasks.llm.cost import is_call
from tasks.llm.prompts import INTRO_PROMPT
from tasks.runtime import storeless
from tests.fakes.anthropic_server import FakeAnthropic
from tests.support import ROOT, Deployment

pytestmark = pytest.mark.slow
RUN = "2026-w42"
COLUMN = f"{f'digest:{RUN}':28}"  # the run, as the report pads it


def everything(client: redis.Redis) -> dict[bytes, Any]:
    """Every key of the store with its value (DUMP) and its expiry, but the rate limiter's.

    The model API's shared limiter (``{model-api:...}:limits``) is the account's state, not
    the run's: its expiry counts down by itself, and a dry run's live model call is a real
    request the account's limits must see.
    """
    return {
        key: (client.dump(key), client.pttl(key))
        for key in client.scan_iter(count=1000)
        if b"{model-api:" not in key
    }


def sent(deployment: Deployment) -> dict[str, str]:
    (path,) = deployment.outbox()
    email = json.loads(path.read_text())
    return {name: email[name] for name in ("to", "subject", "body")}


def test_an_exported_run_replays_here_with_no_model_call_and_the_same_email(
    fake_anthropic: FakeAnthropic, deployment: Deployment, tmp_path: Path
) -> None:
    assert deployment.cli("run", RUN).returncode == 0
    exported = deployment.cli("export", RUN, "-o", str(tmp_path / "run.json"))
    assert exported.returncode == 0, exported.stderr
    assert exported.stdout == f"exported digest:{RUN}: 13 steps to {tmp_path / 'run.json'}\n"
    recorded = Fixture.read(tmp_path / "run.json")
    made = fake_anthropic.calls  # 8 summaries and the opening

    with storeless(deployment.config):
        replayed = replay(digest, recorded)
        drafted = replay(preview, recorded)

    assert made == 9 and fake_anthropic.calls == made
    assert replayed.result == {**json.loads(recorded.meta["outcome"]), "model_calls": 0}
    assert replayed.ran == () and replayed.unreplayed == ()
    assert drafted.result["email"] == sent(deployment)


COMPOSE = (
    '"compose",\n            lambda: compose(runtime, run, kept, calls, walk.chain, deadline),'
)
RENAMED = COMPOSE.replace('"compose"', '"compose-intro"')
GATED = COMPOSE.replace(
    '"compose"', '"compose-intro" if run.version("intro-step", 1) >= 1 else "compose"'
)


def edited(tmp_path: Path, find: str, replace: str) -> dict[str, str]:
    """The environment of a ``digest`` that runs an edited copy of the app's code."""
    copy = tmp_path / f"edited-{len(list(tmp_path.glob('edited-*')))}"
    shutil.copytree(ROOT / "tasks", copy / "tasks")
    source = copy / "tasks" / "job" / "summarize.py"
    text = source.read_text(encoding="utf-8")
    assert text.count(find) == 1, f"tasks/job/summarize.py no longer holds {find!r}"
    source.write_text(text.replace(find, replace), encoding="utf-8")
    return {"PYTHONPATH": str(copy)}  # found before the installed package


def test_check_replay_reports_a_waiting_runs_drift_after_an_edit_and_passes_with_a_gate(
    fake_anthropic: FakeAnthropic, deployment: Deployment, tmp_path: Path
) -> None:
    assert deployment.cli("run", RUN, "--approval").returncode == 0
    assert deployment.cli("run", "2026-w43").returncode == 0  # ended: not checked by default
    client = deployment.client()
    before = everything(client)

    clean = deployment.cli("check-replay")
    drifted = deployment.cli("check-replay", env=edited(tmp_path, COMPOSE, RENAMED))
    gated = deployment.cli("check-replay", env=edited(tmp_path, COMPOSE, GATED))

    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert clean.stdout.splitlines() == [
        f"{COLUMN} waiting   replays cleanly, stops waiting at signal:approval",
        "1 runs replayed, 0 would break",
    ]
    assert drifted.returncode == 1, drifted.stdout + drifted.stderr
    assert drifted.stdout.splitlines() == [
        f"{COLUMN} waiting   DRIFTS at step 10: the journal recorded 'compose', the code asks "
        "for 'compose-intro'; gate the change with run.version(KEY, N) (this run would get 0 "
        "and keep the old path)",
        "1 runs replayed, 1 would break",
    ]
    assert gated.returncode == 0, gated.stdout + gated.stderr
    assert gated.stdout.splitlines() == [
        f"{COLUMN} waiting   replays cleanly, stops waiting at signal:approval; kept on the "
        "old path by version gate intro-step=0",
        "1 runs replayed, 0 would break",
    ]
    assert everything(client) == before and fake_anthropic.calls == 9  # read-only


def test_check_replay_refuses_a_run_that_does_not_exist(deployment: Deployment) -> None:
    refused = deployment.cli("check-replay", "2026-w01")

    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr == "digest: run digest:2026-w01: no such run\n"


def test_a_dry_run_fork_prints_its_email_beside_the_runs_and_writes_nothing(
    fake_anthropic: FakeAnthropic, deployment: Deployment
) -> None:
    assert deployment.cli("run", RUN).returncode == 0
    client = deployment.client()
    before, outbox = everything(client), deployment.outbox()
    rewritten = FakeAnthropic(reply=lambda request: "A new opening, from a new prompt.").start()
    try:
        fork = deployment.cli("fork", RUN, "--from", "compose", "--dry-run", env=rewritten.env())
    finally:
        rewritten.stop()

    assert fork.returncode == 0, fork.stderr
    lines = fork.stdout.splitlines()
    assert lines[:3] == [
        f"--- digest:{RUN} (recorded)",
        f"+++ digest:{RUN} forked from compose (dry run)",
        "@@ -1,7 +1,7 @@",
    ]
    assert "-opening for Dark mode, Faster search, CSV export for reports, SSO for the " in (
        fork.stdout
    )
    assert "+A new opening, from a new prompt.\n" in fork.stdout
    assert re.fullmatch(
        rf"dry run: a fork of digest:{RUN} from compose would run compose \(1 model calls made "
        r"now, \$0\.\d{4}\); nothing was written, sent or charged",
        lines[-1],
    )
    assert rewritten.calls == 1 and fake_anthropic.calls == 9
    assert everything(client) == before  # no scratch journal left, no claim, no seen item
    assert deployment.outbox() == outbox


def test_dry_run_forks_under_a_budget_charge_nothing_that_lasts(
    fake_anthropic: FakeAnthropic, deployment: Deployment
) -> None:
    assert deployment.cli("run", RUN).returncode == 0
    client = deployment.client()
    before = everything(client)
    calls = [r.result for r in deployment.view(RUN).steps if is_call(r.result)]
    spent = sum(float(call["cost_usd"]) for call in calls)
    # A thousand-word opening costs about what the fork's call holds (~$0.017: max_tokens at
    # the intro model's output price): the budget has room for one such call beyond what the
    # run spent, not two. Previews charged to the run would be refused from the second on.
    budget = {"DIGEST_MAX_COST_USD": f"{spent + 0.025:.6f}"}
    verbose = FakeAnthropic(reply=lambda request: " ".join(["word"] * 1000)).start()
    try:
        env = verbose.env() | budget
        previews = [
            deployment.cli("fork", RUN, "--from", "compose", "--dry-run", env=env) for _ in range(3)
        ]
    finally:
        verbose.stop()

    assert [fork.returncode for fork in previews] == [0, 0, 0], previews[-1].stderr
    assert verbose.calls == 3
    lines = {fork.stdout.splitlines()[-1] for fork in previews}
    assert len(lines) == 1, lines  # the same cost each time: nothing accumulated
    (line,) = lines
    assert re.search(r"made now, \$0\.01\d\d\); nothing was written, sent or charged$", line)
    assert everything(client) == before  # no usage hash, with or without an expiry


def test_show_names_the_model_steps_recorded_under_another_prompt_version(
    fake_anthropic: FakeAnthropic, deployment: Deployment
) -> None:
    assert deployment.cli("run", RUN).returncode == 0
    assert "prompt   " not in deployment.cli("show", RUN).stdout  # all under today's prompts
    # What a run composed before the intro prompt was edited holds: an older version.
    client = deployment.client()
    steps = deployment.runtime().journal.keys("digest", RUN).steps
    compose = json.loads(client.hget(steps, "compose") or b"")
    compose["result"]["prompt"] = "intro@000000000000"
    client.hset(steps, "compose", json.dumps(compose))

    shown = deployment.cli("show", RUN).stdout

    assert f"prompt   compose ran under intro@000000000000; the code now has {INTRO_PROMPT}\n" in (
        shown
    )
    assert "summarize:i1" not in shown.split("prompt   ")[1]
