"""The weekly AI digest on Celery: ``celery -A tasks worker``, ``from tasks import digest``.

The Celery app is imported on first use, so the ``digest`` command line can report a bad
setting in one line instead of failing while the package imports.
"""

from typing import Any

__all__ = ["app", "digest"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from tasks import celery_app

        return getattr(celery_app, name)
    raise AttributeError(f"module 'tasks' has no attribute {name!r}")
