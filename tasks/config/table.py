"""The configuration table of docs/configuration.md, from the settings and their defaults.

``python -m tasks.config`` prints it; a test keeps the documentation equal to it.
"""

from __future__ import annotations

from typing import Any

from tasks.config import Config
from tasks.config.variables import SETTINGS, Setting


def settings_table() -> str:
    """The configuration table of docs/configuration.md, one row per variable."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    rows += [f"| `{s.env}` | {s.shown_default(_default(s))} | {s.doc} |" for s in SETTINGS]
    return "\n".join(rows)


def _default(setting: Setting) -> Any:
    """The default of the ``Config`` field ``setting`` sets; None when it sets none."""
    if setting.field is None:
        return None
    return Config.__dataclass_fields__[setting.field].default
