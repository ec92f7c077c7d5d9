"""A resumable batch: thousands of records, a status for each, the failed ones retried.

The journal keeps the progress: each record is one journaled step under its stable id, so a
crash mid-batch resumes where it stopped without processing a finished record again, one
bad record fails alone (its error recorded as its status) and never stops the rest, and the
failed ids are retried only when an operator asks for it (``retry-failed``), as a new run
over exactly those ids.

- ``celery -A examples.records worker --beat``: a worker, with the due sweep that resumes a
  run whose worker died;
- ``python -m examples.records run|status|retry-failed``: the operator's side.

The Celery app is imported on first use, so the command line's ``status`` never imports
Celery.
"""

from typing import Any

__all__ = ["app", "records"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from examples.records import worker

        return getattr(worker, name)
    raise AttributeError(f"module 'examples.records' has no attribute {name!r}")
