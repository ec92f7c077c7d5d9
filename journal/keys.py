"""The one place every Redis key of the journal is built.

Scripts receive these names through ``KEYS`` and never rebuild them, so a typo cannot leak a
key and a key layout change is one edit. Every key of one run carries the run's full id in a
``{...}`` hash tag, so a script that touches several of them stays inside one Redis Cluster
slot. The two global indexes (``runs`` and ``due``) are outside it: the scripts that open,
renew and close a run write them in the same script as the run's own keys, fenced and in one
round trip, which needs one server (or Sentinel), not Cluster.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from journal.errors import InvalidRunId

RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,128}")
WORKFLOW_PATTERN = re.compile(r"[a-z][a-z0-9_-]{0,31}")


def validate_run_id(run_id: str) -> str:
    """Refuse a run id before any key is built from it.

    Ids become part of key names and file names; braces would break the hash tag, separators
    and newlines would make keys ambiguous or unsafe to print.

    Raises:
        InvalidRunId: naming the id and what is wrong with it.
    """
    if not isinstance(run_id, str):
        raise InvalidRunId(repr(run_id), "it must be a string")
    if run_id == "":
        raise InvalidRunId(run_id, "it is empty")
    if len(run_id) > 128:
        raise InvalidRunId(run_id[:20] + "...", f"it is {len(run_id)} characters long")
    if run_id in (".", "..") or run_id.startswith(".."):
        raise InvalidRunId(run_id, "it must not start with '..'")
    if not RUN_ID_PATTERN.fullmatch(run_id):
        bad = next(ch for ch in run_id if not RUN_ID_PATTERN.fullmatch(ch))
        raise InvalidRunId(run_id, f"it contains {bad!r}")
    return run_id


def validate_workflow(name: str) -> str:
    """Workflow names are chosen by code, not users, but they end up in every key too."""
    if not WORKFLOW_PATTERN.fullmatch(name):
        raise ValueError(f"workflow name {name!r} must match {WORKFLOW_PATTERN.pattern}")
    return name


@dataclass(frozen=True)
class RunKeys:
    """The keys of one run, all sharing the ``{workflow:run_id}`` hash tag."""

    prefix: str
    workflow: str
    run_id: str

    @property
    def run(self) -> str:
        """The run's full id, ``<workflow>:<run_id>``, as stored in the indexes."""
        return f"{self.workflow}:{self.run_id}"

    def _key(self, part: str) -> str:
        return f"{self.prefix}:{{{self.run}}}:{part}"

    @property
    def steps(self) -> str:
        """Hash: step key -> JSON record."""
        return self._key("steps")

    @property
    def meta(self) -> str:
        """Hash: status, timestamps, deliveries, last error, waits."""
        return self._key("meta")

    @property
    def lease(self) -> str:
        """String ``<fence>:<token>`` of the current holder, with a PX expiry."""
        return self._key("lease")

    @property
    def fence(self) -> str:
        """Counter incremented on every acquisition."""
        return self._key("fence")

    @property
    def signals(self) -> str:
        """Hash: signal name -> JSON payload, first one wins."""
        return self._key("signals")

    @property
    def effects(self) -> str:
        """Hash: effect step key -> ``<fence>:<deadline_ms>:<state>``, its claimant, receipt."""
        return self._key("effects")

    def all(self) -> tuple[str, ...]:
        """Every per-run key, for inspection and deliberate deletion."""
        return (self.steps, self.meta, self.lease, self.fence, self.signals, self.effects)


@dataclass(frozen=True)
class Keyspace:
    """The journal's namespace: a prefix, and the global indexes under it."""

    prefix: str = "journal"

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9._:-]{1,64}", self.prefix):
            raise ValueError(f"key prefix {self.prefix!r} must be 1-64 of [A-Za-z0-9._:-]")

    def run(self, workflow: str, run_id: str) -> RunKeys:
        """Keys of one run, after validating both names."""
        return RunKeys(self.prefix, validate_workflow(workflow), validate_run_id(run_id))

    def parse_run(self, full_id: str) -> RunKeys:
        """Keys from a full id read back from an index (``digest:2026-w42``)."""
        workflow, sep, run_id = full_id.partition(":")
        if not sep:
            raise InvalidRunId(full_id, "an indexed run must read <workflow>:<run_id>")
        return self.run(workflow, run_id)

    @property
    def runs(self) -> str:
        """Sorted set: full run id by last update (ms), for listing without SCAN."""
        return f"{self.prefix}:runs"

    @property
    def due(self) -> str:
        """Sorted set: full run id by the time (ms) someone must look at it again.

        Holds waiting runs by wake-up time and running runs by lease expiry plus a grace, so
        one sweep both wakes sleepers and recovers runs whose worker died.
        """
        return f"{self.prefix}:due"
