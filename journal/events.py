"""What the journal tells observers: counts for metrics, without depending on any of them.

The journal never imports a metrics library. It calls ``emit(event, label, amount,
workflow=...)`` at the moments an operator counts or times, and whoever cares (the digest's
Prometheus metrics) registers a listener with ``listen``; an application may emit events of its
own the same way. A listener that raises is logged and ignored: observing must never change a
run's course. ``workflow`` names the run's workflow where the event belongs to one run.

Events, their label and amount:
    ``step_ran``         a step ran and was recorded; label: its step name (``step_name``);
                         amount: seconds from its start to its record, retries included
    ``step_replayed``    a step was replayed from the journal; label: its step name
    ``run_finished``     a run ended (done, failed for good, cancelled); label: its outcome
                         (``outcome_of``); amount: seconds since the run was created
    ``retry``            a step attempt failed and will be tried again; label: the error type
    ``takeover``         a provably dead holder's lease was taken over at once; label: ""
    ``fenced``           a write was refused because a newer holder owns the run; label: ""
    ``renewal_failed``   a lease renewal found the lease lost; label: ""
    ``effect_ambiguous`` an effect may have happened and its run waits for a decision; label:
                         its step name
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

Listener = Callable[[str, str, float, str], None]
"""Called as ``listener(event, label, amount, workflow)``."""
_listeners: list[Listener] = []


def listen(listener: Listener) -> None:
    """Call ``listener(event, label, amount, workflow)`` for every event, in this process."""
    if listener not in _listeners:
        _listeners.append(listener)


def emit(event: str, label: str = "", amount: float = 1.0, *, workflow: str = "") -> None:
    """Tell every listener; never raises."""
    for listener in _listeners:
        try:
            listener(event, label, amount, workflow)
        except Exception:
            log.exception("journal event listener failed on %s", event)


def step_name(key: str) -> str:
    """A step key's name for a metric label: ``summarize:i4`` -> ``summarize``.

    A map's items, a signal's waits and the deterministic helpers share a prefix, so a label
    takes one value per kind of step, not one per item: a series per item would grow without
    bound, week after week.
    """
    return key.split(":", 1)[0]


def outcome_of(result: Any) -> str:
    """A finished run's outcome: its result's ``status`` when it names one, else ``done``.

    The digest returns ``{"status": "sent" | "nothing-new" | "rejected" | ...}``; a workflow
    whose result says nothing of the kind is simply ``done``.
    """
    if isinstance(result, dict):
        status = result.get("status")
        if isinstance(status, str) and status:
            return status
    return "done"
