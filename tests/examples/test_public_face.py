"""The example imports the journal's face alone: its import contract covers every private module.

``make lint`` runs the contract; these tests keep it honest, as ``tests/test_layers.py`` does
for the app's: its list is every private module on disk plus ``tasks``, and a planted import
of a private module from the example breaks it.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import pytest

import journal
from tests.support import ROOT
from tests.test_layers import LINT_IMPORTS, contract, private_modules

PRIVATE = "tasks and examples import no private module of journal"


def test_the_contracts_forbid_the_app_and_every_private_module_of_the_library() -> None:
    assert contract(PRIVATE)["source_modules"] == ["tasks", "examples"]
    assert set(contract(PRIVATE)["forbidden_modules"]) == private_modules()
    assert contract("examples import nothing of tasks")["forbidden_modules"] == ["tasks"]


def test_every_name_of_the_face_is_typed_and_imported_on_first_use() -> None:
    # The face imports a name's module when the name is first used: a name missing from the
    # table would fail only then, in an application, and one missing from the type checker's
    # imports would be typed Any without a word.
    face = ast.parse((ROOT / "journal" / "__init__.py").read_text())
    typed = {
        alias.asname or alias.name
        for block in face.body
        if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert typed == set(journal._HOMES) == set(journal.__all__)
    assert [name for name in journal.__all__ if getattr(journal, name, None) is None] == []


@pytest.mark.slow
def test_an_example_importing_a_private_module_breaks_the_contract(tmp_path: Path) -> None:
    for part in ("journal", "tasks", "examples"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    batch = tmp_path / "examples" / "records" / "batch.py"
    batch.write_text(batch.read_text() + "\nfrom journal._run import Run as _planted\n")
    broken = subprocess.run(
        [LINT_IMPORTS, "--no-cache"], cwd=tmp_path, capture_output=True, text=True
    )
    assert broken.returncode == 1
    assert "examples.records.batch -> journal._run" in broken.stdout
