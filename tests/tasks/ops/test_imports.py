"""What ``digest --help`` and ``digest show`` import: only what they use.

A command line starts in a fraction of a second only if it leaves alone what it does not
need; each package named here costs tens to hundreds of milliseconds, every time. Times vary
with the machine and stay in ``bench/cli.py``; what a process imports does not, so it is a
test. OpenTelemetry is left out: redis-py imports it itself when it is installed.
"""

from __future__ import annotations

import pytest

from tests.support import Deployment
from tests.tasks.ops.test_cli import imported

pytestmark = pytest.mark.slow  # whole digest processes

RUN = "2026-w42"
# Packages no reading command needs: the worker's, the console's, the model's, the mail's.
UNNEEDED = {
    "anthropic",
    "celery",
    "kombu",
    "flask",
    "werkzeug",
    "jinja2",
    "prometheus_client",
    "httpx",
    "httpx2",
    "pydantic",
}


@pytest.mark.parametrize("args", [["--help"], ["show", RUN], ["runs"]])
def test_a_reading_command_imports_nothing_it_does_not_use(
    deployment: Deployment, args: list[str]
) -> None:
    assert deployment.cli("run", RUN).returncode == 0  # something to show
    done = deployment.cli(*args, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert done.returncode == 0, done.stderr
    assert UNNEEDED & set(imported(done.stderr)) == set()


def modules(stderr: str) -> set[str]:
    """Every module a process imported, from its ``-X importtime`` report."""
    return {
        line.rsplit("|", 1)[1].strip()
        for line in stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


def test_help_imports_no_command(deployment: Deployment) -> None:
    # The commands bring the workflow, the runtime and the renderers: a third of what
    # `digest --help` took beyond the floor, for a page the parser alone prints. The journal's
    # machinery and the settings are the commands' too: the page names no run and reads none.
    done = deployment.cli("--help", env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert done.returncode == 0, done.stderr
    commands = {"tasks.ops.cli.commands", "tasks.ops.cli.render", "tasks.job.workflow"}
    machinery = {"journal._journal", "journal._delivery", "journal._run", "tasks.config"}
    assert modules(done.stderr) & (commands | machinery) == set()


# What running a digest needs and reading one does not: the workflow and its steps, the model
# client, the mailers, the actions on runs, and the journal's delivery (the runner, the lease,
# fenced effects). Reading needs the settings, the store, the journal's views and the renderer.
RUNNING = {
    "tasks.job.workflow",
    "tasks.job.summarize",
    "tasks.job.items",
    "tasks.llm.client",
    "tasks.llm.budget",
    "tasks.mail.smtp",
    "smtplib",
    "tasks.ops.actions",
    "journal.ops.actions",
    "journal._workflow",
    "journal._delivery",
    "journal._run",
    "journal._lease",
    "journal._effects",
}


@pytest.mark.parametrize("args", [["show", RUN], ["runs"]])
def test_reading_runs_imports_nothing_of_running_one(
    deployment: Deployment, args: list[str]
) -> None:
    assert deployment.cli("run", RUN).returncode == 0
    done = deployment.cli(*args, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert done.returncode == 0, done.stderr
    assert modules(done.stderr) & RUNNING == set()


def test_show_imports_no_replay_machinery(deployment: Deployment) -> None:
    assert deployment.cli("run", RUN).returncode == 0
    done = deployment.cli("show", RUN, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert done.returncode == 0, done.stderr
    assert {m for m in modules(done.stderr) if m.startswith("journal.testing")} == set()
