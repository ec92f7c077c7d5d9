"""Which run holds which items: the digest's per-item claims, read and let go.

Each item is claimed by the run that selects it (``tasks/lua/claim_items.lua``)
until that run marks it seen or ends without sending. A failed run may still be retried, so it
keeps its claims; that is never silent: a later run's report, ``digest runs`` and ``digest
show`` name the holder, and ``digest release`` lets its items go to the next run.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import redis

from tasks.keys import text
from tasks.scripts import script

if TYPE_CHECKING:  # the items' parsers and the runtime: counting holdings needs neither
    from tasks.job.items import Item
    from tasks.runtime import Runtime, Store

# A run in one of these may still send what it holds, but only if someone acts.
STUCK = ("failed", "retrying")
# A send in one of these may be in the recipient's mailbox, while no worker finishes it.
MAYBE_SENT = ("ambiguous", "confirmed")


@dataclass(frozen=True)
class Held:
    """Items another run holds: how many, and that run's state and last error."""

    run: str
    items: int
    status: str
    error: str = ""
    send: str = ""

    def to_json(self) -> dict[str, Any]:
        """As the run's report holds it."""
        return asdict(self)

    def line(self) -> str:
        """``8 are held by digest:2026-w46 (failed: ...); digest retry 2026-w46 sends ...``.

        A holder whose email may be out is never offered to ``release``: its items may be in
        that email.
        """
        run_id = self.run.partition(":")[2]
        held = f"{self.items} {'is' if self.items == 1 else 'are'} held by {self.run}"
        if self.send in MAYBE_SENT:
            return (
                f"{held} (its email may have been sent); check "
                f"the recipient's mailbox, then digest mark-sent {run_id} or digest resend "
                f"{run_id}"
            )
        stuck = self.status in STUCK
        why = f"{self.status}: {self.error}" if stuck and self.error else self.status
        said = f"{held} ({why})"
        if stuck:
            said += (
                f"; digest retry {run_id} sends them, digest release {run_id} hands them "
                "to the next week"
            )
        return said


def holdings(store: Store) -> dict[str, int]:
    """How many items each run (``digest:<run_id>``) holds now."""
    return dict(Counter(text(holder) for holder in store.client.hvals(store.keys.claims)))


def held_elsewhere(runtime: Runtime, owner: str, seen: Seen | None = None) -> list[Held]:
    """The items runs other than ``owner`` hold, by run, each with its state.

    Read live for the run's report, never journaled: a replay, which has no store, reports none.
    ``seen``, from ``mark_seen`` in this attempt, holds the claims as they were read then,
    in the same round trip: they are not asked again.
    """
    if runtime.replaying:
        return []
    held = []
    now = holdings(runtime) if seen is None else seen.holdings
    for run, count in sorted(now.items()):
        if run == owner:
            continue
        workflow, _, run_id = run.partition(":")
        keys = runtime.journal.keys(workflow, run_id)
        meta = runtime.journal.meta(keys)
        send = runtime.journal.effect_states(keys).get("send", "")
        held.append(Held(run, count, meta.get("status", "new"), meta.get("last_error", ""), send))
    return held


def let_go(runtime: Runtime, owner: str, ids: list[str] | None = None) -> int:
    """Delete ``owner``'s claims (on ``ids``, or all of them); how many went.

    Under ``WATCH``: a claim another run took over meanwhile is never deleted.
    """
    claims = runtime.keys.claims
    with runtime.client.pipeline() as pipe:
        while True:
            try:
                pipe.watch(claims)
                fields = ids if ids is not None else [text(f) for f in pipe.hkeys(claims)]
                holders = pipe.hmget(claims, fields) if fields else []
                mine = [
                    item_id
                    for item_id, holder in zip(fields, holders, strict=True)
                    if holder is not None and text(holder) == owner
                ]
                if not mine:
                    return 0
                pipe.multi()
                pipe.hdel(claims, *mine)
                pipe.execute()
                return len(mine)
            except redis.WatchError:
                continue


def select_unseen(runtime: Runtime, source: str, owner: str, *, claim: bool = True) -> list[Item]:
    """This week's items no earlier digest covered and no other run holds, claimed for ``owner``.

    One script reads the seen set and claims (``tasks/lua/claim_items.lua``): of two runs
    selecting at once each item goes to one, and a run marking items seen meanwhile lands
    wholly before or after it. A preview (``claim=False``) takes the items nobody else holds
    without claiming them.
    """
    from tasks.job.items import load_items  # the feeds' parsers: not for counting holdings

    items = load_items(source, runtime.config.items_timeout)
    if not items:
        return []
    keys, ids = [runtime.keys.seen, runtime.keys.claims], [item.id for item in items]
    replies = script(runtime.client, "claim_items")(keys, [owner, int(claim), *ids])
    unseen = [(item, holder) for item, holder in zip(items, replies, strict=True) if holder != 0]
    holders = [holder for _, holder in unseen]
    if claim and unseen:
        holders = take_over_from_cancelled(runtime, owner, [item.id for item, _ in unseen], holders)
    return [
        item
        for (item, _), holder in zip(unseen, holders, strict=True)
        if holder is None or text(holder) == owner
    ]


def take_over_from_cancelled(
    runtime: Runtime, owner: str, ids: list[str], holders: list[bytes | str | None]
) -> list[bytes | str | None]:
    """Claim for ``owner`` the items held by cancelled or purged runs; the holders after it.

    A cancelled run ends without sending and never runs again, but it is stopped from outside,
    between two of its steps, so it cannot let go of its claims itself; nor can a run whose
    keys ``digest purge`` removed (no status: a run holding claims has opened, so it had one).
    The claims are moved under ``WATCH``: of two runs taking one item over at once, one wins.
    A run whose send was claimed is never taken from, cancelled or not: its email may be out
    (a cancel is refused then; this is the second lock on the same door).
    """
    others = {text(holder) for holder in holders if holder is not None and text(holder) != owner}
    cancelled = {
        other
        for other in others
        if run_status(runtime, other) in ("cancelled", None) and not send_claimed(runtime, other)
    }
    if not cancelled:
        return holders
    claims = runtime.keys.claims
    with runtime.client.pipeline() as pipe:
        while True:
            try:
                pipe.watch(claims)
                holders = pipe.hmget(claims, ids)
                taken = [
                    item_id
                    for item_id, holder in zip(ids, holders, strict=True)
                    if holder is not None and text(holder) in cancelled
                ]
                if not taken:
                    return holders
                pipe.multi()
                pipe.hset(claims, mapping=dict.fromkeys(taken, owner))
                pipe.hmget(claims, ids)
                return list(pipe.execute()[-1])
            except redis.WatchError:
                continue


def send_claimed(runtime: Runtime, owner: str) -> bool:
    """Whether the run named ``workflow:run`` claimed its send (it may have emailed)."""
    workflow, _, run_id = owner.partition(":")
    claim = runtime.client.hget(runtime.journal.keys(workflow, run_id).effects, "send")
    return claim is not None and not text(claim).endswith(":released")


def run_status(runtime: Runtime, owner: str) -> str | None:
    """The status of the run named ``workflow:run`` (a claim's holder)."""
    workflow, _, run_id = owner.partition(":")
    return runtime.journal.meta(runtime.journal.keys(workflow, run_id)).get("status")


def release(runtime: Runtime, owner: str, ids: list[str]) -> bool:
    """Let go of ``owner``'s claims on ``ids`` (items it ends without sending): next week's."""
    if ids:
        let_go(runtime, owner, ids)
    return True


@dataclass(frozen=True)
class Seen:
    """What ``mark_seen`` found: how many items the seen set holds, and each run's claims."""

    count: int
    holdings: dict[str, int]


def mark_seen(runtime: Runtime, ids: list[str]) -> Seen:
    """Add this digest's items to the seen set, and read the claims left for the report.

    The claims ride in the same transaction: the run's report names the items other runs hold,
    and asking after the run's last step would cost it one more round trip.
    """
    pipe = runtime.client.pipeline(transaction=True)
    pipe.sadd(runtime.keys.seen, *ids)
    pipe.hdel(runtime.keys.claims, *ids)  # seen now: the claim has done its work
    pipe.scard(runtime.keys.seen)
    pipe.hvals(runtime.keys.claims)
    *_, count, holders = pipe.execute()
    return Seen(int(count), dict(Counter(text(holder) for holder in holders)))
