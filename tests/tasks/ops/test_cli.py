"""The ``digest`` command as a user runs it: a real process, killed by ``CRASH``, resumed.

Each test has its own deployment (state dir, embedded Valkey, key prefix, lease TTL of 2 s);
runs of the tutorial transcript use the offline summarizer, runs that count model calls use the
real SDK against the fake Anthropic server.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from journal import Run
from journal.ops.views import inspect_run
from tests.fakes.anthropic_server import FakeAnthropic
from tests.support import BIN, TITLES, Deployment, as_bytes, execute, wait_until

pytestmark = pytest.mark.slow

RUN = "2026-w42"
OFFLINE_NOTE = "  (no ANTHROPIC_API_KEY: using the offline summarizer)\n"

CRASHED = """\
  ran      select
  ran      summarize:i1
  ran      summarize:i2
  ran      summarize:i3
  ** simulated crash at after:summarize:i3 **
"""

RESUMED = """\
  replayed select
  replayed summarize:i1
  replayed summarize:i2
  replayed summarize:i3
  ran      summarize:i4
  ran      summarize:i5
  ran      summarize:i6
  ran      summarize:i7
  ran      summarize:i8
  ran      compose
  ran      send
  ran      mark-seen
  ran      done
sent: 8 items, 6 offline summaries (no model calls) in this attempt, email sent \
(digest-2026-w42)
"""

SENT_TWICE = """\
  ran      send
  ran      mark-seen
  ran      done
sent: 8 items, 0 model calls in this attempt, email already sent earlier, not resent \
(digest-2026-w42)
"""


def offline(deployment: Deployment, **env: str) -> None:
    """No API key in the processes' environment: the CLI summarizes offline."""
    deployment.env.pop("ANTHROPIC_API_KEY", None)
    deployment.env.pop("ANTHROPIC_BASE_URL", None)
    deployment.env.update(env)


def wait_for_lease_expiry(deployment: Deployment, run_id: str = RUN) -> None:
    journal = deployment.runtime().journal
    wait_until(
        lambda: inspect_run(journal, "digest", run_id).lease_holder is None,
        10,
        f"the crashed run's lease on {run_id} to expire",
    )


def prefix_keys(deployment: Deployment) -> list[Any]:
    return deployment.client().keys(f"{deployment.env['DIGEST_KEY_PREFIX']}:*")


def test_the_tutorial_transcript_crash_resume_rerun_and_next_week(
    deployment: Deployment,
) -> None:
    offline(deployment, DIGEST_CONCURRENCY="1")
    crashed = deployment.cli("run", RUN, env={"CRASH": "after:summarize:i3"})
    assert (crashed.returncode, crashed.stdout, crashed.stderr) == (137, CRASHED, OFFLINE_NOTE)
    assert deployment.view(RUN).lease_holder is not None  # a kill leaves the lease behind
    wait_for_lease_expiry(deployment)

    resumed = deployment.cli("run", RUN)
    assert (resumed.returncode, resumed.stdout, resumed.stderr) == (0, RESUMED, OFFLINE_NOTE)
    assert [p.name for p in deployment.outbox()] == ["digest-2026-w42.json"]

    again = deployment.cli("run", RUN)
    assert (again.returncode, again.stdout) == (
        0,
        "already-done: ended earlier (sent: 8 items, email sent (digest-2026-w42)); "
        "nothing ran in this attempt\n",
    )
    next_week = deployment.cli("run", "2026-w43")
    assert (next_week.returncode, next_week.stdout) == (
        0,
        "  ran      select\n  ran      done\nnothing-new: 0 items, 0 model calls in this attempt\n",
    )
    assert len(deployment.outbox()) == 1


def test_a_crash_after_sending_resumes_without_sending_again(deployment: Deployment) -> None:
    offline(deployment, DIGEST_CONCURRENCY="1")
    crashed = deployment.cli("run", RUN, env={"CRASH": "before-save:send"})
    assert crashed.returncode == 137
    assert crashed.stdout.endswith(
        "  ran      compose\n  ** simulated crash at before-save:send **\n"
    )
    assert [p.name for p in deployment.outbox()] == ["digest-2026-w42.json"]
    assert deployment.view(RUN).step("send") is None
    wait_for_lease_expiry(deployment)

    resumed = deployment.cli("run", RUN)
    assert resumed.returncode == 0
    replayed = [f"  replayed summarize:i{n}" for n in range(1, 9)]
    assert resumed.stdout == "\n".join(
        ["  replayed select", *replayed, "  replayed compose", SENT_TWICE]
    )
    assert [p.name for p in deployment.outbox()] == ["digest-2026-w42.json"]
    send = deployment.view(RUN).step("send")
    assert send is not None
    assert send.result == {"id": "digest-2026-w42", "sent": False}


def test_with_the_model_api_a_crash_costs_only_the_calls_in_flight(
    deployment: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    deployment.env.update(fake_anthropic.env(), DIGEST_CONCURRENCY="3")
    crashed = deployment.cli("run", RUN, env={"CRASH": "after:summarize:i3"})
    assert crashed.returncode == 137
    first_attempt = fake_anthropic.calls
    recorded = [r.key for r in deployment.view(RUN).steps if r.key.startswith("summarize:")]
    assert "summarize:i3" in recorded
    lost_in_flight = first_attempt - len(recorded)
    assert 0 <= lost_in_flight <= 2  # the two other slots, at most
    wait_for_lease_expiry(deployment)

    fake_anthropic.fail_next(429, headers={"retry-after": "0"}, contains="<updates>")
    resumed = deployment.cli("run", RUN)
    second_attempt = fake_anthropic.calls - first_attempt
    # The summaries not recorded, then compose twice (its first answer was a 429).
    assert second_attempt == (8 - len(recorded)) + 2
    assert resumed.stdout.count("  replayed summarize:") == len(recorded)
    assert resumed.stdout.count("  ran      summarize:") == 8 - len(recorded)
    assert resumed.stdout.endswith(
        f"sent: 8 items, {second_attempt} model calls in this attempt, "
        "email sent (digest-2026-w42)\n"
    )
    assert fake_anthropic.calls == 9 + 1 + lost_in_flight
    assert len(deployment.outbox()) == 1

    shown = deployment.cli("show", RUN)
    as_json = json.loads(deployment.cli("show", RUN, "--json").stdout)
    assert shown.returncode == 0
    steps: list[dict[str, Any]] = as_json["steps"]
    assert (as_json["status"], as_json["lease"]["holder"]) == ("done", None)
    summaries = [f"summarize:i{n}" for n in range(1, 9)]
    assert sorted(s["key"] for s in steps) == sorted(
        ["select", *summaries, "compose", "send", "mark-seen", "done"]
    )
    assert {s["key"]: s["attempt"] for s in steps if s["attempt"] != 1} == {"compose": 2}
    tokens = [0, 0]
    spent = 0.0
    for step in steps:
        usage = cost = ""
        if step["key"].startswith("summarize:") or step["key"] == "compose":
            result = step["result"]
            assert result["input_tokens"] > 0 and result["output_tokens"] > 0
            tokens = [tokens[0] + result["input_tokens"], tokens[1] + result["output_tokens"]]
            usage = f"{result['input_tokens']}+{result['output_tokens']} tok"
            # The default prices, per million tokens: haiku 1/5 summarizes, sonnet 3/15 composes.
            rate = (3, 15) if step["key"] == "compose" else (1, 5)
            price = (result["input_tokens"] * rate[0] + result["output_tokens"] * rate[1]) / 1e6
            assert result["cost_usd"] == pytest.approx(price)
            spent += price
            cost = f"${price:.4f}"
        finished = datetime.fromisoformat(step["finished_at"])
        when = finished.strftime("%Y-%m-%d %H:%M:%S UTC")
        assert (
            f"\n{step['key']:22} {when:23} {step['attempt']:>3} {usage:>13} {cost:>9}  "
            in shown.stdout
        )
    assert shown.stdout.endswith(
        f"\n13 steps, 9 model calls, {tokens[0]} input + {tokens[1]} output tokens, ${spent:.4f}\n"
    )
    status = "status   done: sent: 8 items, email sent (digest-2026-w42)"
    assert f"{status}\nlease    free\n" in shown.stdout

    runs = deployment.cli("runs")
    [line] = runs.stdout.splitlines()
    assert line.startswith(f"{'digest:' + RUN:32} {'done':10} updated ")


def test_a_map_prints_and_crashes_in_item_order_and_keeps_every_answer_it_paid_for(
    deployment: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    # Three at a time: i3 answers at once, i2 after 0.3 s, i1 after 0.6 s; the rest after
    # 1.5 s, still in flight when the crash after i2 comes.
    deployment.env.update(fake_anthropic.env(), DIGEST_CONCURRENCY="3")
    for title, seconds in zip(TITLES, [0.6, 0.3, 0, 1.5, 1.5, 1.5, 1.5, 1.5], strict=True):
        if seconds:
            fake_anthropic.delay_when(f'<update title="{title}">', seconds)
    crashed = deployment.cli("run", RUN, env={"CRASH": "after:summarize:i2"})
    assert (crashed.returncode, crashed.stderr) == (137, "")
    assert crashed.stdout == (
        "  ran      select\n  ran      summarize:i1\n  ran      summarize:i2\n"
        "  ** simulated crash at after:summarize:i2 **\n"
    )
    # i3 answered first: recorded then, not held back until i1 and i2 were.
    assert fake_anthropic.calls_for(TITLES[2]) == 1
    assert [r.key for r in deployment.view(RUN).steps] == [
        "select",
        "summarize:i1",
        "summarize:i2",
        "summarize:i3",
    ]

    resumed = deployment.cli("run", RUN)  # at once: the crashed holder died on this host
    summaries = [f"  ran      summarize:i{n}" for n in range(4, 9)]
    assert resumed.stdout.splitlines() == [
        "  replayed select",
        "  replayed summarize:i1",
        "  replayed summarize:i2",
        "  replayed summarize:i3",
        *summaries,
        "  ran      compose",
        "  ran      send",
        "  ran      mark-seen",
        "  ran      done",
        "sent: 8 items, 6 model calls in this attempt, email sent (digest-2026-w42)",
    ]
    assert fake_anthropic.calls_for(TITLES[2]) == 2  # its summary once, and the opening
    seqs = {r.key: r.seq for r in deployment.view(RUN).steps}
    assert [seqs[f"summarize:i{n}"] for n in range(1, 9)] == sorted(
        seqs[f"summarize:i{n}"] for n in range(1, 9)
    )


def test_a_run_leased_by_a_live_worker_exits_3(
    deployment: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    deployment.env.update(fake_anthropic.env())
    journal = deployment.runtime().journal
    entered, finish = threading.Event(), threading.Event()

    def body(run: Run) -> dict[str, Any]:
        entered.set()
        finish.wait(30)
        return {}

    holder = threading.Thread(target=execute, args=(journal, "digest", RUN, body))
    holder.start()
    try:
        assert entered.wait(10)
        busy = deployment.cli("run", RUN)
    finally:
        finish.set()
        holder.join(timeout=10)
    assert busy.returncode == 3
    assert busy.stdout == ""
    [line] = busy.stderr.splitlines()
    assert line.startswith(f"digest: run digest:{RUN} is leased by another")
    assert "(fence 1)" in line
    assert fake_anthropic.calls == 0


def test_a_bad_items_file_exits_2_and_journals_nothing(
    deployment: Deployment, fake_anthropic: FakeAnthropic, tmp_path: Path
) -> None:
    deployment.env.update(fake_anthropic.env())
    broken = tmp_path / "broken.json"
    broken.write_text('[{"id": "i1", "title": "Dark mode"', encoding="utf-8")
    bad = deployment.cli("run", RUN, env={"DIGEST_ITEMS": str(broken)})
    assert (bad.returncode, bad.stdout) == (2, "")
    assert bad.stderr == (
        f"digest: {broken}: not valid JSON at line 1 column 35 (Expecting ',' delimiter); "
        "fix the syntax\n"
    )
    missing = tmp_path / "missing.json"
    absent = deployment.cli("run", RUN, "--items", str(missing))
    assert absent.returncode == 2
    assert absent.stderr == (
        f"digest: {missing}: file not found; create it or set DIGEST_ITEMS to this week's "
        "updates file\n"
    )
    assert prefix_keys(deployment) == []
    assert fake_anthropic.calls == 0


def test_a_started_run_resumes_from_its_frozen_list_when_the_items_file_is_gone(
    deployment: Deployment, tmp_path: Path
) -> None:
    items = tmp_path / "items.json"
    items.write_text(Path(deployment.env["DIGEST_ITEMS"]).read_text(encoding="utf-8"))
    offline(deployment, DIGEST_ITEMS=str(items), DIGEST_CONCURRENCY="1")
    crashed = deployment.cli("run", RUN, env={"CRASH": "after:summarize:i3"})
    assert crashed.returncode == 137
    items.unlink()  # the list is frozen in the journal: the file is not read again
    wait_for_lease_expiry(deployment)

    resumed = deployment.cli("run", RUN)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.startswith("  replayed select\n")
    assert "sent: 8 items" in resumed.stdout


def test_batch_with_no_api_key_is_refused_before_a_run_starts(deployment: Deployment) -> None:
    offline(deployment)
    refused = deployment.cli("run", RUN, "--batch")
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr.startswith("digest: --batch needs ANTHROPIC_API_KEY: ")
    assert prefix_keys(deployment) == []


def test_an_invalid_run_id_exits_2(deployment: Deployment) -> None:
    invalid = deployment.cli("run", "2026 w42")
    assert (invalid.returncode, invalid.stdout) == (2, "")
    assert invalid.stderr == (
        "digest: invalid run id '2026 w42': it contains ' '; use 1-128 characters of letters, "
        "digits, '.', '_' or '-' (for example 2026-w42)\n"
    )


def test_retry_is_refused_for_a_run_that_is_not_failed_and_creates_nothing(
    deployment: Deployment,
) -> None:
    offline(deployment, CRASH="after:summarize:i2")
    journal = deployment.runtime().journal

    never = deployment.cli("run", "2026-w40", "--retry")
    assert (never.returncode, never.stdout) == (2, "")
    assert never.stderr.splitlines()[-1] == "digest: run digest:2026-w40: no such run"
    assert prefix_keys(deployment) == []  # no meta, no index entry for a run that never was

    crashed = deployment.cli("run", RUN)
    assert crashed.returncode == 137
    wait_for_lease_expiry(deployment)
    meta = journal.meta(journal.keys("digest", RUN))
    running = deployment.cli("run", RUN, "--retry", env={"CRASH": ""})
    assert (running.returncode, running.stdout) == (2, "")
    assert running.stderr.splitlines()[-1] == (
        f"digest: run digest:{RUN}: it is running; only a failed run can be retried"
    )
    assert journal.meta(journal.keys("digest", RUN)) == meta

    finished = deployment.cli("run", RUN, env={"CRASH": ""})
    assert finished.returncode == 0, finished.stderr
    meta = journal.meta(journal.keys("digest", RUN))
    done = deployment.cli("run", RUN, "--retry", env={"CRASH": ""})
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.splitlines()[-1] == (
        f"digest: run digest:{RUN}: it is done; only a failed run can be retried"
    )
    assert journal.meta(journal.keys("digest", RUN)) == meta  # not reopened
    assert len(deployment.outbox()) == 1


def test_show_and_runs_print_journal_text_with_its_control_characters_escaped(
    deployment: Deployment,
) -> None:
    offline(deployment)
    assert deployment.cli("run", RUN).returncode == 0
    journal = deployment.runtime().journal
    keys = journal.keys("digest", RUN)
    record = json.loads(as_bytes(journal.client.hget(keys.steps, "summarize:i1")))
    record["result"]["text"] = "Sure.\x1b]0;owned\x07\x1b[2J\rhidden\x9b31m"
    journal.client.hset(keys.steps, "summarize:i1", json.dumps(record))
    journal.client.hset(
        keys.meta,
        mapping={
            "status": "retrying",
            "last_error": "boom\x1b[8m\nstatus   done",
            "failures": "2\x1b[5m",
        },
    )

    shown = deployment.cli("show", RUN)
    listed = deployment.cli("runs")

    assert shown.returncode == listed.returncode == 0, shown.stderr + listed.stderr
    for out in (shown.stdout, listed.stdout):
        assert not {"\x1b", "\x07", "\r", "\x9b"} & set(out), repr(out)
    # (the preview folds whitespace, the carriage return included, into single spaces)
    assert "Sure.\\x1b]0;owned\\x07\\x1b[2J hidden\\x9b31m" in shown.stdout
    assert "error    boom\\x1b[8m\\nstatus   done\n" in shown.stdout  # one line, not two
    [status] = [line for line in shown.stdout.splitlines() if line.startswith("status")]
    assert status.startswith("status   retrying")  # the stored "status   done" forged no line
    assert "transient failures so far: 2\\x1b[5m)" in listed.stdout


def imported(stderr: str) -> list[str]:
    """Top-level packages a process imported, from its ``-X importtime`` report, in order."""
    return [
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    ]


def test_only_a_model_call_imports_the_sdk(
    deployment: Deployment, fake_anthropic: FakeAnthropic
) -> None:
    # Importing the SDK takes seconds; a command that makes no model call must not pay it,
    # not even with a key set. Celery is as heavy and only `digest enqueue` needs it.
    deployment.env.update(fake_anthropic.env(), PYTHONPROFILEIMPORTTIME="1")
    first = deployment.cli("run", RUN)
    assert first.returncode == 0
    assert "anthropic" in imported(first.stderr)  # the probe sees the SDK when it is imported
    assert fake_anthropic.calls == 9
    for args in (["--help"], ["show", RUN], ["runs"], ["run", RUN]):
        done = deployment.cli(*args)
        assert done.returncode == 0, done.stderr
        heavy = {"anthropic", "celery", "httpx", "pydantic"} & set(imported(done.stderr))
        assert (args, heavy) == (args, set())
    assert fake_anthropic.calls == 9


def test_every_command_takes_the_ids_it_prints_and_an_unknown_run_is_one_line_exit_2(
    deployment: Deployment,
) -> None:
    offline(deployment)
    assert deployment.cli("run", RUN).returncode == 0
    listed = deployment.cli("runs")
    assert listed.stdout.startswith(f"digest:{RUN} ")
    assert "sent: 8 items" in listed.stdout

    by_printed_id = deployment.cli("show", f"digest:{RUN}")
    by_run_id = deployment.cli("show", RUN)
    assert (by_printed_id.returncode, by_printed_id.stderr) == (0, "")
    assert by_printed_id.stdout == by_run_id.stdout
    assert by_printed_id.stdout.splitlines()[1] == (
        "status   done: sent: 8 items, email sent (digest-2026-w42)"
    )
    rerun = deployment.cli("run", f"digest:{RUN}")
    assert rerun.returncode == 0

    for command in (["show"], ["show", "--json"]):
        unknown = deployment.cli(*command, "digest:2026-w41")
        assert (unknown.returncode, unknown.stdout) == (2, ""), command
        assert unknown.stderr == (
            "digest: no run digest:2026-w41 in the journal: it never started; `digest runs` "
            "lists the runs, `digest run 2026-w41` starts it\n"
        ), command
    for command in (["cancel"], ["retry"], ["approve"], ["fork", "--from", "send"]):
        unknown = deployment.cli(*command, "digest:2026-w41")
        assert (unknown.returncode, unknown.stdout) == (2, ""), command
        assert len(unknown.stderr.splitlines()) == 1, command
        assert "digest:2026-w41" in unknown.stderr, command
    other = deployment.cli("show", "orders:2026-w42")
    assert (other.returncode, other.stdout) == (2, "")
    assert "orders:2026-w42" in other.stderr and "digest" in other.stderr


def test_runs_pages_through_the_listing_with_limit_status_and_before(
    deployment: Deployment,
) -> None:
    offline(deployment)
    weeks = [f"2026-w{n:02d}" for n in range(30, 37)]
    for week in weeks:  # the first sends, the rest find nothing new
        assert deployment.cli("run", week).returncode == 0
    newest_first = [f"digest:{week}" for week in reversed(weeks)]

    seen: list[str] = []
    page = deployment.cli("runs", "--limit", "3")
    while True:
        assert page.returncode == 0, page.stderr
        seen += [line.split()[0] for line in page.stdout.splitlines()]
        more = re.fullmatch(r"more runs: digest runs --limit 3 --before (\S+)\n", page.stderr)
        if not more:
            assert page.stderr == ""
            break
        page = deployment.cli("runs", "--limit", "3", "--before", more.group(1))
    assert seen == newest_first

    done = deployment.cli("runs", "--status", "done", "--limit", "100")
    assert [line.split()[0] for line in done.stdout.splitlines()] == newest_first
    assert done.stderr == ""
    assert deployment.cli("runs", "--status", "failed").stdout == ""

    for bad in (["--limit", "0"], ["--before", "yesterday"]):
        refused = deployment.cli("runs", *bad)
        assert (refused.returncode, refused.stdout) == (2, "")
        assert len(refused.stderr.splitlines()) == 1, refused.stderr


def test_purge_removes_only_ended_runs_older_than_asked_and_a_dry_run_nothing(
    deployment: Deployment,
) -> None:
    offline(deployment)
    assert deployment.cli("run", "2026-w40", "--approval").stdout.startswith("  ran      select")
    for ended in ("2026-w41", "2026-w37"):  # nothing new: w40 holds every item
        assert deployment.cli("run", ended).returncode == 0
    crashed = deployment.cli("run", "2026-w38", env={"CRASH": "after:select"})
    assert crashed.returncode == 137  # left running, its lease expiring
    before = {run: deployment.view(run).status for run in ("2026-w40", "2026-w38")}
    assert before == {"2026-w40": "waiting", "2026-w38": "running"}

    fresh = deployment.cli("purge", "--older-than", "1d")
    assert (fresh.returncode, fresh.stdout) == (0, "purged 0 runs\n"), fresh.stderr

    dry = deployment.cli("purge", "--older-than", "0s", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == [
        "would purge digest:2026-w41 (done)",
        "would purge digest:2026-w37 (done)",
        "would purge 2 runs; nothing deleted (--dry-run)",
    ]
    assert deployment.view("2026-w41").status == "done"

    purged = deployment.cli("purge", "--older-than", "0s")
    assert purged.stdout.splitlines()[-1] == "purged 2 runs", purged.stderr
    for gone in ("2026-w41", "2026-w37"):
        assert deployment.cli("show", gone).returncode == 2
        assert deployment.client().keys(f"*{{digest:{gone}}}*") == []
    listed = deployment.cli("runs").stdout
    assert [line.split()[0] for line in listed.splitlines()] == [
        "digest:2026-w38",
        "digest:2026-w40",
    ]
    # A cancelled run still holds the items it selected; purged, it lets the next run have them.
    assert deployment.cli("cancel", "2026-w40").returncode == 0
    assert deployment.cli("purge", "--older-than", "0s").stdout.splitlines() == [
        "purged digest:2026-w40 (cancelled)",
        "purged 1 run",
    ]
    after = deployment.cli("run", "2026-w43")
    assert after.stdout.splitlines()[-1].startswith("sent: 8 items"), after.stdout

    for bad in ("soon", "-1d", "10"):
        refused = deployment.cli("purge", "--older-than", bad)
        assert (refused.returncode, refused.stdout) == (2, ""), bad
        assert len(refused.stderr.splitlines()) == 1, refused.stderr


def test_the_command_line_names_its_version_and_every_argument_and_default() -> None:
    version = subprocess.run([str(BIN / "digest"), "--version"], capture_output=True, text=True)
    assert (version.returncode, version.stdout) == (0, "digest 0.1.0\n")
    top = subprocess.run([str(BIN / "digest"), "--help"], capture_output=True, text=True)
    commands = re.findall(r"^    (\w+)\s", top.stdout, re.MULTILINE)
    assert {"run", "show", "runs", "purge", "console"} <= set(commands)
    for command in commands:
        shown = subprocess.run(
            [str(BIN / "digest"), command, "--help"], capture_output=True, text=True
        )
        assert shown.returncode == 0, command
        listed = shown.stdout.split("\n\n", 2)[-1]
        # Every argument line carries its help, on the same line or the next.
        for line, after in zip(listed.splitlines(), [*listed.splitlines()[1:], ""], strict=True):
            if re.match(r"^  \S", line) and "-h, --help" not in line:
                assert re.search(r"\S\s{2,}\S", line.strip()) or after.startswith(" " * 10), (
                    command,
                    line,
                )
    console = subprocess.run(
        [str(BIN / "digest"), "console", "--help"], capture_output=True, text=True
    )
    assert "default: 8765" in console.stdout
    run = subprocess.run([str(BIN / "digest"), "run", "--help"], capture_output=True, text=True)
    assert "failed, parked or retrying" in " ".join(run.stdout.split())


def test_show_json_is_typed_with_a_schema_version_and_a_rerun_says_what_was_done(
    deployment: Deployment,
) -> None:
    offline(deployment)
    first = deployment.cli("run", RUN)
    assert first.stdout.splitlines()[-1] == (
        "sent: 8 items, 9 offline summaries (no model calls) in this attempt, "
        "email sent (digest-2026-w42)"
    )
    again = deployment.cli("run", RUN)
    assert again.stdout == (
        "already-done: ended earlier (sent: 8 items, email sent (digest-2026-w42)); "
        "nothing ran in this attempt\n"
    )
    text = deployment.cli("show", RUN).stdout
    assert "13 steps, 0 model calls (9 offline summaries)" in text
    send_line = next(line for line in text.splitlines() if line.startswith("send "))
    assert send_line.endswith("email sent (digest-2026-w42)")

    shown = json.loads(deployment.cli("show", RUN, "--json").stdout)
    assert shown["schema"] == 1
    assert shown["outcome"] == {
        "status": "sent",
        "items": 8,
        "model_calls": 0,  # the offline summarizer calls no model
        "offline_summaries": 9,
        "receipt": {"id": "digest-2026-w42", "sent": True},
    }
    assert isinstance(shown["meta"]["starts"], int)
    assert datetime.fromisoformat(shown["meta"]["created_at"]).tzinfo is not None
    assert shown["lease"] == {"holder": None, "ttl_ms": None}
    step = shown["steps"][0]
    assert (step["key"], type(step["seq"])) == ("select", int)
    assert datetime.fromisoformat(step["finished_at"]) >= datetime.fromisoformat(step["started_at"])


def test_console_on_a_busy_port_fails_before_printing_its_url(deployment: Deployment) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        refused = deployment.cli("console", "--port", str(port))
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr.startswith(f"digest: --host 127.0.0.1 --port {port}: ")
    assert len(refused.stderr.splitlines()) == 1
