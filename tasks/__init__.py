"""The weekly AI digest on Celery: ``celery -A tasks worker``, ``from tasks import digest``.

The Celery app is imported on first use: importing it has no side effects (it reads the
environment only when Celery first needs its configuration), but Celery itself takes about
0.3 s to import, which every ``digest`` command that never talks to a worker would pay.
"""

from typing import Any

__all__ = ["app", "digest"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from tasks.worker import app

        return getattr(app, name)
    raise AttributeError(f"module 'tasks' has no attribute {name!r}")
