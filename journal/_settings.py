"""How a journal holds and recovers runs: its settings, apart from the code that delivers runs.

A journal that only reads runs (``digest show``) is built with these settings and never
delivers one; they must not bring the delivery's lease, runner and tracing along.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from journal._redis.backend import RecordWait
from journal._retry import RunRetry


@dataclass(frozen=True)
class Settings:
    """How runs are held and recovered.

    Attributes:
        lease_ttl: seconds a lease lives without renewal; a crashed holder's run is taken
            over this long after it died.
        recovery_grace: seconds after a lease's expiry before the due sweep re-enqueues the run.
        rearm_after: seconds before the sweep looks again at a run it enqueued, or at a run
            sent that no delivery has opened yet, in case that message was lost.
        max_stalled_starts: starts that died without recording anything before a run is parked.
        fsync_records: wait for the local AOF fsync of every record (WAITAOF; Redis 7.2+, Valkey).
        wait_replicas: wait for this many replicas to have every record (WAIT), so that a
            failover to one of them loses no recorded step; in the record's round trip.
        run_retry: which failures the due sweep retries, how often and for how long; by
            default none.
    """

    lease_ttl: float = 30.0
    recovery_grace: float = 5.0
    rearm_after: float = 300.0
    max_stalled_starts: int = 5
    fsync_records: bool = False
    wait_replicas: int = 0
    run_retry: RunRetry = field(default_factory=RunRetry)

    def __post_init__(self) -> None:
        if self.lease_ttl < 0.3:
            raise ValueError(f"lease_ttl={self.lease_ttl}: must be at least 0.3 s")
        if self.max_stalled_starts < 1:
            raise ValueError("max_stalled_starts must be at least 1")
        if self.wait_replicas < 0:
            raise ValueError("wait_replicas must not be negative")

    @property
    def record_wait(self) -> RecordWait:
        """What each record waits for, as the backend sends it."""
        return RecordWait(replicas=self.wait_replicas, local_fsync=self.fsync_records)
