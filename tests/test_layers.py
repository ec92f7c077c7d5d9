"""The public line between ``journal`` and ``tasks``, and the app's rooms, hold and can fail.

``make lint`` runs ``lint-imports`` over the contracts in ``pyproject.toml``. These tests keep
those contracts honest: the list of private modules is every private module on disk (a new
``journal/_x.py`` cannot slip past it), the configuration's list is every other room of the
app, and a planted import breaks each contract.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def private_modules() -> set[str]:
    """The outermost private module of each private file of ``journal``, dotted."""
    found: set[str] = set()
    for path in (ROOT / "journal").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        for depth, part in enumerate(parts[1:], start=2):
            if part.startswith("_") and part != "__init__":
                found.add(".".join(parts[:depth]))
                break
    return found


def contract(name: str) -> dict[str, Any]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts: list[dict[str, Any]] = config["tool"]["importlinter"]["contracts"]
    return next(c for c in contracts if c["name"] == name)


def test_the_contract_forbids_every_private_module_of_the_library() -> None:
    private = contract("tasks and examples import no private module of journal")
    forbidden = private["forbidden_modules"]
    assert set(forbidden) == private_modules()


@pytest.mark.slow
def test_an_app_module_importing_a_private_one_breaks_the_contract(tmp_path: Path) -> None:
    report = planted_import_breaks(
        tmp_path, Path("tasks/job/faults.py"), "from journal._run import Run as _planted"
    )
    assert "tasks.job.faults -> journal._run" in report


def planted_import_breaks(tmp_path: Path, module: Path, line: str) -> str:
    """``lint-imports`` over a copy of the project whose ``module`` gained ``line``: its report.

    The copy is checked clean first, so what breaks is the planted line alone.
    """
    for part in ("journal", "tasks", "examples"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    kept = subprocess.run(
        [LINT_IMPORTS, "--no-cache"], cwd=tmp_path, capture_output=True, text=True
    )
    assert kept.returncode == 0, kept.stdout
    planted = tmp_path / module
    planted.write_text(planted.read_text() + f"\n{line}\n")
    broken = subprocess.run(
        [LINT_IMPORTS, "--no-cache"], cwd=tmp_path, capture_output=True, text=True
    )
    assert broken.returncode == 1
    return broken.stdout


def test_the_configuration_contract_names_every_other_room_of_the_app() -> None:
    forbidden = contract("tasks.config imports nothing of tasks but tasks.errors")[
        "forbidden_modules"
    ]
    rooms = {
        f"tasks.{path.stem}"
        for path in (ROOT / "tasks").iterdir()
        if (path.suffix == ".py" or (path / "__init__.py").exists())
        and path.stem not in ("__init__", "config", "errors")
    }
    assert set(forbidden) == rooms


@pytest.mark.slow
def test_the_configuration_importing_another_room_breaks_its_contract(tmp_path: Path) -> None:
    report = planted_import_breaks(
        tmp_path, Path("tasks/config/prices.py"), "from tasks.llm import cost as _planted"
    )
    assert "tasks.config.prices -> tasks.llm.cost" in report


@pytest.mark.slow
def test_a_lower_room_importing_a_higher_one_breaks_the_layers(tmp_path: Path) -> None:
    report = planted_import_breaks(
        tmp_path, Path("tasks/llm/budget.py"), "from tasks.job import claims as _planted"
    )
    assert "tasks.llm is not allowed to import tasks.job" in report
