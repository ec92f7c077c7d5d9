"""Fault injection: ``CRASH=<point>`` ends the process at that point at once, like a kill -9.

Every point is named here, so the workflow's body holds none of them:

- ``after:<step>``: right after a step ran and was recorded (``after_step``, the digest
  workflow's own step observer, so the command line and a worker crash alike);
- ``before-save:send``: the email delivered, its receipt not yet recorded (``before_saving_send``);
- ``dispatch:before-publish``: a week claimed by the dispatcher, not yet enqueued
  (``before_publishing``).

No cleanup runs and the lease stays behind, which is the realistic case to test.
"""

from __future__ import annotations

import os
import sys

from journal import StepEvent

CRASH_EXIT_STATUS = 137


def crash_point(point: str) -> None:
    """End the process here when ``CRASH`` names ``point``."""
    if os.environ.get("CRASH") == point:
        print(f"  ** simulated crash at {point} **", flush=True)
        sys.stdout.flush()
        os._exit(CRASH_EXIT_STATUS)


def after_step(event: StepEvent) -> None:
    """``after:<step>``: a step this attempt ran (a replayed one is no new point)."""
    if not event.replayed:
        crash_point(f"after:{event.key}")


def before_saving_send() -> None:
    """``before-save:send``: the one window the effect protocol leaves, made to happen."""
    crash_point("before-save:send")


def before_publishing() -> None:
    """``dispatch:before-publish``: the dispatcher's claim taken, the message not yet sent."""
    crash_point("dispatch:before-publish")
