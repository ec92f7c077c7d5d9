"""A run's recording: its journal read in one snapshot, replayable in memory.

The deploy check (``preflight``) and an application's dry-run fork both start from the same
place: what the store holds of one run, read once, replayed against the code installed now.
``Recording.load`` is that read; ``replay`` hands it to the rehearsal.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from journal._clock import Clock
from journal._journal import Journal
from journal._schema.keys import RunKeys
from journal._schema.meta import RunMeta
from journal._schema.records import decode_fields
from journal._workflow import Workflow
from journal.errors import ControlRefused
from journal.testing._rehearsal import Policy, Rehearsal, rehearse


@dataclass(frozen=True)
class Recording:
    """What one run recorded, as bytes the store holds (decoded only when asked).

    Attributes:
        keys: the run's keys (``keys.run`` its full id); run_id: its id.
        meta: the meta hash; steps: the steps hash by step key; signals: the signals hash.
    """

    keys: RunKeys
    run_id: str
    meta: dict[bytes, bytes]
    steps: dict[str, bytes]
    signals: dict[str, bytes]

    @classmethod
    def load(cls, journal: Journal, workflow: str, run_id: str) -> Recording:
        """Read ``run_id``'s recording in one MULTI of reads.

        Raises:
            ControlRefused: no such run.
            StoreUnavailable: the store could not be read.
        """
        keys = journal.keys(workflow, run_id)
        seen = journal.snapshot(keys)
        if not seen.meta:
            raise ControlRefused(keys.run, "no such run")
        steps = {name.decode(): raw for name, raw in seen.steps.items()}
        signals = {name.decode(): raw for name, raw in seen.signals.items()}
        return cls(keys, run_id, seen.meta, steps, signals)

    def text_meta(self) -> RunMeta:
        """The meta hash as text.

        Raises:
            CorruptJournal: a field this library did not write.
        """
        return RunMeta.parse(self.keys.run, self.meta)

    def args(self) -> dict[str, Any]:
        """The options the run froze at its first start (none if it never started).

        Raises:
            CorruptJournal: they are not a JSON object, or the meta is unreadable.
        """
        return self.text_meta().args or {}

    def seq(self, key: str) -> int:
        """The order in which step ``key`` was recorded.

        Raises:
            ControlRefused: the run has no such step.
            CorruptJournal: its record is not one.
        """
        if key not in self.steps:
            raise ControlRefused(self.keys.run, f"it has no step {key!r}")
        return int(decode_fields(self.keys.run, key, self.steps[key])["seq"])

    def before(self, key: str) -> Recording:
        """This recording cut just before step ``key``: what a fork from ``key`` keeps.

        Raises:
            ControlRefused: the run has no such step.
        """
        if key not in self.steps:
            raise ControlRefused(self.keys.run, f"it has no step {key!r} to fork from")
        cut = self.seq(key)
        kept = {name: raw for name, raw in self.steps.items() if self.seq(name) < cut}
        return replace(self, steps=kept)

    def replay(
        self,
        workflow: Workflow[Any, Any],
        *,
        policy: Policy,
        clock: Clock,
        gates: dict[str, int] | None = None,
    ) -> Rehearsal:
        """Replay ``workflow`` as installed over this recording, in memory (``rehearse``).

        Raises:
            Frontier: the policy stopped at a step the recording lacks.
            ReplayMismatch: the code drifted from the recording.
            Exception: whatever the body raised on the recorded results.
        """
        return rehearse(
            workflow,
            self.run_id,
            self.args(),
            self.steps,
            signals=self.signals,
            policy=policy,
            clock=clock,
            gates=gates,
        )
