"""The journal: a handle on the runs kept in one Redis database, and what can be done to them.

Every start of a workflow (``Workflow.start``, a Celery worker's delivery) goes through
``Journal._deliver``, so both take the same lease, replay the same journal and leave the same
meta (the delivery itself is ``journal._delivery``'s). The rest acts on runs from outside: signals,
the due sweep's claim, un-parking, deleting.
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

import redis

from journal._clock import Clock, SystemClock, millis
from journal._redis.backend import RedisBackend, Snapshot
from journal._redis.scripts import Client
from journal._schema import codec
from journal._schema.keys import Keyspace, RunKeys
from journal._schema.meta import RunMeta
from journal._schema.records import decode_effects
from journal._schema.status import RunStatus
from journal._settings import Settings
from journal.errors import Hints

if TYPE_CHECKING:  # the delivery's: a journal that only reads runs never imports them
    from journal._delivery import Outcome, Runner
    from journal._run import Run, StepEvent

log = logging.getLogger(__name__)

R = TypeVar("R")


@dataclass
class Journal:
    """A handle on the journal in one Redis database or Cluster; cheap to share across threads.

    Given a cluster client (``journal.connect`` builds one for a cluster node's URL), the
    keyspace takes its sharded layout, whatever its shard count: every run's keys and its
    shard's indexes then share one hash tag, so every script stays in one slot.
    """

    client: Client
    keyspace: Keyspace = field(default_factory=Keyspace)
    settings: Settings = field(default_factory=Settings)
    clock: Clock = field(default_factory=SystemClock)
    url: str = "redis"
    hints: Hints = field(default_factory=Hints)

    def __post_init__(self) -> None:
        if isinstance(self.client, redis.RedisCluster) and not self.keyspace.cluster:
            self.keyspace = replace(self.keyspace, cluster=True)
        self.backend = RedisBackend(self.client, self.keyspace, self.url, self.hints)
        if self.settings.fsync_records:
            self.backend.require_waitaof(self.url)
        if self.settings.wait_replicas:
            self.backend.require_replicas(self.url, self.settings.wait_replicas)

    @functools.cached_property
    def runner(self) -> Runner:
        """What delivers this journal's runs, made on the first delivery.

        Its module brings the lease, the step runner and tracing: a journal that only reads
        runs (``digest show``) has no use for them.
        """
        from journal._delivery import Runner

        return Runner(self.backend, self.settings, self.clock, self.hints)

    def keys(self, workflow: str, run_id: str) -> RunKeys:
        """The validated keys of one run."""
        return self.keyspace.run(workflow, run_id)

    def meta(self, keys: RunKeys) -> RunMeta:
        """The run's meta hash, parsed (``RunMeta``: its fields as text, typed readers)."""
        return RunMeta.parse(keys.run, self.backend.meta(keys))

    def snapshot(self, keys: RunKeys) -> Snapshot:
        """One consistent read of a run: meta, steps, lease, signals and effects together."""
        return self.backend.snapshot(keys)

    def oldest_due(self) -> float | None:
        """When the oldest entry of the due index fell due (epoch ms), or None when empty."""
        return self.backend.oldest_due()

    def effect_states(self, keys: RunKeys) -> dict[str, str]:
        """The run's effects by step key: their states (``journal.ops.views.RunView.effects``)."""
        return decode_effects(self.backend.effects(keys))[0]

    def _deliver(
        self,
        keys: RunKeys,
        body: Callable[[Run], R],
        *,
        args: dict[str, Any] | None = None,
        on_step: Callable[[StepEvent], None] | None = None,
        delivered: bool = False,
    ) -> Outcome:
        """Run ``body`` for one run under its lease, replaying what the journal holds.

        The one path every start takes (``Workflow.start``, a worker's delivery); the body is
        the workflow's, so a workflow is defined in one place (``journal.workflow``). ``args``
        are frozen at the first start; ``delivered`` counts the start in ``meta.deliveries``.

        Opening (lease, fence, counters, status, arguments, both indexes, the journal read) is
        one script, closing (status, outcome, indexes, release) one more, each step one: a run
        of S new steps costs S + 2 round trips, plus a renewal every third of the lease TTL.
        """
        return self.runner.execute(keys, body, args, on_step, delivered)

    # -- operations on runs from outside ---------------------------------------------------

    def reset(self, workflow: str, run_id: str) -> bool:
        """Un-park a run deliberately, so the next delivery starts it again.

        Its recorded steps stay: the reset run resumes where it stopped. A run that is not
        parked (finished, running, or never started) is left exactly as it is.

        Returns:
            Whether the run was parked.
        """
        keys = self.keys(workflow, run_id)

        return bool(self.backend.un_park(keys))

    def delete(self, workflow: str, run_id: str) -> int:
        """Remove every key of one run and its index entries (a dry run's scratch journal)."""
        keys = self.keys(workflow, run_id)
        return int(self.backend.delete(keys))

    def send_signal(
        self,
        workflow: str,
        run_id: str,
        name: str,
        payload: Any,
        *,
        on_wake: Callable[[RunKeys], Any] | None = None,
    ) -> bool:
        """Deliver a signal: stored first-wins, then the run is woken if it waits for it.

        Stored before the wait is checked, and the run checks for it in the same script that
        records its wait, so a signal racing a run about to suspend is never lost. Woken means
        due now in the index (the sweep's safety net) and ``on_wake(keys)`` called, for a
        queue that can start the run at once.

        Returns:
            True if this payload was stored; False if a signal of that name was already there.
        """
        keys = self.keys(workflow, run_id)
        stored = bool(self.backend.store_signal(keys, name, codec.dumps(payload)))
        meta = self.meta(keys)
        waiting = meta.wait if meta.status == RunStatus.WAITING else None
        if waiting is not None and waiting.signal == name:
            self.backend.make_due(keys, millis(self.clock.now()))
            if on_wake is not None:
                on_wake(keys)
        return stored

    def claim_due(self, limit: int = 100) -> list[RunKeys]:
        """Claim runs whose wake-up or lease-expiry time has passed (atomic across sweepers)."""
        now = self.clock.now()
        reply = self.backend.claim_due(millis(now), limit, millis(now + self.settings.rearm_after))
        claimed: list[RunKeys] = []
        for raw in reply:
            try:
                claimed.append(self.keyspace.parse_run(raw.decode()))
            except Exception:
                log.error("due index holds an unreadable run %r; removing it", raw)
                self.backend.forget_due(raw)
        return claimed

    def expect(self, keys: RunKeys, args: dict[str, Any]) -> bool:
        """Arm a run about to be sent, so a delivery lost before it opens is sent again.

        Until a delivery opens a run, only the broker knows of it: a worker killed with the
        message reserved leaves it unacknowledged until the broker's visibility timeout, and a
        broker that loses it loses the run. Armed ``rearm_after`` ahead with the send's
        arguments (``meta.sent_args``: the run's own are frozen by its first start, with the
        defaults of where it runs), the run is sent again by the due sweep unless a delivery
        opened it by then; a run that has opened keeps its own due time, and nothing is
        written.

        Returns:
            Whether the run has never opened.
        """
        at = millis(self.clock.now() + self.settings.rearm_after)
        return self.backend.expect(keys, at, codec.dumps(args))

    def run_args(self, keys: RunKeys) -> dict[str, Any]:
        """The arguments a run was delivered with, for re-enqueueing it.

        Those its first start froze; for a run no delivery has opened, those it was sent with.
        """
        meta = self.meta(keys)
        frozen = meta.args
        return (meta.sent_args if frozen is None else frozen) or {}


def jitter(seconds: float, spread: float = 0.2) -> float:
    """``seconds`` plus up to ``spread`` of itself, so retries of many runs do not align."""
    return seconds + random.uniform(0, spread * max(seconds, 1.0))
