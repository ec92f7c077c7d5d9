"""The one place the digest's own Redis keys are built.

They sit beside the journal's keys under the same prefix, so one prefix isolates a whole
deployment (or a test).
"""

from __future__ import annotations

from dataclasses import dataclass


def text(raw: bytes | str) -> str:
    """A value read back from Redis as text (clients may or may not decode responses)."""
    return raw.decode() if isinstance(raw, bytes) else raw


@dataclass(frozen=True)
class DigestKeys:
    """Keys that outlive single runs: what earlier digests covered, and dispatch markers."""

    prefix: str = "journal"

    @property
    def seen(self) -> str:
        """Set: ids of items covered by earlier digests (updated as a set union)."""
        return f"{self.prefix}:digest:seen"

    @property
    def claims(self) -> str:
        """Hash: item id -> the run (``digest:<run_id>``) that selected it and has not ended."""
        return f"{self.prefix}:digest:claims"

    def dispatched(self, run_id: str) -> str:
        """String: set once when beat enqueues a weekly run, so restarts never enqueue twice."""
        return f"{self.prefix}:digest:dispatched:{run_id}"

    @property
    def dispatch_watermark(self) -> str:
        """String: the latest weekly run id beat has dispatched, for catching up after outages."""
        return f"{self.prefix}:digest:dispatch-watermark"
