"""docs/architecture.md held to the code: its modules exist, and every module is on it.

The page is written by hand (a picture drawn from the imports would say less about what each
room holds); these tests make it fail the day a module is added, moved or renamed without it,
and the day the path of a run id it walks through names a function the code no longer has.
"""

from __future__ import annotations

import ast
import re

from tests.support import ROOT

PAGE = ROOT / "docs" / "architecture.md"
ROW = re.compile(r"^\| `((?:journal|tasks)/[\w/]+\.py)` \|", re.MULTILINE)
# A module named in backquotes, then one of its names: `journal/_run.py` `Run.step`.
NAMED = re.compile(r"`((?:journal|tasks)/[\w/]+\.py)` `(\w+(?:\.\w+)?)`")
PATH = re.compile(r"`((?:journal|tasks)/[\w/.]+\.(?:py|lua))`")


def modules_with_code() -> set[str]:
    """Every module of both packages but a package's ``__init__.py`` that holds a docstring."""
    found = set()
    for package in ("journal", "tasks"):
        for path in (ROOT / package).rglob("*.py"):
            body = ast.parse(path.read_text()).body
            docstring_only = len(body) == 1 and isinstance(body[0], ast.Expr)
            if not (path.name == "__init__.py" and docstring_only):
                found.add(path.relative_to(ROOT).as_posix())
    return found


def defines(module: str, dotted: str) -> bool:
    """Whether ``module`` defines ``dotted``: a top-level name, or a method of a class."""
    nodes: list[ast.stmt] = ast.parse((ROOT / module).read_text()).body
    for part in dotted.split("."):
        named = [
            node
            for node in nodes
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name == part
        ]
        if not named:
            return False
        nodes = named[0].body
    return True


def test_every_module_is_on_the_page_and_every_module_on_it_exists() -> None:
    listed = set(ROW.findall(PAGE.read_text()))
    assert sorted(modules_with_code() - listed) == [], "modules missing from the page"
    assert sorted(path for path in listed if not (ROOT / path).is_file()) == []


def test_every_path_and_name_the_page_walks_through_is_in_the_code() -> None:
    page = PAGE.read_text()
    assert sorted(path for path in PATH.findall(page) if not (ROOT / path).is_file()) == []
    named = NAMED.findall(page)
    assert len(named) >= 8, "the walk from digest.delay to the keys names its functions"
    assert [f"{module} {name}" for module, name in named if not defines(module, name)] == []


LONGEST = 60  # lines of a function, from its def to its last line


def test_no_function_outside_the_tests_is_longer_than_a_screen() -> None:
    """A function that outgrows a screen is read in pieces; split it where it changes subject."""
    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)"
        for package in ("journal", "tasks", "bench", "examples")
        for path in sorted((ROOT / package).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (length := (node.end_lineno or node.lineno) - node.lineno + 1) > LONGEST
    ]
    assert long == [], f"split these under {LONGEST} lines: {long}"


def module_file(dotted: str) -> str | None:
    """The file of module ``dotted`` in this tree (a package's ``__init__.py``), if any."""
    base = ROOT.joinpath(*dotted.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path.relative_to(ROOT).as_posix()
    return None


def imported_files(path: str) -> set[str]:
    """The files of this tree that ``path`` imports anywhere: in a function, a type check..."""
    found = set()
    for node in ast.walk(ast.parse((ROOT / path).read_text())):
        if isinstance(node, ast.Import):
            found |= {file for alias in node.names if (file := module_file(alias.name))}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                target = module_file(f"{node.module}.{alias.name}") or module_file(node.module)
                if target is not None:
                    found.add(target)
    return found - {path}


def test_no_two_modules_import_each_other_even_for_type_checking() -> None:
    """A circle makes two rooms one: the one that builds another passes it what it needs."""
    graph = {module: imported_files(module) for module in modules_with_code()}
    circles = []
    for start in sorted(graph):
        # Every module reachable from ``start``, with the path that reached it.
        paths, frontier = {start: [start]}, [start]
        while frontier:
            here = frontier.pop()
            for there in graph.get(here, ()):
                if there == start:
                    circles.append(" -> ".join([*paths[here], start]))
                elif there not in paths:
                    paths[there] = [*paths[here], there]
                    frontier.append(there)
    assert circles == []
