"""A fallback chain: which model one step asks, moving on only past a stated bound.

``DIGEST_SUMMARY_MODEL=claude-haiku-5-5,claude-sonnet-5-5`` asks the primary first. A step
moves to the next model only after its current one has answered ``per_model`` attempts in a
row that say it is overloaded or unavailable (``is_unavailable``: 529, 503, 504, timeouts,
connection errors), each attempt separated by the step's own back-off. A refusal or a 429
never moves it: a request one model refuses, the next would too, and a rate limit is waited
out by the shared limiter. The last model keeps its attempts; then the step gives up as a
single model's would.

Which model answered is recorded with the step (the completion's ``model``), so a replay
takes the recorded answer and never decides again. What is not recorded is the count of
failures so far: it lives in this object, one per delivery, so a run resumed later (after a
crash or a suspended back-off) asks the primary first again for the items still unanswered,
which is what an operator wants once the primary is back.

Rejected: choosing the model from the journal's attempt number (``attempt // per_model``). The
journal does not hand a step its attempt, and a suspended back-off would then resume on the
fallback even if the primary had recovered meanwhile.
"""

from __future__ import annotations

import threading

from journal.events import emit
from tasks.llm.client import is_unavailable


class Chain:
    """The models of one call kind, and where each step stands in them during one delivery.

    Args:
        models: the primary first, then each fallback in order.
        per_model: attempts on one model, each failed as unavailable, before the next is asked.
    """

    def __init__(self, models: tuple[str, ...], per_model: int) -> None:
        if not models:
            raise ValueError("a chain needs at least one model")
        if per_model < 1:
            raise ValueError("per_model must be at least 1")
        self.models = models
        self.per_model = per_model
        self._lock = threading.Lock()  # a map's items fail on several threads at once
        self._at: dict[str, int] = {}
        self._failures: dict[str, int] = {}

    @property
    def attempts(self) -> int:
        """The step's attempts in all: ``per_model`` for each model of the chain."""
        return self.per_model * len(self.models)

    def model(self, step: str) -> str:
        """The model ``step`` asks now."""
        with self._lock:
            return self.models[self._at.get(step, 0)]

    def failed(self, step: str, model: str, error: BaseException) -> None:
        """Count ``error`` of ``model`` for ``step``; past the bound, the next model is asked.

        An error that does not say the model is unavailable resets nothing and counts nothing:
        only unavailability in a row moves a step on.
        """
        if not is_unavailable(error):
            return
        with self._lock:
            at = self._at.get(step, 0)
            if self.models[at] != model or at + 1 >= len(self.models):
                return
            failures = self._failures.get(step, 0) + 1
            if failures < self.per_model:
                self._failures[step] = failures
                return
            self._at[step] = at + 1
            self._failures[step] = 0
        emit("model_fallback", model)  # labelled by the model given up on
