"""The digest's own Lua scripts (``tasks/lua``), read once per process."""

from __future__ import annotations

import functools
from importlib import resources

from journal import Client, Script


@functools.cache
def _source(name: str) -> str:
    return resources.files("tasks").joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


def script(client: Client, name: str) -> Script:
    """``tasks/lua/<name>.lua`` bound to ``client``."""
    return Script(client, _source(name))
