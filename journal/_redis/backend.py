"""The storage seam: every Redis command and script the journal sends, and nothing else.

The rest of the library speaks in run operations (open, record, renew, close, cancel, claim
an effect, claim due runs, read a snapshot) and typed replies; only this module holds a
client. Each operation is one round trip, which is what a run's cost (steps + 2) is counted
in, and each touches one run's keys plus, where it must stay atomic with them, its index
shard's two sorted sets: one slot, so the same operations run on one server and on a Redis
Cluster (``connect`` tells them apart; ``journal._schema.keys`` places the keys). Only the sweep and
the listing see every shard, one at a time.

Reply codes are the scripts' own numbers (see each ``journal/lua/*.lua`` header), named here;
a code a script does not document raises ``UnknownScriptStatus``, never a guess. A lost
connection is translated here and only here, as httpx maps its transports' errors: every
operation raises ``StoreUnavailable``, naming the store and what to do, and no caller catches
redis-py's own exceptions for it.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import logging
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Protocol, TypeVar, cast
from urllib.parse import urlsplit

import redis
from redis._parsers import _RESP2Parser

from journal._redis.scripts import Client, KeyOrArg, Scripts
from journal._riders import Rider, send_alone
from journal._schema import codec
from journal._schema.keys import Keyspace, RunKeys
from journal.errors import (
    Hints,
    NotDurable,
    StoreUnavailable,
    StoreUnsupported,
    UnknownScriptStatus,
)

log = logging.getLogger(__name__)

DELETE = "\0"
"""A field value ``close`` removes instead of writing."""


@dataclass(frozen=True)
class RecordWait:
    """What each record waits for before its step counts as done, in the record's round trip.

    Attributes:
        replicas: WAIT for this many replicas to have received the record (in memory): a
            failover to one of them keeps it. 0 waits for none.
        local_fsync: WAITAOF for the master's own append-only file to have it on disk: a
            restart of the master keeps it.
        timeout_ms: how long either may take before the record is not trusted (``NotDurable``).
    """

    replicas: int = 0
    local_fsync: bool = False
    timeout_ms: int = 1000

    @property
    def waits(self) -> bool:
        """Whether a record waits for anything at all."""
        return self.replicas > 0 or self.local_fsync

    def commands(self) -> list[tuple[KeyOrArg, ...]]:
        """The commands sent after the record script, in order."""
        commands: list[tuple[KeyOrArg, ...]] = []
        if self.replicas:
            commands.append(("WAIT", self.replicas, self.timeout_ms))
        if self.local_fsync:
            commands.append(("WAITAOF", 1, 0, self.timeout_ms))
        return commands

    def shortfall(self, replies: Sequence[Any]) -> str | None:
        """What ``replies`` (to ``commands``) fell short of; None when all was confirmed."""
        replies = list(replies)
        if self.replicas:
            acked = replies.pop(0)
            if isinstance(acked, Exception):
                return repr(acked)
            if int(acked) < self.replicas:
                return f"{int(acked)} of {self.replicas} replicas acknowledged it"
        if self.local_fsync:
            synced = replies.pop(0)
            if isinstance(synced, Exception) or int(synced[0]) < 1:
                return repr(synced)
        return None


NO_WAIT = RecordWait()


@dataclass(frozen=True)
class StepWrite:
    """One step's record as a run sends it: who writes, what, and what travels with it.

    Attributes:
        holder: the lease value (``<fence>:<token>``) the write is fenced by.
        step: the step key the record is written under, first writer wins.
        encoded: the record itself (``journal._schema.records``).
        wait: what the record waits for before the step counts as done.
        riders: writes of other slots the step's body sent, carried with the record.
        earlier: records that waited for a write of the run's (``Run.unwritten``), as step
            key, record pairs: written before this one, in its script.
    """

    holder: str
    step: str
    encoded: bytes
    wait: RecordWait = NO_WAIT
    riders: Sequence[Rider] = ()
    earlier: Sequence[tuple[str, bytes]] = ()


def connect(url: str, **options: Any) -> Client:
    """A client of the store at ``url``: a cluster client when that node is in a cluster.

    Any node of a cluster will do: the cluster client learns the others from it. The server
    is asked (``INFO cluster``), not the URL, since nothing in a URL says cluster.

    Args:
        url: a ``redis://``, ``rediss://`` or ``unix://`` URL.
        options: client options (timeouts), passed to whichever client is built.
    """
    plain = plain_client(url, options)
    try:
        enabled = plain.info("cluster").get("cluster_enabled") in (1, "1")
    except redis.ResponseError:  # a server or proxy that refuses INFO is not one to shard for
        enabled = False
    if not enabled:
        return plain
    plain.close()
    return cluster_client(url, options)


def plain_client(url: str, options: Mapping[str, Any]) -> redis.Redis:
    """A client of the single server at ``url``; over TLS, one that reads TLS, not the socket.

    From redis-py 8.0, the hiredis parser asks the operating system whether a pooled
    connection holds stray bytes. The session tickets a TLS 1.3 server sends after its
    handshake make a new connection's socket readable with no reply in it, so the pool
    drops that connection and handshakes again, and refuses it ("Connection not ready")
    when the tickets win twice. The pure-Python parser reads through TLS and sees no reply.
    A cluster client needs none of this: its HELLO reads the tickets while connecting.
    """
    if urlsplit(url).scheme == "rediss":
        options = {"parser_class": _RESP2Parser, **options}
    return redis.Redis.from_url(url, **options)


def cluster_client(url: str, options: Mapping[str, Any]) -> redis.RedisCluster:
    """A cluster client of the cluster ``url``'s node is in, speaking RESP3 whatever ``options``.

    Under RESP2, redis-py's cluster client answers a transaction's HGETALL as a flat list; a
    plain client parses it either way, so a caller may choose RESP2 (no HELLO per connection)
    for a single server and still reach a cluster.
    """
    return redis.RedisCluster.from_url(url, **{**options, "protocol": 3})


E = TypeVar("E", bound=IntEnum)


class Opened(IntEnum):
    """How ``open.lua`` answered."""

    BUSY = 0
    ACQUIRED = 1
    ENDED = 2
    STALLED = 3  # acquired, but the run died at start too often: park it
    CANCEL_PENDING = 4  # acquired with a cancel pending: cancel it
    PARKED = 5
    BAD_COUNTER = -1
    BAD_WAIT = -3

    @property
    def acquired(self) -> bool:
        """Whether the lease was taken (whatever the run then does with it)."""
        return self in (Opened.ACQUIRED, Opened.STALLED, Opened.CANCEL_PENDING)


class Renewed(IntEnum):
    """How ``renew.lua`` answered (``EXTENDED``: and the effect's claim confirmed, if asked)."""

    LOST = 0
    EXTENDED = 1
    CANCEL_PENDING = 2
    NOT_THIS_CLAIM = -3


class Released(IntEnum):
    """How ``release.lua`` answered."""

    NOT_HOLDER = 0
    RELEASED = 1


class Recorded(IntEnum):
    """How ``record.lua`` answered."""

    RECORDED = 1
    ALREADY = 2
    RECORDED_CANCEL_PENDING = 3
    LEASE_EXPIRED = -1
    FENCED = -2


class Closed(IntEnum):
    """How ``close.lua`` answered."""

    CLOSED = 1
    SIGNAL_ARRIVED = 3
    CANCEL_PENDING = 4
    LEASE_EXPIRED = -1
    FENCED = -2


class Cancelling(IntEnum):
    """How ``cancel.lua`` answered."""

    NO_SUCH_RUN = 0
    ENDED = 1
    AT_NEXT_STEP = 2
    CANCELLED = 3
    EFFECT_CLAIMED = 4


class EffectClaimed(IntEnum):
    """How ``effect_claim.lua`` answered."""

    CLAIMED = 1
    DONE_EARLIER = 2
    CLAIMED_BY_EARLIER = 3
    AMBIGUOUS = 4
    LEASE_EXPIRED = -1
    FENCED = -2


class Settled(IntEnum):
    """How ``effect_settle.lua`` answered."""

    SETTLED = 1
    SETTLED_WITHOUT_LEASE = 2
    NOT_THIS_CLAIM = -3


class Decided(IntEnum):
    """How ``effect_decide.lua`` answered."""

    NO_SUCH_EFFECT = 0
    DECIDED = 1
    NOT_AMBIGUOUS = 2


class Purging(IntEnum):
    """How ``purge.lua`` answered."""

    KEPT = 0
    DELETED = 1
    EFFECT_UNSETTLED = 2


def _unsent(keys: RunKeys, riders: Sequence[Rider], replies: Sequence[Any]) -> list[Rider]:
    """The riders the server had no script for, to send alone; a refused one is logged."""
    missed = []
    for rider, reply in zip(riders, replies, strict=True):
        if isinstance(reply, redis.exceptions.NoScriptError):
            missed.append(rider)
        elif isinstance(reply, Exception):
            log.warning("a write sent with %s's record failed: %s", keys.run, reply)
        else:
            rider.heard(reply)
    return missed


def code(script: str, reply: object, codes: type[E]) -> E:
    """The status code at the head of a script's reply, as its enum.

    Raises:
        UnknownScriptStatus: the script and this code disagree; that is a bug, not a retry.
    """
    head = reply[0] if isinstance(reply, list) and reply else reply
    if isinstance(head, int):
        try:
            return codes(head)
        except ValueError:
            pass
    raise UnknownScriptStatus(script, reply)


@dataclass(frozen=True)
class Opening:
    """What opening a run adds to taking its lease, in the same script (see ``open.lua``).

    Attributes:
        max_stalled_starts: starts that died without recording anything before parking.
        due_at_ms: when the run is due again should this holder die (lease expiry + grace).
        args: the run's arguments, frozen unless an earlier start froze some; None for none.
        count_delivery: count this start in ``meta.deliveries`` (a queue delivered it).
        trace: this delivery's trace context (``journal.tracing``), kept in ``meta.trace``
            by the first delivery traced; "" when tracing is off (nothing is written).
    """

    max_stalled_starts: int
    due_at_ms: int
    args: dict[str, Any] | None
    count_delivery: bool = False
    trace: str = ""


@dataclass(frozen=True)
class Closing:
    """What closing a run writes with its lease given back, in one script (see ``close.lua``).

    Attributes:
        fields: the meta fields to set; a field whose value is ``DELETE`` is removed.
        now_ms: the run's score in the runs index.
        due_ms: when the run is due again (a wake-up, a retry); None takes it out of the due
            index.
        unless_signal: a signal whose arrival stops the closing (a run about to wait for it).
        unless_cancelled: a pending cancel stops the closing.
        records: records that waited for a write of the run's (``Run.unwritten``), as step
            key, record pairs: written with the status, or not at all.
    """

    fields: Mapping[str, Any]
    now_ms: int
    due_ms: int | None = None
    unless_signal: str = ""
    unless_cancelled: bool = False
    records: Sequence[tuple[str, bytes]] = ()


@dataclass(frozen=True)
class OpenReply:
    """``open.lua``'s reply, by field.

    Attributes:
        status: what happened.
        fence: the new fence, when acquired.
        stalled: starts without progress, when acquired.
        meta: for an opening, the meta hash before this start (acquired), or all of it (ended,
            parked); flat field, value pairs.
        steps: for an opening that acquired, the steps hash, flat.
        effects: for an opening that acquired, the effects hash's fields: an effect absent
            from them has no claim.
        remaining_ms, holder, process: for a busy lease, the live holder's.
        detail: the counter (bad counter) or the stored wait (bad wait).
    """

    status: Opened
    fence: int = 0
    stalled: int = 0
    meta: list[Any] = field(default_factory=list)
    steps: list[Any] = field(default_factory=list)
    effects: list[bytes] | None = None
    remaining_ms: int = 0
    holder: str = ""
    process: bytes = b""
    detail: str = ""


@dataclass(frozen=True)
class Claimant:
    """Who claims an effect (see ``effect_claim.lua``).

    Attributes:
        holder: the claimant's lease, ``<fence>:<token>``: only the run's holder claims.
        fence: its fence, which the claim carries so a later holder knows whose it was.
        process: its process identity (``ProcessIdentity.encode``), by which a later
            claimant may prove it gone.
        earlier: ``"dead"`` when the claimant proved the earlier claimant's process gone (its
            claim is taken over at once), else ``""``.
    """

    holder: str
    fence: int
    process: str
    earlier: str = ""


@dataclass(frozen=True)
class Confirming:
    """An effect's confirmation, sent with a lease renewal (see ``renew.lua``).

    Attributes:
        effect: the effect's step key.
        fence: the holder's fence, whose claim it must be.
        claim_ms: above 0, the claim is taken here when nobody has one (the opening read
            none): how long it stands, as ``EffectTerms.claim_ms``.
        process: the holder's process identity (JSON), kept with a claim taken here.
        revocable: as ``EffectTerms.revocable``, for a claim taken here.
    """

    effect: str
    fence: int
    claim_ms: int = 0
    process: str = ""
    revocable: bool = False


@dataclass(frozen=True)
class EffectTerms:
    """What a claim asks of the store besides who claims.

    Attributes:
        claim_ms: how long the claim stands: the effect's timeout plus a margin for the
            claimant's clock, which checks the timeout alone.
        repeatable: the receiver drops a repeat of the effect's idempotency key, so an effect
            that may have happened is repeated under it instead of waiting for a decision.
        unknown: why the effect may have happened, should the claim find an earlier claimant
            that confirmed and never settled (a line for the operator).
        revocable: an operator's cancel may end the run whatever the claim's state: its
            application undoes what the effect started (a provider batch is cancelled).
    """

    claim_ms: int
    repeatable: bool
    unknown: str
    revocable: bool = False


@dataclass(frozen=True)
class EffectClaim:
    """``effect_claim.lua``'s reply: a claim, an earlier receipt, a wait, or an unknown.

    Attributes:
        status: what happened.
        resumed: claimed, and an earlier claimant may have acted.
        receipt: the receipt an earlier claimant saved (``DONE_EARLIER``).
        remaining_ms, process, deadline: an earlier claimant that may still act, its
            identity and its claim's deadline as stored (``CLAIMED_BY_EARLIER``).
        fence, detail: the claimant that may have acted and why (``AMBIGUOUS``).
    """

    status: EffectClaimed
    resumed: bool = False
    receipt: bytes = b""
    remaining_ms: int = 0
    process: bytes = b""
    deadline: str = ""
    fence: int = 0
    detail: str = ""


@dataclass(frozen=True)
class Snapshot:
    """One run as one MULTI of reads saw it."""

    meta: dict[bytes, bytes]
    steps: dict[bytes, bytes]
    holder: bytes | None
    lease_ttl_ms: int
    signals: dict[bytes, bytes]
    effects: dict[bytes, bytes]
    flight: dict[bytes, bytes]

    # How many replies ``ask`` queues: a caller's own transaction may carry them.
    READS = 7

    @staticmethod
    def ask(pipe: redis.client.Pipeline, keys: RunKeys) -> None:
        """Queue the reads of one run on ``pipe``, a transaction: ``READS`` replies."""
        pipe.hgetall(keys.meta)
        pipe.hgetall(keys.steps)
        pipe.get(keys.lease)
        pipe.pttl(keys.lease)
        pipe.hgetall(keys.signals)
        pipe.hgetall(keys.effects)
        pipe.hgetall(keys.flight)

    @classmethod
    def of(cls, replies: Sequence[Any]) -> Snapshot:
        """The run the replies of ``ask`` describe."""
        meta, steps, holder, ttl, signals, effects, flight = replies
        return cls(meta, steps, holder, int(ttl), signals, effects, flight)


class StepStore(Protocol):
    """What a run in progress sends to its store: records, a signal's lookup, effects, wake-ups.

    ``RedisBackend`` is the store of every real run; ``journal.testing._rehearsal`` keeps a run in
    memory behind the same calls, to replay recorded steps with no server at all.
    """

    def record(self, keys: RunKeys, write: StepWrite) -> tuple[Recorded, Any]:
        """Write a step's record, first writer wins, sending its riders too; what was found."""
        ...

    def signal(self, keys: RunKeys, name: str) -> bytes | None:
        """The payload of signal ``name``, if it has arrived."""
        ...

    def effect_claim(
        self, keys: RunKeys, effect: str, claimant: Claimant, terms: EffectTerms
    ) -> EffectClaim:
        """Claim ``effect`` for this fence before it is performed."""
        ...

    def make_due(self, keys: RunKeys, at_ms: int) -> None:
        """Put the run in the due index at ``at_ms`` (now, for a wake-up)."""
        ...

    def effect_settle(
        self, keys: RunKeys, holder: str, effect: str, fence: int, state: str, receipt: bytes
    ) -> Settled:
        """Settle this fence's claim: ``done``, ``released`` or ``ambiguous``."""
        ...

    def batch_owners(self, batch_ids: Sequence[str]) -> dict[str, str]:
        """The run each of these provider batches belongs to, where one is known."""
        ...

    def own_batch(self, batch_id: str, run: str, *, first: bool) -> str:
        """Note ``batch_id`` as ``run``'s (only if nobody's yet, when ``first``); its owner."""
        ...


Operation = TypeVar("Operation", bound=Callable[..., Any])
RedisBackendT = TypeVar("RedisBackendT", bound=type)
T = TypeVar("T")
_END = object()


def _flat(records: Sequence[tuple[str, bytes]]) -> list[KeyOrArg]:
    """Step key, record pairs as a script's arguments."""
    flat: list[KeyOrArg] = []
    for step, record in records:
        flat += (step, record)
    return flat


def _translating(operation: Operation) -> Operation:
    """``operation`` raising ``StoreUnavailable`` for a lost connection, lazily read replies too."""

    @functools.wraps(operation)
    def translated(backend: RedisBackend, *args: Any, **kwargs: Any) -> Any:
        with backend._translated():
            reply = operation(backend, *args, **kwargs)
        if isinstance(reply, Iterator):
            return backend._translated_iter(reply)
        return reply

    return cast(Operation, translated)


def _every_operation_translating(cls: RedisBackendT) -> RedisBackendT:
    """Every public operation of the class translated: none can forget, none twice by hand."""
    for name, member in list(vars(cls).items()):
        if callable(member) and not name.startswith("_"):
            setattr(cls, name, _translating(member))
    return cls


@_every_operation_translating
class RedisBackend:
    """The journal's storage on one Redis (or Valkey) database, or on a Redis Cluster.

    On a cluster every call touches one slot (``keyspace`` must be sharded, which ``Journal``
    sees to), so redis-py's cluster client routes it whole to the slot's master.

    Args:
        client: the connection (pool) to the store.
        keyspace: where the runs' keys are.
        url: the store's URL with its secret masked, for the errors to name.
        hints: what those errors tell their reader to do.
    """

    def __init__(
        self, client: Client, keyspace: Keyspace, url: str = "redis", hints: Hints | None = None
    ) -> None:
        self.client = client
        self.keyspace = keyspace
        self.url = url
        self.hints = hints or Hints()

    @functools.cached_property
    def scripts(self) -> Scripts:
        """The journal's scripts bound to the client, their sources read when the first is sent.

        Reading them takes milliseconds that a process which only reads runs (``digest show``)
        has no use for.
        """
        with self._translated():
            return Scripts.register(self.client)

    def unavailable(self, down: redis.ConnectionError | redis.TimeoutError) -> StoreUnavailable:
        """What a lost connection to this store is raised as: it names the store and the fix.

        Also for a connection lost under an application's own step (the delivery's caller).
        """
        return StoreUnavailable(self.url, str(down) or type(down).__name__, self.hints.store_down)

    @contextlib.contextmanager
    def _translated(self) -> Iterator[None]:
        try:
            yield
        except (redis.ConnectionError, redis.TimeoutError) as down:
            raise self.unavailable(down) from down

    def _translated_iter(self, replies: Iterator[T]) -> Iterator[T]:
        """``replies`` read lazily, each page's command translated as it is sent."""
        while True:
            with self._translated():
                reply = next(replies, _END)
            if reply is _END:
                return
            yield cast(T, reply)

    # -- a run's lease -------------------------------------------------------------------

    def open(
        self,
        keys: RunKeys,
        token: str,
        ttl_ms: int,
        now_ms: int,
        process: str,
        dead_holder: str,
        opening: Opening | None,
    ) -> OpenReply:
        """Take the lease (with a new fence) and, with ``opening``, open the run too."""
        run_keys = [keys.lease, keys.fence, keys.meta, keys.steps]
        args: list[KeyOrArg] = [token, ttl_ms, now_ms, process, dead_holder]
        if opening is not None:
            run_keys += [keys.index.runs, keys.index.due, keys.effects]
            args += [opening.max_stalled_starts, opening.due_at_ms, keys.run]
            frozen = b"" if opening.args is None else codec.dumps(opening.args)
            args += [keys.workflow, keys.run_id, frozen]
            args += ["1" if opening.count_delivery else "", opening.trace]
        reply = self.scripts.open(keys=run_keys, args=args)
        status = code("open", reply, Opened)
        if status is Opened.BUSY:
            return OpenReply(
                status, remaining_ms=int(reply[1]), holder=_text(reply[2]), process=reply[3]
            )
        if status in (Opened.ENDED, Opened.PARKED):
            return OpenReply(status, meta=reply[1])
        if status in (Opened.BAD_COUNTER, Opened.BAD_WAIT):
            return OpenReply(status, detail=_text(reply[1]))
        if len(reply) > 3:
            return OpenReply(status, int(reply[1]), int(reply[2]), reply[3], reply[4], reply[5])
        return OpenReply(status, int(reply[1]), int(reply[2]))

    def renew(
        self,
        keys: RunKeys,
        holder: str,
        ttl_ms: int,
        due_at_ms: int | None,
        flight: Mapping[str, int],
        confirming: Confirming | None = None,
    ) -> Renewed:
        """Extend the lease if ``holder`` still has it; publish its steps in ``flight``.

        ``flight``: step key -> started at (ms), replacing what the last renewal published;
        ``due_at_ms`` also pushes the run's due time; ``confirming`` also confirms an effect's
        claim (taking it, if asked and nobody has), in the same round trip.
        """
        run_keys = [keys.lease, keys.meta, keys.flight, keys.effects]
        confirm = confirming or Confirming("", 0)
        args: list[KeyOrArg] = [
            holder,
            ttl_ms,
            0 if due_at_ms is None else due_at_ms,
            keys.run,
            confirm.effect,
            confirm.fence,
            confirm.claim_ms,
            confirm.process,
            "1" if confirm.revocable else "",
        ]
        if due_at_ms is not None:
            run_keys.append(keys.index.due)
        for step, started in flight.items():
            args += [step, started]
        return code("renew", self.scripts.renew(keys=run_keys, args=args), Renewed)

    def release(self, keys: RunKeys, holder: str) -> bool:
        """Give the lease back if ``holder`` still has it (compare-and-DEL)."""
        reply = self.scripts.release(keys=[keys.lease], args=[holder])
        return code("release", reply, Released) is Released.RELEASED

    # -- steps -----------------------------------------------------------------------------

    def record(self, keys: RunKeys, write: StepWrite) -> tuple[Recorded, Any]:
        """Write a step's record under the fence (HSETNX); what the script found besides.

        The write's riders (``journal._riders``) go in the record's round trip on a single
        server, each alone on a cluster, where their slots are not the run's.

        Returns:
            The status and, for ``ALREADY``, the record already there; for ``FENCED``, the
            holder that owns the run now.

        Raises:
            NotDurable: the server did not confirm what the write's ``wait`` asks for in time.
        """
        run_keys = (keys.lease, keys.steps, keys.meta)
        args = (write.holder, write.step, write.encoded, *_flat(write.earlier))
        along = () if isinstance(self.client, redis.RedisCluster) else write.riders
        if write.wait.waits or along:
            reply = self._record_pipelined(keys, run_keys, args, write.wait, along)
        else:
            reply = self.scripts.record(keys=run_keys, args=args)
        if not along:
            send_alone(write.riders)
        status = code("record", reply, Recorded)
        return status, reply[1] if isinstance(reply, list) and len(reply) > 1 else None

    def _record_pipelined(
        self,
        keys: RunKeys,
        run_keys: Sequence[KeyOrArg],
        args: Sequence[KeyOrArg],
        wait: RecordWait,
        riders: Sequence[Rider],
    ) -> Any:
        """The record script, its riders, then WAIT and/or WAITAOF, in one round trip.

        A rider is sent once: one the server lacked the script of is sent alone afterwards.
        EVALSHA goes on the pipeline by hand: a Script on a pipeline makes redis-py send
        SCRIPT EXISTS first, a second round trip per record. On NOSCRIPT, EVAL with the source.
        WAIT and WAITAOF answer for the connection that wrote, so on a cluster all go down one
        connection to the slot's master (a cluster pipeline would send the keyless waits to
        any node). A MOVED reply or a lost connection (a failover promoted a replica) re-reads
        the slot map and sends it all again, once: the record is fenced and first-write-wins,
        so a second send can only find it already written or the lease gone.
        """
        record = self.scripts.record
        attempts = [("EVALSHA", record.sha), ("EVAL", record.script)]
        moved = False
        missed: list[Rider] = []
        while attempts:
            command, script = attempts[0]
            # Riders alone go in MULTI/EXEC: one round trip to the server's eye as well.
            pipe = self._master_of(keys.steps).pipeline(transaction=bool(riders) and not wait.waits)
            pipe.execute_command(command, script, 3, *run_keys, *args)  # type: ignore[no-untyped-call]
            for rider in riders:
                pipe.execute_command(
                    "EVALSHA", rider.script.sha, len(rider.keys), *rider.keys, *rider.args
                )  # type: ignore[no-untyped-call]
            for waiting in wait.commands():
                pipe.execute_command(*waiting)  # type: ignore[no-untyped-call]
            try:
                reply, *rest = pipe.execute(raise_on_error=False)
                missed += _unsent(keys, riders, rest[: len(riders)])
                confirmed = rest[len(riders) :]
                riders = ()  # sent: never again, whatever the record needs
                rerouted = isinstance(reply, redis.exceptions.MovedError)
            except (redis.ConnectionError, redis.TimeoutError):
                if moved or not isinstance(self.client, redis.RedisCluster):
                    raise
                rerouted = True  # the slot's master is gone: ask the cluster for the new one
            if rerouted and not moved:
                moved = True
                self._reread_slots()
                continue
            attempts.pop(0)
            if isinstance(reply, redis.exceptions.NoScriptError):
                continue
            send_alone(missed)
            if isinstance(reply, Exception):
                raise reply
            shortfall = wait.shortfall(confirmed)
            if shortfall is not None:
                raise NotDurable(keys.run, str(args[1]), shortfall)
            return reply
        raise NotDurable(keys.run, str(args[1]), "the server refused the record script")

    def _master_of(self, key: str) -> redis.Redis:
        """The client of the one server that holds ``key``: on a cluster, its slot's master."""
        if isinstance(self.client, redis.RedisCluster):
            node = self.client.get_node_from_key(key)  # type: ignore[no-untyped-call]
            return self.client.get_redis_connection(node)
        return self.client

    def _masters(self) -> list[redis.Redis]:
        """A client of each master: the one server, or every master of the cluster."""
        if isinstance(self.client, redis.RedisCluster):
            primaries = self.client.get_primaries()  # type: ignore[no-untyped-call]
            return [self.client.get_redis_connection(node) for node in primaries]
        return [self.client]

    def _reread_slots(self) -> None:
        if isinstance(self.client, redis.RedisCluster):
            self.client.nodes_manager.initialize()

    def require_waitaof(self, url: str) -> None:
        """Refuse record fsyncs at start on a server that cannot honour them.

        Raises:
            StoreUnsupported: the server has no WAITAOF or no append-only file.
        """
        try:
            self.client.execute_command("WAITAOF", 1, 0, 100)  # type: ignore[no-untyped-call]
        except redis.ResponseError as exc:
            raise StoreUnsupported(
                url,
                f"fsync_records needs WAITAOF (Redis 7.2+ or Valkey with appendonly yes): {exc}",
            ) from None

    def require_replicas(self, url: str, replicas: int) -> None:
        """Refuse replica waits at start when a master has fewer replicas than each record needs.

        Every record would otherwise wait its full timeout and stop its run (``NotDurable``).

        Raises:
            StoreUnsupported: naming the master short of replicas, or the server's refusal.
        """
        for master in self._masters():
            try:
                info = master.info("replication")
            except redis.ResponseError as exc:
                raise StoreUnsupported(
                    url, f"wait_replicas needs INFO replication to count replicas: {exc}"
                ) from None
            found = int(info.get("connected_slaves", 0))
            if found < replicas:
                where = master.connection_pool.connection_kwargs.get("port", url)
                raise StoreUnsupported(
                    url,
                    f"wait_replicas={replicas} but the master at {where} has {found} connected "
                    "replica(s): every record would wait out its timeout",
                )

    # -- a run's status ------------------------------------------------------------------

    def close(self, keys: RunKeys, holder: str, closing: Closing) -> Closed:
        """Save the run's status fields, index it and give the lease back (see ``Closing``)."""
        sets: list[Any] = []
        deletes = [name for name, value in closing.fields.items() if value == DELETE]
        for name, value in closing.fields.items():
            if value != DELETE:
                sets += [name, value]
        due_ms = closing.due_ms
        reply = self.scripts.close(
            keys=[
                keys.lease,
                keys.meta,
                keys.signals,
                keys.index.runs,
                keys.index.due,
                keys.flight,
                keys.steps,
            ],
            args=[
                holder,
                closing.unless_signal,
                "1" if closing.unless_cancelled else "0",
                keys.run,
                closing.now_ms,
                "" if due_ms is None else due_ms,
                len(sets) // 2,
                len(closing.records),
                *sets,
                *_flat(closing.records),
                *deletes,
            ],
        )
        return code("close", reply, Closed)

    def cancel(self, keys: RunKeys, now_ms: int, reason: str) -> tuple[Cancelling, tuple[str, ...]]:
        """Cancel now if nobody holds the run, else ask its holder.

        Returns the status and what it names: the ended status, or the claimed effect and its
        state. A run cancelled now leaves the due index (a sweep must not wake it) and is
        re-scored in the runs index.
        """
        reply = self.scripts.cancel(
            keys=[keys.lease, keys.meta, keys.effects], args=[now_ms, reason]
        )
        status = code("cancel", reply, Cancelling)
        if status is Cancelling.CANCELLED:
            pipe = self.client.pipeline(transaction=False)
            pipe.zrem(keys.index.due, keys.run)
            pipe.zadd(keys.index.runs, {keys.run: now_ms})
            pipe.execute()
        if status in (Cancelling.ENDED, Cancelling.EFFECT_CLAIMED):
            return status, tuple(_text(part) for part in reply[1:])
        return status, ()

    def un_park(self, keys: RunKeys) -> bool:
        """Clear a parked run's mark and stall count, if it is parked (WATCH, then MULTI)."""

        def un_park(pipe: redis.client.Pipeline) -> bool:
            if not pipe.hexists(keys.meta, "parked"):
                return False
            pipe.multi()
            pipe.hdel(keys.meta, "parked", "last_error")
            pipe.hset(keys.meta, "starts_without_progress", 0)
            return True

        parked = self.client.transaction(un_park, keys.meta, value_from_callable=True)  # type: ignore[arg-type]
        return bool(parked)

    def delete(self, keys: RunKeys) -> int:
        """Remove every key of one run and its index entries; how many keys there were."""
        pipe = self.client.pipeline(transaction=False)
        pipe.delete(*keys.all())
        pipe.zrem(keys.index.runs, keys.run)
        pipe.zrem(keys.index.due, keys.run)
        return int(pipe.execute()[0])

    # -- effects ---------------------------------------------------------------------------

    def effect_claim(
        self, keys: RunKeys, effect: str, claimant: Claimant, terms: EffectTerms
    ) -> EffectClaim:
        """Claim ``effect`` for this fence, unless an earlier claimant may still be acting."""
        reply = self.scripts.effect_claim(
            keys=[keys.lease, keys.effects],
            args=[
                claimant.holder,
                effect,
                claimant.fence,
                terms.claim_ms,
                claimant.process,
                claimant.earlier,
                "1" if terms.repeatable else "",
                terms.unknown,
                "1" if terms.revocable else "",
            ],
        )
        status = code("effect_claim", reply, EffectClaimed)
        if status is EffectClaimed.CLAIMED:
            return EffectClaim(status, resumed=bool(reply[1]))
        if status is EffectClaimed.DONE_EARLIER:
            return EffectClaim(status, receipt=reply[1] or b"")
        if status is EffectClaimed.CLAIMED_BY_EARLIER:
            return EffectClaim(
                status, remaining_ms=int(reply[1]), process=reply[2], deadline=_text(reply[3])
            )
        if status is EffectClaimed.AMBIGUOUS:
            return EffectClaim(status, fence=int(reply[1]), detail=_text(reply[2]))
        return EffectClaim(status)

    def effect_settle(
        self, keys: RunKeys, holder: str, effect: str, fence: int, state: str, receipt: bytes
    ) -> Settled:
        """Settle this fence's claim: ``done``, ``released`` or ``ambiguous``."""
        reply = self.scripts.effect_settle(
            keys=[keys.lease, keys.effects], args=[holder, effect, fence, state, receipt]
        )
        return code("effect_settle", reply, Settled)

    def batch_owners(self, batch_ids: Sequence[str]) -> dict[str, str]:
        """The run each of these provider batches belongs to, where one is known (HMGET)."""
        if not batch_ids:
            return {}
        owners = self.client.hmget(self.keyspace.batches, list(batch_ids))
        return {
            batch_id: _text(owner)
            for batch_id, owner in zip(batch_ids, owners, strict=True)
            if owner is not None
        }

    def own_batch(self, batch_id: str, run: str, *, first: bool) -> str:
        """Note ``batch_id`` as ``run``'s; its owner after (another run's, if ``first`` lost).

        ``first``: only if no run owns it yet (``HSETNX``), as a run adopting a batch it may
        have created does; a run that has just created it sets it outright.
        """
        pipe = self.client.pipeline(transaction=True)
        if first:
            pipe.hsetnx(self.keyspace.batches, batch_id, run)
        else:
            pipe.hset(self.keyspace.batches, batch_id, run)
        pipe.hget(self.keyspace.batches, batch_id)
        return _text(pipe.execute()[-1])

    def effect_decide(
        self, keys: RunKeys, effect: str, decision: str, receipt: bytes
    ) -> tuple[Decided, str]:
        """An operator's decision on an ambiguous effect; the state found when refused."""
        reply = self.scripts.effect_decide(
            keys=[keys.lease, keys.effects], args=[effect, decision, receipt]
        )
        status = code("effect_decide", reply, Decided)
        return status, _text(reply[1]) if status is Decided.NOT_AMBIGUOUS else ""

    # -- signals and the due index ----------------------------------------------------------

    def signal(self, keys: RunKeys, name: str) -> bytes | None:
        """The payload of signal ``name``, if it has arrived."""
        return cast(bytes | None, self.client.hget(keys.signals, name))

    def store_signal(self, keys: RunKeys, name: str, payload: bytes) -> bool:
        """Store a signal, first wins; whether this payload was the one stored."""
        return bool(self.client.hsetnx(keys.signals, name, payload))

    def make_due(self, keys: RunKeys, at_ms: int) -> None:
        """Put the run in the due index at ``at_ms`` (now, for a wake-up)."""
        self.client.zadd(keys.index.due, {keys.run: at_ms})

    def expect(self, keys: RunKeys, at_ms: int, args: bytes) -> bool:
        """Arm a run that has never opened at ``at_ms``, with its arguments (``expect.lua``).

        Returns:
            True when the run has never opened (armed now or by an earlier send).
        """
        return bool(
            self.scripts.expect(keys=[keys.meta, keys.index.due], args=[keys.run, at_ms, args])
        )

    def claim_due(self, now_ms: int, limit: int, rearm_at_ms: int) -> list[bytes]:
        """Claim up to ``limit`` due runs, re-armed at ``rearm_at_ms`` (atomic across sweepers).

        Shard by shard, one script each, so two sweepers never claim one run twice; starting
        at a random shard, so a backlog in one shard does not starve the others' wake-ups.
        """
        indexes = self.keyspace.indexes()
        first = random.randrange(len(indexes))
        claimed: list[bytes] = []
        for index in indexes[first:] + indexes[:first]:
            if len(claimed) >= limit:
                break
            claimed += self.scripts.claim_due(
                keys=[index.due], args=[now_ms, limit - len(claimed), rearm_at_ms]
            )
        return claimed

    def forget_due(self, member: bytes) -> None:
        """Drop an unreadable member from the due index (every shard: it names no run)."""
        pipe = self.client.pipeline(transaction=False)
        for index in self.keyspace.indexes():
            pipe.zrem(index.due, member)
        pipe.execute()

    def oldest_due(self) -> float | None:
        """The earliest due time (ms) over every shard, in one pipelined trip; None for none."""
        pipe = self.client.pipeline(transaction=False)
        for index in self.keyspace.indexes():
            pipe.zrange(index.due, 0, 0, withscores=True)
        firsts: list[list[tuple[bytes, float]]] = pipe.execute()
        scores = [float(first[0][1]) for first in firsts if first]
        return min(scores) if scores else None

    # -- reads -----------------------------------------------------------------------------

    def meta(self, keys: RunKeys) -> dict[bytes, bytes]:
        """The run's meta hash, raw."""
        return cast(dict[bytes, bytes], self.client.hgetall(keys.meta))

    def snapshot(self, keys: RunKeys) -> Snapshot:
        """One consistent read of a run: meta, steps, lease, signals, effects, steps in flight."""
        pipe = self.client.pipeline(transaction=True)
        Snapshot.ask(pipe, keys)
        return Snapshot.of(pipe.execute())

    def effects(self, keys: RunKeys) -> dict[bytes, bytes]:
        """The run's effects hash (see ``effect_claim.lua``)."""
        return cast(dict[bytes, bytes], self.client.hgetall(keys.effects))

    def journal(self, keys: RunKeys) -> tuple[dict[bytes, bytes], dict[bytes, bytes]]:
        """The run's meta and steps hashes, read together in one MULTI."""
        pipe = self.client.pipeline(transaction=True)
        pipe.hgetall(keys.meta)
        pipe.hgetall(keys.steps)
        meta, steps = pipe.execute()
        return meta, steps

    def runs_newest(self, page: int, at_most: int | None = None) -> Iterator[tuple[bytes, float]]:
        """Members of the runs index with their scores, newest first, over every shard.

        Each shard is read a page at a time as the merge needs it, so a listing of the newest
        few reads a page per shard, not the whole index. ``at_most`` starts at that score
        (a cursor's), so a deep page costs what the first does.
        """
        shards = [self._runs_of(index.runs, page, at_most) for index in self.keyspace.indexes()]
        if len(shards) == 1:
            return shards[0]
        return heapq.merge(*shards, key=lambda member: -member[1])

    def _runs_of(
        self, key: str, page: int, at_most: int | None = None
    ) -> Iterator[tuple[bytes, float]]:
        start = 0
        top: float | str = "+inf" if at_most is None else at_most
        while True:
            members = cast(
                list[tuple[bytes, float]],
                self.client.zrevrangebyscore(
                    key, top, "-inf", start=start, num=page, withscores=True
                ),
            )
            yield from members
            if len(members) < page:
                return
            start += page

    def runs_updated_before(self, cutoff_ms: int) -> list[tuple[bytes, float]]:
        """Members of the runs index last updated before ``cutoff_ms``, oldest first."""
        found: list[tuple[bytes, float]] = []
        for index in self.keyspace.indexes():
            found += cast(
                list[tuple[bytes, float]],
                self.client.zrangebyscore(index.runs, "-inf", f"({cutoff_ms}", withscores=True),
            )
        return sorted(found, key=lambda member: member[1])

    def purge(
        self, keys: RunKeys, updated_at: str, listed_at: float, statuses: Iterable[str]
    ) -> Purging:
        """Delete an ended run's keys if it is unheld, unchanged and settled, then unlist it.

        Two scripts, because the indexes may sit in another cluster slot than the run: the
        first deletes the run only if nothing touched it since its ``updated_at`` was read; the
        second unlists it only if it is still listed at ``listed_at`` (not started again).
        """
        others = [key for key in keys.all() if key not in (keys.meta, keys.lease, keys.effects)]
        deleted = code(
            "purge",
            self.scripts.purge(
                keys=[keys.meta, keys.lease, keys.effects, *others], args=[updated_at, *statuses]
            ),
            Purging,
        )
        if deleted is not Purging.DELETED:
            return deleted
        self.scripts.purge_index(
            keys=[keys.index.runs, keys.index.due], args=[keys.run, repr(listed_at)]
        )
        return deleted

    def leases_held(self, runs: Iterable[RunKeys]) -> list[bool]:
        """Whether each run's lease is held now, in one pipelined trip."""
        pipe = self.client.pipeline(transaction=False)
        for keys in runs:
            pipe.exists(keys.lease)
        return [bool(found) for found in pipe.execute()]

    def metas(self, runs: Iterable[RunKeys], with_steps: bool) -> list[dict[bytes, bytes]]:
        """Each run's meta (and, when asked, steps right after it), in one pipelined trip."""
        pipe = self.client.pipeline(transaction=False)
        for keys in runs:
            pipe.hgetall(keys.meta)
            if with_steps:
                pipe.hgetall(keys.steps)
        replies: list[dict[bytes, bytes]] = pipe.execute()
        return replies

    # -- new runs from old ones -------------------------------------------------------------

    def reserve(self, keys: RunKeys, origin: str) -> bool:
        """Take a new run id for a copy of ``origin``: free if it has no steps and no meta."""
        if self.client.exists(keys.steps):
            return False
        return bool(self.client.hsetnx(keys.meta, "forked_from", origin))

    def write_copy(
        self, keys: RunKeys, steps: dict[str, bytes], meta: dict[Any, Any], now_ms: int
    ) -> None:
        """Write a copied run's kept steps and its meta, and index it, in one MULTI."""
        pipe = self.client.pipeline(transaction=True)
        if steps:
            pipe.hset(keys.steps, mapping=steps)  # type: ignore[arg-type]
        pipe.hset(keys.meta, mapping=meta)
        pipe.zadd(keys.index.runs, {keys.run: now_ms})
        pipe.execute()


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
