"""The digest's own Lua scripts (``tasks/lua``), read once per process.

Registered with the journal's (``journal.register_scripts``): a server that has none of them
gets every one, the journal's and these, in the one transaction of the first NOSCRIPT.
"""

from __future__ import annotations

from importlib import resources

from journal import Client, Script, register_scripts

_SOURCES = {
    entry.name.removesuffix(".lua"): entry.read_text(encoding="utf-8")
    for entry in resources.files("tasks").joinpath("lua").iterdir()
    if entry.name.endswith(".lua")
}
_load_all = register_scripts(tuple(_SOURCES.values()))


def script(client: Client, name: str) -> Script:
    """``tasks/lua/<name>.lua`` bound to ``client``."""
    return Script(client, _SOURCES[name], _load_all)
