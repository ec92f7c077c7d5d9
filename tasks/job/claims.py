"""Which run holds which items: the digest's per-item claims, read and let go.

Each item is claimed by the run that selects it (``tasks/lua/claim_items.lua``)
until that run marks it seen or ends without sending. A failed run may still be retried, so it
keeps its claims; that is never silent: a later run's report, ``digest runs`` and ``digest
show`` name the holder, and ``digest release`` lets its items go to the next run.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import redis

from tasks.keys import text
from tasks.runtime import Runtime

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
        if self.send in MAYBE_SENT:
            return (
                f"{self.items} are held by {self.run} (its email may have been sent); check "
                f"the recipient's mailbox, then digest mark-sent {run_id} or digest resend "
                f"{run_id}"
            )
        stuck = self.status in STUCK
        why = f"{self.status}: {self.error}" if stuck and self.error else self.status
        said = f"{self.items} are held by {self.run} ({why})"
        if stuck:
            said += (
                f"; digest retry {run_id} sends them, digest release {run_id} hands them "
                "to the next week"
            )
        return said


def holdings(runtime: Runtime) -> dict[str, int]:
    """How many items each run (``digest:<run_id>``) holds now."""
    return dict(Counter(text(holder) for holder in runtime.client.hvals(runtime.keys.claims)))


def held_elsewhere(runtime: Runtime, owner: str) -> list[Held]:
    """The items runs other than ``owner`` hold, by run, each with its state.

    Read live for the run's report, never journaled: a replay, which has no store, reports none.
    """
    if runtime.replaying:
        return []
    held = []
    for run, count in sorted(holdings(runtime).items()):
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
