"""A delivery's options, checked against the workflow's signature before anything is written.

A run freezes its options at its first start: every later delivery replays with them. An
option the workflow does not take, or of a type it does not declare, would be frozen into the
run for good and fail every delivery after it; so they are refused before the journal is
touched, naming the option and what the workflow takes.

Only the shapes JSON can carry are checked (``str``, ``int``, ``float``, ``bool``, ``None``,
unions of them, ``list[...]`` and ``dict[str, ...]``); anything else the annotation names is
taken as declared.
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from journal.errors import InvalidArguments


def check_arguments(run: str, fn: Callable[..., Any], options: Mapping[str, Any]) -> None:
    """Refuse ``options`` unless ``fn(run, **options)`` declares every one, with its type.

    Raises:
        InvalidArguments: an unknown option, or a value of the wrong type.
    """
    signature, hints, takes, bare = _declared(fn)
    if bare and not options:
        return
    try:
        signature.bind(None, **options)
    except TypeError as exc:
        raise InvalidArguments(run, str(exc), takes) from None
    for name, value in options.items():
        hint = hints.get(name)
        if hint is not None and not _conforms(value, hint):
            raise InvalidArguments(run, f"{name}={value!r} is not {_show(hint)}", takes)


@functools.cache
def _declared(fn: Callable[..., Any]) -> tuple[inspect.Signature, dict[str, Any], str, bool]:
    """What ``fn`` declares, read once per workflow, and whether it may be called bare.

    Every delivery is checked against it, and resolving the annotations compiles each one;
    a delivery with no options, the common case, is then checked without binding.
    """
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())[1:]  # after the Run
    takes = ", ".join(p.name for p in params if p.kind is not p.VAR_KEYWORD)
    try:
        signature.bind(None)
    except TypeError:
        bare = False
    else:
        bare = True
    return signature, typing.get_type_hints(fn), takes, bare


def _conforms(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if hint is None or hint is type(None):
        return value is None
    if origin is typing.Union or origin is types.UnionType:
        return any(_conforms(value, arm) for arm in typing.get_args(hint))
    if hint is bool:
        return isinstance(value, bool)
    if hint in (int, float):  # JSON has one number type; a bool is not one
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin is list:
        (item,) = typing.get_args(hint) or (Any,)
        return isinstance(value, list) and all(_conforms(v, item) for v in value)
    if origin is dict:
        _, item = typing.get_args(hint) or (str, Any)
        return (
            isinstance(value, dict)
            and all(isinstance(k, str) for k in value)
            and all(_conforms(v, item) for v in value.values())
        )
    return True


def _show(hint: Any) -> str:
    if hint is type(None):
        return "None"
    if isinstance(hint, type):
        return hint.__name__
    return str(hint).replace("typing.", "")
