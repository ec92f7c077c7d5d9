"""The public line between ``journal`` and ``tasks`` holds, and its contract can fail.

``make lint`` runs ``lint-imports`` over the contracts in ``pyproject.toml``. These tests keep
that contract honest: its list of private modules is every private module on disk (a new
``journal/_x.py`` cannot slip past it), and a planted import of one from ``tasks`` breaks it.
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
    for part in ("journal", "tasks", "examples"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    kept = subprocess.run(
        [LINT_IMPORTS, "--no-cache"], cwd=tmp_path, capture_output=True, text=True
    )
    assert kept.returncode == 0, kept.stdout
    faults = tmp_path / "tasks" / "faults.py"
    faults.write_text(faults.read_text() + "\nfrom journal._run import Run as _planted\n")
    broken = subprocess.run(
        [LINT_IMPORTS, "--no-cache"], cwd=tmp_path, capture_output=True, text=True
    )
    assert broken.returncode == 1
    assert "tasks.faults -> journal._run" in broken.stdout
