"""The Makefile's two entry points, as a fresh clone sees them (no .venv yet).

`make -n` prints what each target would run without running it: `make run` must install the
runtime alone, `make test` the test tools as well.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.slow


def planned(target: str, here: Path) -> str:
    (here / "Makefile").symlink_to(ROOT / "Makefile")
    (here / "pyproject.toml").symlink_to(ROOT / "pyproject.toml")
    made = subprocess.run(
        ["make", "-n", target], cwd=here, capture_output=True, text=True, check=True
    )
    return made.stdout


def test_make_run_installs_the_runtime_without_the_test_tools(tmp_path: Path) -> None:
    plan = planned("run", tmp_path)
    assert "pip install -e ." in plan
    assert "[dev]" not in plan


def test_make_test_installs_the_test_tools_then_runs_the_checks_and_the_mutants(
    tmp_path: Path,
) -> None:
    plan = planned("test", tmp_path)
    assert "pip install -e '.[dev]'" in plan
    for check in ("ruff check", "mypy", "pytest", "tests.mutants"):
        assert check in plan


def test_the_pre_commit_hooks_run_what_make_lint_runs(tmp_path: Path) -> None:
    plan = planned("lint", tmp_path).splitlines()
    lint = [line.removesuffix(" .") for line in plan if line.startswith(".venv/bin/")]
    config = (ROOT / ".pre-commit-config.yaml").read_text()
    hooks = [line.split("entry:", 1)[1].strip() for line in config.splitlines() if "entry:" in line]
    # The same tools, each run as make lint runs it (on the files pre-commit names rather than
    # on "."); ruff's --force-exclude keeps what ruff excludes excluded when a file is named.
    assert len(lint) == 4
    assert [hook.replace(" --force-exclude", "") for hook in hooks] == lint
