"""Every failure the digest raises, under one root.

DigestError
├── BadInput            an items file, run id or option a user must fix (CLI exit 2)
├── ModelRefused        the API refused the account or the request itself: fails the run at once
│   └── ModelAuthFailed the key was refused (401) or may not use the model (403)
├── ItemRefused         the API refused one item's prompt (too long, filtered): the item is skipped
├── EveryItemRefused    the API refused every item: the run fails rather than report nothing new
├── ModelNotConfigured  a worker has no API key and was not told to run offline
├── ModelUnavailable    transient model failures outlasted the step's attempts (transient)
├── CapacityWait        the rate limits have no room for longer than a worker waits (transient)
├── NoRoomByDeadline    the rate limits have no room before the run's deadline: offline now
├── BudgetExceeded      the run spent its DIGEST_MAX_COST_USD: stopped before its next call
├── UnpricedAnswer      a model the price table lacks answered while a budget is set
└── MailFailed          the mail server refused the email
    └── MailUnavailable the mail server could not be reached or said "try later" (transient)

The model API's four are declared beside what raises them (``tasks.llm.ratelimit`` and
``tasks.llm.cost``), where their facts are computed; they derive from ``DigestError`` all the
same.

A transient error fails the run for now only: the journal keeps it due and the sweep starts it
again after a back-off, until ``DIGEST_GIVE_UP_AFTER`` (see ``is_transient_failure``). Every
other error fails the run until a person acts: retrying cannot fix a bad input or an account.
"""

from __future__ import annotations

from typing import ClassVar


class DigestError(Exception):
    """Root of every error raised by the digest application.

    An error with facts to tell is a dataclass of them (``eq=False``), and they are its
    ``args``: a copy pickled to Celery's result backend is built again from them.

    Attributes:
        transient: whether the same run may succeed later unchanged, so the system retries it.
    """

    transient: ClassVar[bool] = False

    def __post_init__(self) -> None:
        super().__init__(*vars(self).values())


class BadInput(DigestError):
    """Input a user must fix; the message names the file or value, the problem and the fix."""


class ModelRefused(DigestError):
    """The API refused the account or the request, not one item: every item would fail alike.

    Out of credit, an unknown model, a malformed request: skipping items would turn such a week
    into a quiet "nothing new", so the run fails at once and says what to fix.
    """


class ModelAuthFailed(ModelRefused):
    """The Anthropic API refused the key (401) or its access to the model (403)."""


class ItemRefused(DigestError):
    """The API refused this item's prompt as such; the same prompt would be refused again."""


class EveryItemRefused(DigestError):
    """The API refused every item of the week, so there is nothing to send."""


class ModelNotConfigured(DigestError):
    """A worker has no ``ANTHROPIC_API_KEY`` and was not told to summarize offline."""

    def __str__(self) -> str:
        return (
            "ANTHROPIC_API_KEY is not set on this worker (REDIS_URL is set: a real deployment); "
            "set it, or set DIGEST_OFFLINE=1 to send offline summaries"
        )


class ModelUnavailable(DigestError):
    """The model kept failing transiently after every attempt the policy allows."""

    transient = True


class MailFailed(DigestError):
    """Delivering the email failed, and sending it again unchanged would fail alike."""


class MailUnavailable(MailFailed):
    """The mail server could not be reached, or answered with a temporary (4xx) refusal."""

    transient = True


def is_transient_failure(error: BaseException) -> bool:
    """The digest's answer to ``RunRetry.retryable``: retry the run later, or fail it for good."""
    return isinstance(error, DigestError) and error.transient
