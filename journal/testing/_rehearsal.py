"""A run replayed in memory: recorded steps, no store, no lease, nothing written anywhere.

The same ``Run`` a worker drives, over a ``MemoryStore`` instead of Redis and a guard that
always holds, so a replay takes exactly the path a resumed run would: recorded steps return
their results, drift raises ``ReplayMismatch`` naming both keys, version gates answer as they
would for that history. What happens at a step the recording lacks is the caller's policy:

- a test (``journal.testing.replay``) runs it live when allowed, else refuses it
  (``StepNotInFixture``, with the nearest recorded keys);
- a deploy check (``journal.testing.preflight``) stops there (``Frontier``): the run would go
  on from that step, so every recorded step before it replayed cleanly.

An effect the recording lacks is never performed: the store refuses its claim, through the
same policy. Nothing here touches a server; what a step run live touches is its own business.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol, TypeVar

from journal._clock import Clock
from journal._lease import Holding, InFlight
from journal._redis.backend import (
    Claimant,
    Confirming,
    EffectClaim,
    EffectTerms,
    Recorded,
    Settled,
    StepWrite,
)
from journal._riders import send_alone
from journal._run import Run, StepEvent, StepPolicy
from journal._schema.keys import Keyspace, RunKeys
from journal._schema.meta import Wait
from journal._waits import Suspend
from journal._workflow import Workflow

R = TypeVar("R")


class Policy(StepPolicy, Protocol):
    """A replay's answer to a step or an effect the recording lacks (see the module)."""

    def refuse_effect(self, key: str) -> NoReturn:
        """An effect the recording lacks was about to be claimed: raise, always."""
        ...


class Frontier(Exception):
    """The replay reached a step the recording lacks: where the recorded run would go on.

    Not a ``JournalError``: a deploy check stops here on purpose, and the run is fine.
    """

    def __init__(self, key: str, kind: str) -> None:
        super().__init__(key, kind)
        self.key = key
        self.kind = kind


class StopAtFrontier:
    """Stop at the first step or effect the recording lacks: nothing is ever run."""

    def exempt(self, key: str) -> bool:
        """Never: drift is checked at every step."""
        return False

    def admit(self, key: str, kind: str) -> NoReturn:
        """Stop: the recorded run would go on from here, so nothing before it drifted."""
        raise Frontier(key, kind)

    def refuse_effect(self, key: str) -> NoReturn:
        """Stop, as at a step: the effect is never performed."""
        raise Frontier(key, "effect")


class RunOn:
    """Run every step the recording lacks (a fork's rest, in memory); stop before an effect."""

    def exempt(self, key: str) -> bool:
        """Never: drift is checked at every step."""
        return False

    def admit(self, key: str, kind: str) -> None:
        """Let it run."""

    def refuse_effect(self, key: str) -> NoReturn:
        """Stop: an effect is never performed in memory."""
        raise Frontier(key, "effect")


class MemoryStore:
    """A ``StepStore`` in memory: records first-writer-wins in a dict, signals as given.

    Args:
        signals: the payloads delivered to the run, by name, as the signals hash holds them.
        policy: what to do when an effect the recording lacks is about to be claimed.
    """

    def __init__(self, signals: Mapping[str, bytes], policy: Policy) -> None:
        self.records: dict[str, bytes] = {}
        self._signals = dict(signals)
        self._policy = policy
        self._lock = threading.Lock()

    def record(self, keys: RunKeys, write: StepWrite) -> tuple[Recorded, Any]:
        """Keep a step run live, as ``HSETNX`` would: the first record of a key stands.

        Its riders go to their own store, each alone: a rehearsal's record is in memory.
        """
        send_alone(write.riders)
        with self._lock:
            found = self.records.get(write.step)
            if found is not None:
                return Recorded.ALREADY, found
            self.records[write.step] = write.encoded
            return Recorded.RECORDED, None

    def signal(self, keys: RunKeys, name: str) -> bytes | None:
        """The payload of signal ``name`` the run had received, if any."""
        return self._signals.get(name)

    def effect_claim(
        self, keys: RunKeys, effect: str, claimant: Claimant, terms: EffectTerms
    ) -> EffectClaim:
        """Refuse: a replay never performs an effect (the policy says how it refuses)."""
        self._policy.refuse_effect(effect)

    def make_due(self, keys: RunKeys, at_ms: int) -> None:
        """Nothing to wake: a replay has no due index and no other holder."""

    def effect_settle(
        self, keys: RunKeys, holder: str, effect: str, fence: int, state: str, receipt: bytes
    ) -> Settled:
        """Refuse, as ``effect_claim`` does: no claim of a replay ever stands."""
        self._policy.refuse_effect(effect)

    def batch_owners(self, batch_ids: Sequence[str]) -> dict[str, str]:
        """Refuse: only a batch's creation, an effect, reads the registry."""
        self._policy.refuse_effect("batch registry")

    def own_batch(self, batch_id: str, run: str, *, first: bool) -> str:
        """Refuse, as ``batch_owners`` does."""
        self._policy.refuse_effect("batch registry")


class _Held:
    """The guard of a run in memory: no lease to lose, no operator to cancel it."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.flight = InFlight()  # published by no one: no lease to renew

    def ensure(self) -> None:
        """Always held."""

    def confirm(self, effect: Confirming | None = None) -> bool:
        """Always held; no claim of a replay ever stands (``effect_claim`` refused it)."""
        return effect is None


class _GatedRun(Run):
    """A ``Run`` that notes what each version gate answered: the old path or the new."""

    def __init__(self, gates: dict[str, int], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gates = gates

    def version(self, key: str, current: int) -> int:
        """``Run.version``, noted."""
        answer = super().version(key, current)
        self.gates[key] = answer
        return answer


@dataclass(frozen=True)
class Rehearsal:
    """How a replay in memory ended (failures raise instead).

    Attributes:
        run: the full id.
        status: ``done`` (the body returned) or ``waiting`` (it suspended).
        result: the body's return value; wait: what a waiting run waits for.
        replayed: the keys taken from the recording, in the order the code asked for them.
        ran: the keys run live.
        unreplayed: recorded keys the code never asked for.
        gates: each version gate met and what it answered (0: the old path).
    """

    run: str
    status: str
    result: Any
    wait: Wait | None
    replayed: tuple[str, ...]
    ran: tuple[str, ...]
    unreplayed: tuple[str, ...]
    gates: dict[str, int]


def rehearse(
    workflow: Workflow[Any, Any],
    run_id: str,
    args: Mapping[str, Any],
    recorded: Mapping[str, bytes],
    *,
    signals: Mapping[str, bytes],
    policy: Policy,
    clock: Clock,
    on_step: Callable[[StepEvent], None] | None = None,
    gates: dict[str, int] | None = None,
) -> Rehearsal:
    """Run ``workflow``'s body for ``run_id`` over ``recorded``, in memory.

    Args:
        workflow: the workflow as the code defines it now.
        run_id: the run id (its keys are built only to name it; nothing is written).
        args: the options the run froze.
        recorded: the steps hash as the journal holds it (key -> JSON record).
        signals: the signals hash (name -> JSON payload).
        policy: what to do at a step or an effect the recording lacks.
        clock: the clock of sleeps, signal deadlines and ``now``.
        on_step: told of every step, replayed or run.
        gates: filled with each version gate met and its answer as the replay goes, so a
            caller still has them when the replay raises.

    Raises:
        ReplayMismatch: the code drifted from the recording.
        Exception: whatever the body or the policy raised.
    """
    keys = Keyspace().run(workflow.name, run_id)
    steps = _Steps(on_step)
    run = _GatedRun(
        gates if gates is not None else {},
        holding=Holding(MemoryStore(signals, policy), keys, "rehearsal", 0, _Held(), clock),
        recorded=dict(recorded),
        on_step=steps.observe,
        policy=policy,
    )
    run.args = dict(args)
    try:
        result = workflow.invoke(run)
    except Suspend as suspend:
        return steps.rehearsal(keys.run, "waiting", None, suspend.wait, recorded, run.gates)
    return steps.rehearsal(keys.run, "done", result, None, recorded, run.gates)


class _Steps:
    """The steps a rehearsal replayed and ran, in order, from the threads of its maps too."""

    def __init__(self, on_step: Callable[[StepEvent], None] | None) -> None:
        self.replayed: list[str] = []
        self.ran: list[str] = []
        self._on_step = on_step
        self._lock = threading.Lock()

    def observe(self, event: StepEvent) -> None:
        with self._lock:
            (self.replayed if event.replayed else self.ran).append(event.key)
        if self._on_step is not None:
            self._on_step(event)

    def rehearsal(
        self,
        run: str,
        status: str,
        result: Any,
        wait: Wait | None,
        recorded: Mapping[str, bytes],
        gates: dict[str, int],
    ) -> Rehearsal:
        seen = set(self.replayed)
        return Rehearsal(
            run=run,
            status=status,
            result=result,
            wait=wait,
            replayed=tuple(self.replayed),
            ran=tuple(self.ran),
            unreplayed=tuple(key for key in recorded if key not in seen),
            gates=dict(gates),
        )
