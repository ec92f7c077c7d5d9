"""What the benches share: a timed ``digest`` process's environment and run, a report's verdict."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support import BIN


def isolated_env(state: Path, **variables: str) -> dict[str, str]:
    """The environment of a ``digest`` process on the embedded server in ``state``.

    This shell's digest, Redis, Celery and model API settings are left out, so that a process
    sees only ``variables``: offline unless they name an API.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DIGEST_", "CRASH"))}
    for name in ("ANTHROPIC_API_KEY", "REDIS_URL", "CELERY_BROKER_URL"):
        env.pop(name, None)
    return env | {"DIGEST_STATE_DIR": str(state)} | variables


def digest(env: dict[str, str], cwd: Path, *args: str) -> None:
    """``digest ARGS`` as a whole process, its output captured; it must exit 0."""
    subprocess.run([str(BIN / "digest"), *args], env=env, cwd=cwd, check=True, capture_output=True)


def verdict(figure: float, target: float) -> str:
    """``met`` if ``figure`` is at most ``target``, else ``MISSED``: the word a report ends on."""
    return "met" if figure <= target else "MISSED"
