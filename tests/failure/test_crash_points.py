"""A crash at every point of the digest, then a resume: one email, nine model calls, no gaps.

Each point is a real process exit (``CRASH=<point>`` makes the ``digest run`` process call
``os._exit(137)`` there, leaving its lease behind), followed by a second ``digest run`` that
must replay what was recorded, run the rest, and end with exactly one delivered email, the
week's items in the seen set and exactly nine model calls at the fake API: with one summary in
flight at a time and every crash after a record (or, for ``before-save:send``, after a step
that makes no model call), no call is ever lost in flight and none is made twice.

The command line is started by ``ForkedCli``: a Python process that imports the CLI once and
forks a child per invocation. Each child runs ``tasks.cli.entry``, the ``digest`` script, in
its own process with its own environment, exit status and output files, but without paying
the 1.5 s import of the SDK again: three invocations per point cost about a second, not six.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tasks.keys import text
from tests.fakes.anthropic_server import FakeAnthropic
from tests.support import ROOT, Deployment, wait_until

pytestmark = pytest.mark.slow

# The child half of ForkedCli: one JSON request per line in, a pid then a status line out.
_ZYGOTE = r"""
import json, os, sys, traceback
import tasks.cli

def child(request):
    os.environ.clear()
    os.environ.update(request["env"])
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    os.dup2(os.open(request["stdout"], flags, 0o600), 1)
    os.dup2(os.open(request["stderr"], flags, 0o600), 2)
    sys.argv = ["digest", *request["args"]]
    try:
        tasks.cli.entry()  # what the `digest` script runs; it ends in sys.exit
        code = 0
    except SystemExit as stop:
        code = stop.code
        if isinstance(code, str):
            print(code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)

for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        child(request)
    print(json.dumps({"pid": pid}), flush=True)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"code": os.waitstatus_to_exitcode(status)}), flush=True)
"""


class ForkedCli:
    """Runs ``digest ARGS`` in a fresh child process forked from a pre-imported parent.

    The child gets exactly the environment it is given (nothing of the test process leaks in),
    its own stdout and stderr, and its real exit status, a crash's 137 included.
    """

    def __init__(self, scratch: Path) -> None:
        self._scratch = scratch
        self._count = 0
        self._buffer = b""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DIGEST_", "CRASH"))}
        self._process = subprocess.Popen(
            [sys.executable, "-c", _ZYGOTE],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
            start_new_session=True,
        )

    def run(
        self, env: Mapping[str, str], *args: str, timeout: float = 30
    ) -> subprocess.CompletedProcess[str]:
        """Run one command to its end; its exit status is the child's, as a shell sees it."""
        self._count += 1
        out = self._scratch / f"cli-{self._count}.out"
        err = self._scratch / f"cli-{self._count}.err"
        request = {"env": dict(env), "args": list(args), "stdout": str(out), "stderr": str(err)}
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(request).encode() + b"\n")
        pid = self._reply(10)["pid"]
        try:
            code = self._reply(timeout)["code"]
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            self._reply(10)
            raise AssertionError(
                f"digest {' '.join(args)} did not finish within {timeout}s; "
                f"its output so far: {out.read_text()}{err.read_text()}"
            ) from None
        return subprocess.CompletedProcess(
            ["digest", *args], code, out.read_text(), err.read_text()
        )

    def _reply(self, timeout: float) -> dict[str, Any]:
        assert self._process.stdout is not None
        fd = self._process.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(fd, 4096)
            if not chunk:
                raise AssertionError(f"the CLI parent exited ({self._process.wait()})")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def close(self) -> None:
        """Stop the parent (it exits when its input closes)."""
        assert self._process.stdin is not None
        self._process.stdin.close()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait(timeout=10)


@pytest.fixture(scope="module")
def forked_cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForkedCli]:
    cli = ForkedCli(tmp_path_factory.mktemp("cli"))
    yield cli
    cli.close()


ITEMS = [f"i{n}" for n in range(1, 9)]
STEPS = ["select", *(f"summarize:{item}" for item in ITEMS), "compose", "send", "mark-seen", "done"]
MODEL_STEPS = {f"summarize:{item}" for item in ITEMS} | {"compose"}
POINTS = [
    "after:select",
    *(f"after:summarize:{item}" for item in ITEMS),
    "after:compose",
    "before-save:send",
    "after:send",
    "after:mark-seen",
]
TITLES = [
    "Dark mode",
    "Faster search",
    "CSV export for reports",
    "SSO for the Team plan",
    "Fewer duplicate notifications",
    "New API rate limits",
    "Audit log retention",
    "Keyboard shortcuts",
]


def recorded_before_resume(point: str) -> list[str]:
    """The steps the crashed attempt recorded (in order) before it died at ``point``."""
    if point == "before-save:send":
        return STEPS[: STEPS.index("send")]  # the email left, its record never happened
    return STEPS[: STEPS.index(point.removeprefix("after:")) + 1]


def step_lines(stdout: str) -> list[tuple[str, str]]:
    """(``ran`` | ``replayed``, step key) for every step line the CLI printed."""
    lines = []
    for line in stdout.splitlines():
        words = line.split()
        if len(words) == 2 and words[0] in ("ran", "replayed"):
            lines.append((words[0], words[1]))
    return lines


def seen_items(deployment: Deployment) -> set[str]:
    runtime = deployment.runtime()
    return {text(member) for member in runtime.client.smembers(runtime.keys.seen)}


def lease_gone(deployment: Deployment, run_id: str) -> bool:
    keys = deployment.runtime().journal.keys("digest", run_id)
    return not deployment.client().exists(keys.lease)


@pytest.mark.parametrize("point", POINTS)
def test_crash_then_resume(
    point: str, deployment: Deployment, forked_cli: ForkedCli, fake_anthropic: FakeAnthropic
) -> None:
    deployment.env.update(fake_anthropic.env(), DIGEST_CONCURRENCY="1", DIGEST_LEASE_TTL="1")
    run_id = "2026-w42"
    recorded = recorded_before_resume(point)
    calls_before = len(MODEL_STEPS.intersection(recorded))
    emailed_before = point in ("before-save:send", "after:send", "after:mark-seen")

    crashed = forked_cli.run({**deployment.env, "CRASH": point}, "run", run_id)

    assert crashed.returncode == 137, crashed.stdout + crashed.stderr
    assert crashed.stdout.splitlines()[-1] == f"  ** simulated crash at {point} **"
    assert step_lines(crashed.stdout) == [("ran", key) for key in recorded]
    assert crashed.stderr == ""
    assert fake_anthropic.calls == calls_before
    assert len(deployment.outbox()) == int(emailed_before)
    view = deployment.view(run_id)
    assert [record.key for record in view.steps] == recorded
    assert view.status == "running"
    assert seen_items(deployment) == (set(ITEMS) if point == "after:mark-seen" else set())

    wait_until(lambda: lease_gone(deployment, run_id), 5, "the crashed run's lease to expire")
    resumed = forked_cli.run(deployment.env, "run", run_id)

    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert step_lines(resumed.stdout) == [
        ("replayed" if key in recorded else "ran", key) for key in STEPS
    ]
    state = "already sent earlier, not resent" if point == "before-save:send" else "sent"
    assert resumed.stdout.splitlines()[-1] == (
        f"sent: 8 items, {9 - calls_before} model calls in this attempt, "
        f"email {state} (digest-{run_id})"
    )
    assert resumed.stderr == ""
    assert fake_anthropic.calls == 9
    # Each title is in its own summary's prompt and in the opening's: called once each.
    assert Counter(fake_anthropic.models) == {"claude-haiku-5-5": 8, "claude-sonnet-5-5": 1}
    assert [fake_anthropic.calls_for(title) for title in TITLES] == [2] * 8
    assert [path.name for path in deployment.outbox()] == [f"digest-{run_id}.json"]
    assert seen_items(deployment) == set(ITEMS)
    view = deployment.view(run_id)
    assert view.status == "done"
    assert [record.key for record in view.steps] == STEPS
    assert [(r.key, r.fence, r.attempt) for r in view.steps] == [
        (key, 1 if key in recorded else 2, 1) for key in STEPS
    ]
    assert view.meta["starts"] == "2"

    again = forked_cli.run(deployment.env, "run", run_id)

    assert (again.returncode, again.stdout, again.stderr) == (
        0,
        "already-done: 0 items, 0 model calls in this attempt\n",
        "",
    )
    assert fake_anthropic.calls == 9
    assert len(deployment.outbox()) == 1
