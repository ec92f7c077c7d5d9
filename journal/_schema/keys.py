"""The one place every Redis key of the journal is built.

Scripts receive these names through ``KEYS`` and never rebuild them, so a typo cannot leak a
key and a key layout change is one edit. The scripts that open, renew and close a run write
the two indexes (``runs`` and ``due``) in the same script as the run's own keys, fenced and in
one round trip, so where the indexes live decides where a run's keys must live:

- **One index** (``shards=1`` on one server, or Sentinel; today's layout): the run's keys
  carry the run's full id as hash tag, ``journal:{digest:2026-w42}:steps``, and the indexes
  are ``journal:runs`` and ``journal:due``.
- **Sharded** (a Redis Cluster, or ``shards > 1``): runs are spread over ``shards`` index
  shards by a CRC32 of their full id, and a run's keys carry its *shard's* hash tag, as its
  shard's two indexes do: ``journal:{s3}:digest:2026-w42:steps`` beside ``journal:{s3}:due``.
  Every script then touches one slot; the sweep claims shard by shard and the listing merges
  the shards, newest first. The shard count is part of the layout: changing it moves runs to
  other keys, so choose it once (more shards than masters spreads the indexes over them).

Rejected: choosing shard tags whose slots land on distinct masters, for an even spread with
few shards. Slot ownership changes with every resharding or failover; a layout must not.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field
from functools import cached_property

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
class Index:
    """One shard's two sorted sets; the single-index layout has exactly one."""

    runs: str
    due: str


_RUN_PARTS = ("steps", "meta", "lease", "flight", "fence", "signals", "effects", "usage")


@dataclass(frozen=True)
class RunKeys:
    """The keys of one run, and of the index shard it is listed in, all in one slot.

    Attributes:
        shard: the run's index shard in the sharded layout (the hash tag is the shard's);
            None in the single-index layout (the hash tag is the run's full id).
        run: the run's full id, ``<workflow>:<run_id>``, as stored in the indexes.
        steps: hash, step key -> JSON record.
        meta: hash, status, timestamps, deliveries, last error, waits.
        lease: string ``<fence>:<token>`` of the current holder, with a PX expiry.
        flight: hash, step key -> started at (ms): the steps its holder runs now, published
            with each renewal of the lease (``renew.lua``) and expiring with it.
        fence: counter incremented on every acquisition.
        signals: hash, signal name -> JSON payload, first one wins.
        effects: hash, effect step key -> ``<fence>:<deadline_ms>:<state>``, its claimant,
            receipt.
        usage: hash, the application's own counters of the run (a model budget's spend and
            holds); the journal never reads it, it lives in the run's slot and goes with it.

    The names are built once, with the value: a run reads its keys dozens of times.
    """

    prefix: str
    workflow: str
    run_id: str
    shard: int | None = None
    run: str = field(init=False, repr=False)
    steps: str = field(init=False, repr=False)
    meta: str = field(init=False, repr=False)
    lease: str = field(init=False, repr=False)
    flight: str = field(init=False, repr=False)
    fence: str = field(init=False, repr=False)
    signals: str = field(init=False, repr=False)
    effects: str = field(init=False, repr=False)
    usage: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        run = f"{self.workflow}:{self.run_id}"
        if self.shard is None:
            start = f"{self.prefix}:{{{run}}}"
        else:
            start = f"{_shard_tag(self.prefix, self.shard)}:{run}"
        object.__setattr__(self, "run", run)
        for part in _RUN_PARTS:
            object.__setattr__(self, part, f"{start}:{part}")

    @cached_property
    def index(self) -> Index:
        """The runs and due indexes this run is listed in."""
        return _index(self.prefix, self.shard)

    def all(self) -> tuple[str, ...]:
        """Every per-run key, for inspection and deliberate deletion."""
        return tuple(getattr(self, part) for part in _RUN_PARTS)


def _shard_tag(prefix: str, shard: int) -> str:
    return f"{prefix}:{{s{shard}}}"


def _index(prefix: str, shard: int | None) -> Index:
    if shard is None:
        return Index(f"{prefix}:runs", f"{prefix}:due")
    tag = _shard_tag(prefix, shard)
    return Index(f"{tag}:runs", f"{tag}:due")


@dataclass(frozen=True)
class Keyspace:
    """The journal's namespace: a prefix, its index shards, and the layout they imply.

    Attributes:
        prefix: the start of every key.
        shards: how many index shards runs are spread over (see the module docstring).
        cluster: the store is a Redis Cluster: the layout is sharded even with one shard.
            The journal sets it when it finds itself connected to a cluster.
    """

    prefix: str = "journal"
    shards: int = 1
    cluster: bool = False

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9._:-]{1,64}", self.prefix):
            raise ValueError(f"key prefix {self.prefix!r} must be 1-64 of [A-Za-z0-9._:-]")
        if not 1 <= self.shards <= 1024:
            raise ValueError(f"shards={self.shards}: must be from 1 to 1024")

    @property
    def sharded(self) -> bool:
        """Whether runs carry their shard's hash tag instead of their own."""
        return self.cluster or self.shards > 1

    def run(self, workflow: str, run_id: str) -> RunKeys:
        """Keys of one run, after validating both names."""
        keys = RunKeys(self.prefix, validate_workflow(workflow), validate_run_id(run_id))
        if not self.sharded:
            return keys
        return RunKeys(keys.prefix, keys.workflow, keys.run_id, self._shard_of(keys.run))

    def _shard_of(self, run: str) -> int:
        return zlib.crc32(run.encode()) % self.shards

    def indexes(self) -> tuple[Index, ...]:
        """Every index shard, in shard order: one in the single-index layout."""
        if not self.sharded:
            return (_index(self.prefix, None),)
        return tuple(_index(self.prefix, shard) for shard in range(self.shards))

    def parse_run(self, full_id: str) -> RunKeys:
        """Keys from a full id read back from an index (``digest:2026-w42``)."""
        workflow, sep, run_id = full_id.partition(":")
        if not sep:
            raise InvalidRunId(full_id, "an indexed run must read <workflow>:<run_id>")
        return self.run(workflow, run_id)

    @property
    def batches(self) -> str:
        """Hash: provider batch id -> the full id of the run it belongs to (``journal.batch``).

        One key for the keyspace, in any slot: a run resolving a batch creation it may have
        made reads it to tell its own batches from other runs'. Never read in a script.
        """
        return f"{self.prefix}:batches"
