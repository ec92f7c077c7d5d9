"""What the journal tells observers: counts for metrics, without depending on any of them.

The journal never imports a metrics library. It calls ``emit(event, label, amount)`` at the
moments an operator counts, and whoever cares (the digest's Prometheus counters) registers a
listener with ``listen``; an application may emit events of its own the same way. A listener
that raises is logged and ignored: observing must never change a run's course.

Events and their label:
    ``retry``            a step attempt failed and will be tried again; label: the error type
    ``takeover``         a provably dead holder's lease was taken over at once; label: ""
    ``fenced``           a write was refused because a newer holder owns the run; label: ""
    ``renewal_failed``   a lease renewal found the lease lost; label: ""
"""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

Listener = Callable[[str, str, float], None]
_listeners: list[Listener] = []


def listen(listener: Listener) -> None:
    """Call ``listener(event, label, amount)`` for every event from now on, in this process."""
    if listener not in _listeners:
        _listeners.append(listener)


def emit(event: str, label: str = "", amount: float = 1.0) -> None:
    """Tell every listener; never raises."""
    for listener in _listeners:
        try:
            listener(event, label, amount)
        except Exception:
            log.exception("journal event listener failed on %s", event)
