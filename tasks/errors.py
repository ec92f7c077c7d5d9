"""Every failure the digest raises, under one root.

DigestError
├── BadInput          an items file, run id or option a user must fix (CLI exit 2)
├── ModelAuthFailed   the Anthropic API refused the key (fails the run at once)
├── ModelNotConfigured a worker has no API key and was not told to run offline
├── ModelUnavailable  transient model failures outlasted the retry budget
└── MailFailed        the mail server refused or could not be reached
"""

from __future__ import annotations


class DigestError(Exception):
    """Root of every error raised by the digest application."""


class BadInput(DigestError):
    """Input a user must fix; the message names the file or value, the problem and the fix."""


class ModelAuthFailed(DigestError):
    """The Anthropic API answered 401: retrying cannot help."""


class ModelNotConfigured(DigestError):
    """A worker has no ``ANTHROPIC_API_KEY`` and was not told to summarize offline."""

    def __str__(self) -> str:
        return (
            "ANTHROPIC_API_KEY is not set on this worker; set it, or set DIGEST_OFFLINE=1 to "
            "send offline summaries"
        )


class ModelUnavailable(DigestError):
    """The model kept failing transiently after every attempt the policy allows."""


class MailFailed(DigestError):
    """Delivering the email failed."""
