"""Every error of both packages survives pickling whole, as Celery's result backend and
process pools carry it, and a store URL's password never travels in one."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import pickle
import sys
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest

import journal.errors
import tasks.errors
import tasks.llm.cost
import tasks.llm.ratelimit
from journal.errors import JournalError, ReceiptUnsaved
from tasks.errors import DigestError

SAMPLES: dict[object, object] = {str: "redis://:hunter2@db:6379/0", int: 3, float: 1.5}


def errors() -> Iterator[type[BaseException]]:
    modules = (journal.errors, tasks.errors, tasks.llm.cost, tasks.llm.ratelimit)
    for module in modules:
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, JournalError | DigestError)
                and value.__module__ == module.__name__
            ):
                yield value


def sample(error: type[BaseException]) -> BaseException:
    """An instance built from a value of each argument's type, or from a message."""
    if not dataclasses.is_dataclass(error):
        return error("what went wrong")
    hints = typing.get_type_hints(error)
    takes = inspect.signature(error).parameters
    return error(*(SAMPLES.get(hints.get(name), "x") for name in takes))


@pytest.mark.parametrize("error", list(errors()), ids=lambda error: error.__name__)
def test_an_error_pickled_comes_back_with_its_facts_and_its_message(
    error: type[BaseException],
) -> None:
    raised = sample(error)
    back = pickle.loads(pickle.dumps(raised))
    assert type(back) is error
    assert str(back) == str(raised)
    assert back.args == raised.args and (raised.args or not dataclasses.is_dataclass(error))
    assert vars(back) == vars(raised)


def test_a_receipts_refusal_keeps_no_password_in_what_is_pickled() -> None:
    refused = ReceiptUnsaved("digest:w", "send", {}, "Error connecting to redis://:hunter2@db")
    assert "hunter2" not in repr(pickle.dumps(refused)) and "hunter2" not in str(refused)


@pytest.mark.parametrize("root", [JournalError, DigestError], ids=lambda root: root.__name__)
def test_every_error_of_a_package_is_in_its_roots_tree(root: type[Exception]) -> None:
    """The root module's docstring draws the tree a reader catches from: none may be missing."""
    package = Path(__file__).resolve().parent.parent / root.__module__.split(".")[0]
    bases: dict[str, list[str]] = {}
    for source in package.rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ClassDef):
                names = [base.id for base in node.bases if isinstance(base, ast.Name)]
                bases[node.name] = names
    errors = {root.__name__}
    while grown := {name for name, of in bases.items() if errors & set(of)} - errors:
        errors |= grown
    tree = sys.modules[root.__module__].__doc__ or ""
    missing = sorted(name for name in errors if not name.startswith("_") and name not in tree)
    assert not missing, f"{root.__module__}'s tree lacks {missing}"
