"""The email the digest sends and the receipt its sending records, apart from any transport.

What reads a run (``digest show``, the console) words its receipt without importing SMTP.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Email:
    """One message to deliver."""

    to: str
    subject: str
    body: str


@dataclass(frozen=True)
class Receipt:
    """What a send returns; ``sent`` is False when the key was delivered earlier."""

    id: str
    sent: bool

    def to_json(self) -> dict[str, Any]:
        """The form the ``send`` step records."""
        return {"id": self.id, "sent": self.sent}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Receipt:
        """Rebuild a receipt from a recorded step or a stored receipt."""
        return cls(id=data["id"], sent=data["sent"])
