"""The README's first minutes, run exactly as it prints them: `make run`, then the walk-through.

The walk-through runs in a directory laid out like a checkout (the Makefile, pyproject.toml,
data/ and this .venv, linked), with nothing set but PATH and HOME: the defaults a new user has.
The console blocks are one bash session, as a reader types them in one terminal: each command
echoed as the README shows it, stderr interleaved with stdout as a terminal shows them.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from journal.contrib.embedded import stop_embedded
from tasks.config import Config
from tasks.job.weeks import iso_week_run_id
from tests.support import ROOT

pytestmark = pytest.mark.slow

SECTION = "## Crash and resume, for real"
NOTE = "  (no ANTHROPIC_API_KEY: using the offline summarizer)"


def walk_through() -> list[str]:
    """The console blocks of the README's walk-through, as printed."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```console\n(.*?)```", section, re.DOTALL)


def session(console: str) -> str:
    """A bash script that prints what a terminal shows for the commands of ``console``."""
    lines = ["exec 2>&1"]
    for line in console.splitlines():
        if line.startswith("$ "):
            lines += [f"printf '%s\\n' {shlex.quote(line)}", line[2:]]
    return "\n".join(lines) + "\n"


@pytest.fixture
def checkout(tmp_path: Path) -> Iterator[Path]:
    here = tmp_path / "checkout"
    here.mkdir()
    for name in ("Makefile", "pyproject.toml", "data", ".venv"):
        (here / name).symlink_to(ROOT / name)
    yield here
    stop_embedded(here / ".digest")


def test_make_run_then_the_walk_through_print_what_the_readme_shows(checkout: Path) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", str(checkout))}
    # `make` here must find the install done: it would otherwise reinstall the shared .venv.
    fresh = subprocess.run(["make", "-q", "install"], cwd=checkout, env=env, check=False)
    assert fresh.returncode == 0, "the .venv is older than pyproject.toml: run `make install`"

    week = iso_week_run_id(datetime.now(Config.from_env({}).zone))
    made = subprocess.run(
        ["make", "run"], cwd=checkout, env=env, capture_output=True, text=True, check=False
    )
    summaries = [f"  ran      summarize:i{n}" for n in range(1, 9)]
    assert (made.returncode, made.stderr) == (0, NOTE + "\n")
    assert made.stdout.splitlines() == [
        "  ran      select",
        *summaries,
        "  ran      compose",
        "  ran      send",
        "  ran      mark-seen",
        "  ran      done",
        f"sent: 8 items, 9 offline summaries (no model calls) in this attempt, "
        f"email sent (digest-{week})",
    ]

    blocks = walk_through()
    assert len(blocks) == 2
    console = "".join(blocks)
    shown = subprocess.run(
        ["bash"],
        input=session(console),
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert shown.stdout == console
