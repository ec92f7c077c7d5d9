"""Mutation testing of the protocol: break one guard at a time, and the fast tests must notice.

Two sets of mutants. The hand-written ones (``MUTANTS``) are one text substitution each in
the Lua scripts or in the lease, heartbeat, record and store path: a comparison flipped, a
holder check removed, a fence not incremented, a confirmation stamped late, a renewal
skipped. A pattern that no longer matches the source fails the whole run before any mutant is
tried, so the set cannot go stale silently when the code changes: update the pattern with the
code. The generated ones (``generated``) are derived from every Lua script the repository has
(``*/lua/*.lua``) each time the run starts: every comparison of every line of code flipped,
one occurrence at a time, and every ``if``/``elseif`` condition forced true and forced false;
a guard nobody thought to break is broken anyway, and a new script is covered by its first run.

Each mutant is applied to a scratch copy of the project, and the fast tests that cover what
it breaks run against that copy; every mutant must make them fail. A generated mutant is judged
by the tests of its script (``LUA_TESTS``, checked: a script without an entry fails the run).
Generated mutants that no test can tell from the original are listed, each with why, in
``EQUIVALENT``; they are not run.

Run it with ``make mutants`` (``python -m tests.mutants [-j JOBS] [--list] [NAME ...]``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
COPIED = ("journal", "tasks", "tests", "data", "pyproject.toml")

# The fast tests that cover the protocol, the quickest to fail first: a mutant stops at the
# first failing test, and one that survives runs them all. test_control and test_holder take
# a fifth of a second and kill a dozen mutants that otherwise waited 17 s for them.
PROTOCOL_TESTS = (
    "tests/journal/test_control.py",
    "tests/journal/test_deferred_records.py",
    "tests/journal/test_holder.py",
    "tests/journal/test_protocol.py",
    "tests/journal/test_sweep.py",
    "tests/journal/test_steps.py",
    "tests/journal/test_effects.py",
    "tests/journal/test_waits.py",
    "tests/journal/test_racers.py",
)
CELERY_TESTS = ("tests/journal/test_durable.py",)
# Waits and signals, interrupted before every command: the exhaustive sweep, on fakeredis.
WAIT_TESTS = (
    "tests/journal/test_wait_schedules.py"
    "::test_one_interruption_before_any_command_keeps_the_invariants_on_fakeredis",
)
# Stop at the first failure and name it; a mutant that hangs a test fails it in 30 s.
PYTEST: tuple[str, ...] = ("-x", "-q", "-rf", "-m", "not slow")
PYTEST += ("-p", "no:cacheprovider")
PYTEST += ("-o", "timeout=30")
# A judge that outlives this (a hang pytest-timeout could not interrupt) is killed, and the
# mutant counts as killed: it broke the tests, if not by failing one.
HARD_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Mutant:
    """One broken guard: ``find`` replaced by ``replace`` in ``path``.

    A hand-written mutant's ``find`` must occur exactly once in the file; a generated one
    names the offset ``at`` of the one occurrence it replaces, since a flipped ``==`` occurs
    many times in a script.
    """

    name: str
    path: str
    find: str
    replace: str
    tests: tuple[str, ...] = PROTOCOL_TESTS
    at: int | None = None

    def apply(self, source: str) -> str:
        """``source`` with this mutant's change, or SystemExit if the change no longer fits."""
        if self.at is None:
            if source.count(self.find) != 1:
                raise SystemExit(f"mutant {self.name!r}: its pattern is gone from {self.path}")
            return source.replace(self.find, self.replace)
        if source[self.at : self.at + len(self.find)] != self.find:
            raise SystemExit(f"mutant {self.name!r}: {self.path} changed under it")
        return source[: self.at] + self.replace + source[self.at + len(self.find) :]


def lua(script: str, name: str, find: str, replace: str) -> Mutant:
    return Mutant(f"{script}: {name}", f"journal/lua/{script}.lua", find, replace)


def python(
    module: str, name: str, find: str, replace: str, *, tests: tuple[str, ...] = PROTOCOL_TESTS
) -> Mutant:
    return Mutant(f"{module}: {name}", f"journal/{module}.py", find, replace, tests)


TABLE_FENCE = "if holder ~= ARGV[1] then\n  return {holder and -2 or -1, holder}\nend\n"
NUMBER_FENCE = "if holder ~= ARGV[1] then\n  return holder and -2 or -1\nend\n"

MUTANTS = (
    # -- open: one holder at a time, each with a new fence, stalled starts counted
    lua(
        "open",
        "a live lease is taken anyway",
        "if holder and holder ~= ARGV[5] then",
        "if false then",
    ),
    lua(
        "open",
        "the proved-dead holder comparison flipped",
        "holder ~= ARGV[5]",
        "holder == ARGV[5]",
    ),
    lua(
        "open",
        "the fence is not incremented",
        "redis.call('INCR', KEYS[2])",
        "tonumber(redis.call('GET', KEYS[2]) or '1')",
    ),
    lua("open", "the lease never expires", "lease, 'PX', ARGV[2])", "lease)"),
    lua(
        "open",
        "stalled starts are never counted",
        "stalled = tonumber(redis.call('HGET', KEYS[3], 'starts_without_progress') or '0') + 1",
        "stalled = 1",
    ),
    lua(
        "open",
        "the progress comparison flipped",
        "if recorded == seen then",
        "if recorded ~= seen then",
    ),
    lua("open", "the progress mark is not moved", "'recorded_at_start', recorded, ", ""),
    lua(
        "open",
        "the creation time is overwritten",
        "redis.call('HSETNX', KEYS[3], 'created_at'",
        "redis.call('HSET', KEYS[3], 'created_at'",
    ),
    lua(
        "open",
        "parks one start late",
        "if stalled > tonumber(ARGV[6]) then",
        "if stalled > tonumber(ARGV[6]) + 1 then",
    ),
    lua(
        "open",
        "a parked run is started anyway",
        "if redis.call('HEXISTS', KEYS[3], 'parked') == 1 then",
        "if false then",
    ),
    lua(
        "open",
        "an ended run is started again",
        "if status == 'done' or status == 'cancelled' then",
        "if false then",
    ),
    lua(
        "open",
        "an ended run stays due",
        "redis.call('ZREM', KEYS[6], ARGV[8])",
        "redis.call('ZSCORE', KEYS[6], ARGV[8])",
    ),
    lua("open", "an unreadable wait is cleared", "if not readable then", "if false then"),
    lua(
        "open",
        "a pending cancel is not acted on",
        "if redis.call('HEXISTS', KEYS[3], 'cancel') == 1 then",
        "if false then",
    ),
    lua(
        "open",
        "a started run is not due for recovery",
        "redis.call('ZADD', KEYS[6], ARGV[7], ARGV[8])",
        "redis.call('ZSCORE', KEYS[6], ARGV[8])",
    ),
    # -- record: only the holder writes, first write wins
    lua(
        "record",
        "writes when nobody holds the lease",
        TABLE_FENCE,
        TABLE_FENCE.replace("if holder ~=", "if holder and holder ~="),
    ),
    lua(
        "record",
        "the holder check removed",
        TABLE_FENCE,
        "",
    ),
    lua(
        "record",
        "only the fence compared, not the token",
        "if holder ~= ARGV[1] then",
        "if holder:match('^%d+') ~= ARGV[1]:match('^%d+') then",
    ),
    lua(
        "record",
        "a repeatable step's waiting record is dropped",
        "  redis.call('HSETNX', KEYS[2], ARGV[i], ARGV[i + 1])\n",
        "",
    ),
    lua(
        "record",
        "the last write wins",
        "redis.call('HSETNX', KEYS[2], ARGV[2], ARGV[3])",
        "redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])",
    ),
    # -- release and renew: compare, then act
    lua(
        "release",
        "deletes whoever holds the lease",
        "if redis.call('GET', KEYS[1]) == ARGV[1] then",
        "if true then",
    ),
    lua("release", "the comparison flipped", "== ARGV[1] then", "~= ARGV[1] then"),
    lua(
        "renew",
        "extends whoever holds the lease",
        "if redis.call('GET', KEYS[1]) == ARGV[1] then",
        "if redis.call('EXISTS', KEYS[1]) == 1 then",
    ),
    lua(
        "renew",
        "the renewal is skipped but reported done",
        "  redis.call('PEXPIRE', KEYS[1], ARGV[2])\n",
        "",
    ),
    # -- close: only the holder writes the run's status and indexes; an arrived signal wins
    lua(
        "close",
        "writes when nobody holds the lease",
        NUMBER_FENCE,
        NUMBER_FENCE.replace("if holder ~=", "if holder and holder ~="),
    ),
    lua(
        "close",
        "the holder check removed",
        NUMBER_FENCE,
        "",
    ),
    lua(
        "close",
        "an arrived signal is ignored",
        "redis.call('HEXISTS', KEYS[3], ARGV[2]) == 1",
        "redis.call('HEXISTS', KEYS[3], ARGV[2]) == 2",
    ),
    lua("close", "a field is never deleted", "if #ARGV >= first_delete then", "if false then"),
    lua(
        "close",
        "a repeatable step's waiting record is dropped",
        "redis.call('HSETNX', KEYS[7], ARGV[i], ARGV[i + 1])",
        "",
    ),
    lua(
        "close",
        "the lease is kept",
        "redis.call('DEL', KEYS[1], KEYS[6])",
        "redis.call('DEL', KEYS[6])",
    ),
    lua(
        "close",
        "an ended run stays due",
        "redis.call('ZREM', KEYS[5], ARGV[4])",
        "redis.call('ZSCORE', KEYS[5], ARGV[4])",
    ),
    lua(
        "renew",
        "the steps in flight are never cleared",
        "redis.call('DEL', KEYS[3])",
        "redis.call('EXISTS', KEYS[3])",
    ),
    lua(
        "renew",
        "the steps in flight outlive a dead holder",
        "redis.call('PEXPIRE', KEYS[3], ARGV[2])",
        "redis.call('PTTL', KEYS[3])",
    ),
    lua(
        "renew",
        "a renewal leaves the run due at the old expiry",
        "redis.call('ZADD', KEYS[5], ARGV[3], ARGV[4])",
        "redis.call('ZSCORE', KEYS[5], ARGV[4])",
    ),
    # -- cancel: asked of a run, learnt by its holder inside the fenced scripts
    lua(
        "cancel",
        "a run that does not exist is created",
        "if redis.call('EXISTS', KEYS[2]) == 0 then",
        "if false then",
    ),
    lua(
        "cancel",
        "a finished run is cancelled",
        "if status == 'done' or status == 'cancelled' then",
        "if status == 'cancelled' then",
    ),
    lua(
        "cancel",
        "a run whose effect is claimed is cancelled anyway",
        "if state and state ~= 'released' then",
        "if false then",
    ),
    lua(
        "cancel",
        "a revocable effect refuses a cancel like any other",
        "if redis.call('HEXISTS', KEYS[3], effects[i] .. ':revocable') == 0 then",
        "if true then",
    ),
    lua(
        "cancel",
        "a held run is cancelled under its holder",
        "if redis.call('EXISTS', KEYS[1]) == 1 then",
        "if false then",
    ),
    lua(
        "record",
        "a pending cancel is not reported",
        "if redis.call('HEXISTS', KEYS[3], 'cancel') == 1 then",
        "if false then",
    ),
    lua(
        "renew",
        "a pending cancel is not reported",
        "if redis.call('HEXISTS', KEYS[2], 'cancel') == 1 then",
        "if false then",
    ),
    lua(
        "close",
        "a pending cancel is ignored",
        "if ARGV[3] == '1' and redis.call('HEXISTS', KEYS[2], 'cancel') == 1 then",
        "if false then",
    ),
    # -- claim_due: due runs only, re-armed rather than dropped
    lua("claim_due", "claims runs that are not due", "'-inf', ARGV[1]", "'-inf', '+inf'"),
    lua(
        "claim_due",
        "a claimed run is dropped, not re-armed",
        "redis.call('ZADD', KEYS[1], 'XX', ARGV[3], run)",
        "redis.call('ZREM', KEYS[1], run)",
    ),
    # -- the effect scripts: one holder acts, a live earlier claim is waited for, and what may
    #    have happened is never taken for what did not
    lua(
        "effect_claim",
        "the holder check removed",
        TABLE_FENCE,
        "",
    ),
    lua(
        "effect_claim",
        "claims when nobody holds the lease",
        TABLE_FENCE,
        TABLE_FENCE.replace("if holder ~=", "if holder and holder ~="),
    ),
    lua(
        "effect_claim",
        "a live earlier claim is not waited for",
        "tonumber(deadline) > now",
        "tonumber(deadline) < now",
    ),
    lua(
        "effect_claim",
        "an earlier receipt is not handed over",
        "if state == 'done' then",
        "if false then",
    ),
    lua(
        "effect_claim",
        "a confirmed claim is taken for one that never acted",
        "if state == 'confirmed' or state == 'ambiguous' then",
        "if state == 'ambiguous' then",
    ),
    lua(
        "effect_claim",
        "an ambiguous effect is repeated unasked",
        "if ARGV[7] ~= '1' then",
        "if false then",
    ),
    lua(
        "renew",
        "another fence's claim is confirmed",
        "if fence ~= ARGV[6] or state ~= 'claimed' then",
        "if state ~= 'claimed' then",
    ),
    lua(
        "effect_settle",
        "another fence's claim is settled",
        "if fence ~= ARGV[3] then\n  return -3\nend",
        "",
    ),
    lua(
        "effect_settle",
        "the receipt is not saved",
        "redis.call('HSET', KEYS[2], ARGV[2] .. ':receipt', ARGV[5])",
        "redis.call('TIME')",
    ),
    lua(
        "effect_settle",
        "unknown overwrites what is known",
        "if not open and not (ARGV[4] ~= 'ambiguous'",
        "if false and not (ARGV[4] ~= 'ambiguous'",
    ),
    lua(
        "effect_decide",
        "a send still under way is decided",
        "if state ~= 'ambiguous' and not abandoned then",
        "if false then",
    ),
    lua(
        "purge",
        "a run that may have acted is purged",
        "if state and state ~= 'released' then\n          if redis.call",
        "if false then\n          if redis.call",
    ),
    # -- the lease and its heartbeat
    python(
        "_lease",
        "a live holder is taken over",
        "process is not None and process.provably_gone(me)",
        "process is not None",
    ),
    python(
        "_holder",
        "a holder in another time namespace is compared",
        "where = (self.host, self.boot, self.pidns, self.timens)",
        "where = (self.host, self.boot, self.pidns, me.timens)",
    ),
    python(
        "_holder",
        "an observer whose /proc is not its own proves",
        "        if me.start <= 0:\n            return False",
        "        if me.start < 0:\n            return False",
    ),
    python(
        "_lease",
        "the grant is stamped after its reply",
        'asked = time.monotonic()\n        reply = self._acquire(now_ms, me, "", opening)',
        'reply = self._acquire(now_ms, me, "", opening)\n        asked = time.monotonic()',
    ),
    python(
        "_lease",
        "ensure never renews synchronously",
        "            if stale:\n                self._renew()",
        "            if stale:\n                pass",
    ),
    python(
        "_lease",
        "the staleness comparison flipped",
        "time.monotonic() - self._confirmed_at > self._lease.ttl_ms / 2000",
        "time.monotonic() - self._confirmed_at < self._lease.ttl_ms / 2000",
    ),
    python(
        "_lease",
        "ensure ignores a loss the beat found",
        "        if self.lost.is_set():\n            raise LeaseLost",
        "        if False:\n            raise LeaseLost",
    ),
    python(
        "_lease",
        "a renewal's confirmation is stamped late",
        "self._confirmed_at = max(self._confirmed_at, asked)",
        "self._confirmed_at = time.monotonic()",
    ),
    python(
        "_lease",
        "a failed renewal is not marked lost",
        "                first = not self.lost.is_set()\n                self.lost.set()\n",
        "                first = not self.lost.is_set()\n",
    ),
    python("_lease", "the beat skips its renewal", "renewed = self._renew()", "renewed = True"),
    python(
        "_lease",
        "a Redis error kills the beat",
        "except Exception:  # a blip must not kill the thread",
        "except ArithmeticError:  #",
    ),
    python(
        "_lease",
        "a cancel learnt at a renewal is dropped",
        "        if status is Renewed.CANCEL_PENDING:\n            self.cancelled.set()",
        "        if status is Renewed.CANCEL_PENDING:\n            pass",
    ),
    # -- the record path
    python(
        "_run",
        "a step runs without saying it is in flight",
        "with self._guard.flight.running(key, started):",
        "if True:",
    ),
    python(
        "_run",
        "a step starts without the boundary check",
        "        self.check_lease()\n        started = millis(self.clock.now())\n        riders",
        "        started = millis(self.clock.now())\n        riders",
    ),
    python(
        "_retry",
        "a retry after a back-off skips the boundary check",
        "clock.sleep(delay)\n            check_lease()",
        "clock.sleep(delay)",
    ),
    python(
        "_run",
        "an expired lease is taken for a record",
        "if status is Recorded.LEASE_EXPIRED:",
        "if False:",
    ),
    python(
        "_run",
        "a fenced record is taken for a record",
        "if status is Recorded.FENCED:",
        "if False:",
    ),
    # -- the store: status writes, parking, Redis lost
    python(
        "_delivery",
        "a lost lease at a status write is ignored",
        "if status < 0:",
        "if status < -2:",
    ),
    python(
        "_delivery",
        "a suspension keeps the stall count",
        '"wait": codec.dumps(wait.to_json()),\n            "starts_without_progress": 0,',
        '"wait": codec.dumps(wait.to_json()),',
    ),
    python(
        "_redis/backend",
        "reset keeps the stall count",
        '            pipe.hset(keys.meta, "starts_without_progress", 0)\n',
        "",
    ),
    python(
        "_delivery",
        "Redis lost under a step fails the run",
        "except (redis.ConnectionError, redis.TimeoutError) as down:",
        "except redis.TimeoutError as down:",
    ),
    # -- the Celery integration: retries without a ceiling, capped countdowns, final results
    # The task's own ceiling governs: retry(max_retries=None) means "the task's default".
    python(
        "integrations/celery",
        "the task keeps Celery's default ceiling of 3 retries",
        "            max_retries=None,\n            shared=False,",
        "            shared=False,",
        tests=CELERY_TESTS,
    ),
    python(
        "integrations/celery",
        "a busy delivery retries at once, while the run is held",
        "min(jitter(busy.remaining_ms / 1000), self.max_countdown)",
        "min(jitter(0.0), self.max_countdown)",
        tests=CELERY_TESTS,
    ),
    python(
        "integrations/celery",
        "a busy delivery's countdown is not capped",
        "min(jitter(busy.remaining_ms / 1000), self.max_countdown)",
        "jitter(busy.remaining_ms / 1000)",
        tests=CELERY_TESTS,
    ),
    python(
        "integrations/celery",
        "the store back-off does not grow",
        "jitter(2.0**attempt)",
        "jitter(2.0)",
        tests=CELERY_TESTS,
    ),
    python(
        "integrations/celery",
        "the store back-off is not capped",
        "min(jitter(2.0**attempt), cap)",
        "jitter(2.0**attempt)",
        tests=CELERY_TESTS,
    ),
    python(
        "integrations/celery",
        "the store back-off cap ignores max_countdown",
        "cap = min(self.store_backoff_cap, self.max_countdown)",
        "cap = self.store_backoff_cap",
        tests=CELERY_TESTS,
    ),
    python(
        "integrations/celery",
        "a parked run fails the task",
        "except RunParked as parked:",
        "except ArithmeticError as parked:",
        tests=CELERY_TESTS,
    ),
    python(
        "integrations/celery",
        "a lost lease fails the task",
        "except LeaseLost as lost:",
        "except ArithmeticError as lost:",
        tests=CELERY_TESTS,
    ),
    python(
        "integrations/celery",
        "an invalid run id fails the task",
        "except (InvalidRunId, InvalidArguments) as invalid:",
        "except ArithmeticError as invalid:",
        tests=CELERY_TESTS,
    ),
    python(
        "integrations/celery",
        "messages are acked before the task runs",
        '"task_acks_late": True,',
        '"task_acks_late": False,',
        tests=CELERY_TESTS,
    ),
    python(
        "integrations/celery",
        "a killed child's message is not requeued",
        '"task_reject_on_worker_lost": True,',
        '"task_reject_on_worker_lost": False,',
        tests=CELERY_TESTS,
    ),
    python(
        "integrations/celery",
        "a worker reserves a batch",
        '"worker_prefetch_multiplier": 1,',
        '"worker_prefetch_multiplier": 4,',
        tests=CELERY_TESTS,
    ),
    python(
        "integrations/celery",
        "pickle is accepted",
        '"accept_content": ["json"],',
        '"accept_content": ["json", "pickle"],',
        tests=CELERY_TESTS,
    ),
    python(
        "_limits",
        "a time limit at 90% of the visibility timeout is let through",
        "return task_time_limit >= redelivery_timeout * REDELIVERY_MARGIN",
        "return task_time_limit > redelivery_timeout * REDELIVERY_MARGIN",
        tests=CELERY_TESTS,
    ),
    python(
        "integrations/celery",
        "the task itself drops a killed child's message",
        "reject_on_worker_lost=True,\n",
        "reject_on_worker_lost=False,\n",
        tests=CELERY_TESTS,
    ),
    # -- waits: a signal is never lost, a sleep or a timeout never ends early
    python(
        "_journal",
        "a signal does not wake the run that waits for it",
        "if waiting is not None and waiting.signal == name:",
        "if False:",
        tests=WAIT_TESTS,
    ),
    python(
        "_run",
        "a sleep never suspends",
        "if self.clock.now() < wake_at:",
        "if False:",
        tests=WAIT_TESTS,
    ),
    python(
        "_run",
        "a signal wait times out at once",
        "elif deadline is not None and self.clock.now() >= float(deadline):",
        "elif deadline is not None:",
        tests=WAIT_TESTS,
    ),
    # -- a map: every answer durable as soon as it is paid for
    python(
        "_run",
        "map results held back in item order",
        "call = functools.partial(fn, items[index])",
        # The answer waits, unrecorded, until every item before it is reported.
        "call = functools.partial(lambda i: [fn(i), *iter(lambda: order._next >= index or "
        "threading.Event().wait(0.001), True)][0], items[index])",
    ),
)


# -- generated mutants: every comparison and every condition of every Lua script

# Lua's tokens, as far as finding comparisons and conditions needs: a comment or a string is
# skipped whole (a '<' inside a pattern is no comparison), a two-character operator is matched
# before a one-character one.
LUA_TOKEN = re.compile(
    r"""
      (?P<comment>--\[(?P<ceq>=*)\[.*?\](?P=ceq)\]|--[^\n]*)
    | (?P<string>'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*"|\[(?P<seq>=*)\[.*?\](?P=seq)\])
    | (?P<op>==|~=|<=|>=|<|>)
    | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<other>\S)
    """,
    re.VERBOSE | re.DOTALL,
)
FLIPPED = {"==": "~=", "~=": "==", "<": ">=", ">": "<=", "<=": ">", ">=": "<"}
ORDINALS = ("1st", "2nd", "3rd", "4th", "5th", "6th")


def lua_scripts() -> list[str]:
    """Every Lua script of the repository, relative to it: what generation covers."""
    return sorted(str(path.relative_to(ROOT)) for path in ROOT.glob("*/lua/*.lua"))


def script_mutants(path: str, tests: tuple[str, ...]) -> list[Mutant]:
    """Each comparison of ``path`` flipped, and each condition forced true and false.

    Named ``<script>:<line>: <change>``; where a line holds the operator (or the ``if``) more
    than once, the occurrence is counted, as in ``2nd == -> ~=``.
    """
    source = (ROOT / path).read_text()
    script = Path(path).name
    tokens = [
        (match.lastgroup, match)
        for match in LUA_TOKEN.finditer(source)
        if match.lastgroup != "comment"
    ]
    found: list[tuple[int, str, int, str, str]] = []  # line, what, offset, find, replace
    for index, (kind, match) in enumerate(tokens):
        line = source.count("\n", 0, match.start()) + 1
        if kind == "op":
            op = match.group()
            found.append((line, op, match.start(), op, FLIPPED[op]))
        elif kind == "word" and match.group() in ("if", "elseif"):
            end = next(j for j in range(index + 1, len(tokens)) if tokens[j][1].group() == "then")
            start, stop = tokens[index + 1][1].start(), tokens[end - 1][1].end()
            condition = source[start:stop]
            for forced in ("true", "false"):
                if condition != forced:
                    found.append((line, match.group(), start, condition, forced))
    mutants = []
    for line, what, offset, find, replacement in found:
        same = [f for f in found if f[0] == line and f[1] == what and f[4] == replacement]
        nth = f"{ORDINALS[same.index((line, what, offset, find, replacement))]} " * (len(same) > 1)
        change = f"{what} forced {replacement}" if what.isalpha() else f"{what} -> {replacement}"
        name = f"{script}:{line}: {nth}{change}"
        mutants.append(Mutant(name, path, find, replacement, tests, at=offset))
    return mutants


# The fast tests of each Lua script, quickest to kill its mutants first. Checked at every run:
# a script of the repository missing here fails the run, so a new script cannot go unjudged.
# Derived by tracing a fast-suite run (every test file that calls the script), then kept to
# the files that killed one of its mutants, fastest first: the others only ever ran for
# survivors. A script's new guard, or a new script, starts from its tracing again.
LUA_TESTS: dict[str, tuple[str, ...]] = {
    "journal/lua/cancel.lua": ("tests/journal/test_control.py",),
    "journal/lua/claim_due.lua": ("tests/journal/test_sweep.py",),
    "journal/lua/expect.lua": ("tests/journal/test_sweep.py",),
    "journal/lua/close.lua": (
        "tests/journal/test_deferred_records.py",
        "tests/journal/test_retry_resume.py",
        "tests/journal/test_corrupt_fields.py",
        "tests/journal/test_control.py",
        "tests/journal/test_fixtures.py",
        "tests/journal/test_waits.py",
        "tests/journal/test_script_guards.py",
        "tests/journal/test_protocol.py",
    ),
    "journal/lua/effect_claim.lua": (
        "tests/journal/test_step_kinds.py",
        "tests/journal/test_control.py",
        "tests/journal/test_batch.py",
        "tests/journal/test_script_guards.py",
        "tests/journal/test_protocol.py",
    ),
    "journal/lua/effect_decide.lua": (
        "tests/journal/test_script_guards.py",
        "tests/journal/test_protocol.py",
        "tests/tasks/ops/test_console_app.py",
    ),
    "journal/lua/effect_settle.lua": (
        "tests/journal/test_script_guards.py",
        "tests/journal/test_control.py",
        "tests/journal/test_batch.py",
        "tests/journal/test_fixtures.py",
        "tests/journal/test_protocol.py",
        "tests/tasks/ops/test_console_app.py",
    ),
    "journal/lua/open.lua": (
        "tests/journal/test_retry_resume.py",
        "tests/journal/test_workflow.py",
        "tests/journal/test_heartbeat_confirm.py",
        "tests/journal/test_corrupt_fields.py",
        "tests/journal/test_round_trips.py",
        "tests/journal/test_store_meta.py",
        "tests/journal/test_script_guards.py",
        "tests/journal/test_protocol.py",
        "tests/journal/test_tracing.py",
    ),
    "journal/lua/purge.lua": (
        "tests/journal/test_purge.py",
        "tests/journal/test_control.py",
    ),
    "journal/lua/purge_index.lua": (
        "tests/journal/test_purge.py",
        "tests/journal/test_control.py",
    ),
    "journal/lua/record.lua": (
        "tests/journal/test_deferred_records.py",
        "tests/journal/test_round_trips.py",
        "tests/journal/test_retry_resume.py",
        "tests/journal/test_holder.py",
        "tests/journal/test_step_kinds.py",
    ),
    "journal/lua/release.lua": ("tests/journal/test_corrupt_fields.py",),
    "journal/lua/renew.lua": (
        "tests/journal/test_heartbeat_confirm.py",
        "tests/journal/test_step_kinds.py",
        "tests/journal/test_script_guards.py",
        "tests/journal/test_store_meta.py",
        "tests/journal/test_protocol.py::test_a_renewal_publishes_the_holders_steps_in_flight_"
        "for_as_long_as_its_lease",
        "tests/journal/test_protocol.py::test_the_effect_scripts_answer_each_of_their_codes",
    ),
    "tasks/lua/budget_reserve.lua": (
        "tests/tasks/llm/test_budget_scripts.py",
        "tests/tasks/llm/test_budget.py",
        "tests/tasks/job/test_batch_digest.py",
    ),
    "tasks/lua/budget_settle.lua": ("tests/tasks/llm/test_budget_scripts.py",),
    "tasks/lua/budget_settle_call.lua": (
        "tests/tasks/llm/test_budget.py",
        "tests/tasks/llm/test_budget_scripts.py",
    ),
    "tasks/lua/claim_items.lua": ("tests/tasks/llm/test_budget_scripts.py",),
    "tasks/lua/ratelimit_reserve.lua": ("tests/tasks/llm/test_ratelimit_scripts.py",),
    "tasks/lua/ratelimit_settle.lua": ("tests/tasks/llm/test_ratelimit_scripts.py",),
}

# Generated mutants no behaviour can tell from the original, by name, each with why. They are
# not run; a name here that generation no longer yields fails the run, so the list stays true.
EQUIVALENT: dict[str, str] = {}


def unmapped() -> list[str]:
    """What is wrong with ``LUA_TESTS``: a script without tests, a test or script that is gone."""
    problems = [f"{path}: no entry in LUA_TESTS" for path in lua_scripts() if path not in LUA_TESTS]
    for path, tests in LUA_TESTS.items():
        if not (ROOT / path).is_file():
            problems.append(f"{path}: in LUA_TESTS, but no such script")
        if not tests:
            problems.append(f"{path}: LUA_TESTS names no test for it")
        problems += [
            f"{path}: its test {test} does not exist"
            for test in tests
            if not (ROOT / test.split("::")[0]).is_file()
        ]
    return problems


def generated() -> tuple[Mutant, ...]:
    """Every generated mutant, but one whose text a hand-written or earlier one already makes.

    The same text is the same program: judging it twice proves nothing more.
    """
    made = {
        (m.path, m.apply((ROOT / m.path).read_text())) for m in MUTANTS if m.path.endswith(".lua")
    }
    mutants = []
    for path in lua_scripts():
        source = (ROOT / path).read_text()
        for mutant in script_mutants(path, LUA_TESTS.get(path, ())):
            text = (path, mutant.apply(source))
            if text not in made:
                made.add(text)
                mutants.append(mutant)
    return tuple(mutants)


@dataclass(frozen=True)
class Verdict:
    """What the fast tests made of one mutant."""

    mutant: Mutant
    killed: bool
    by: str
    seconds: float
    output: str


def stale(mutants: tuple[Mutant, ...]) -> list[str]:
    """Hand-written mutants whose pattern does not occur exactly once in today's source."""
    problems = []
    for mutant in mutants:
        count = (ROOT / mutant.path).read_text().count(mutant.find)
        if count != 1:
            problems.append(f"{mutant.name}: {mutant.path} holds its pattern {count} times")
    return problems


def scratch_copy(directory: Path) -> Path:
    """A copy of the project to mutate; the installed package is never touched."""
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, directory / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, directory / name)
    return directory


# -- the judges: one long-lived process per job, each with its own copy, forking per mutant
#
# Starting Python, pytest and its plugins costs more than most mutants' tests take to fail.
# A judge process imports the third-party modules once, then forks one child per mutant; the
# child imports the project from the copy (as mutated) and runs pytest. The project itself is
# never imported before the fork, so a mutated Python module is read fresh by every child.
PRELOADED = ("pytest", "hypothesis", "fakeredis", "redis", "celery", "kombu", "pytest_timeout")


def serve() -> int:
    """The judge's loop (``--serve``): one JSON job a line on stdin, one verdict a line out.

    A job is ``{"path", "text", "tests"}``: ``text`` replaces the copy's ``path`` (the copy is
    the working directory) while the tests run, then the original is put back.
    """
    for module in PRELOADED:
        importlib.import_module(module)
    copy = Path.cwd()
    for line in sys.stdin:
        job = json.loads(line)
        target = copy / job["path"] if job["path"] else None
        original = target.read_text() if target else ""
        if target:
            target.write_text(job["text"])
        try:
            fresh = str(job["path"]).endswith(".py")
            code, output = forked_pytest(copy, tuple(job["tests"]), fresh=fresh)
        finally:
            if target:
                target.write_text(original)
        print(json.dumps({"code": code, "output": output}), flush=True)
    return 0


def forked_pytest(copy: Path, tests: tuple[str, ...], *, fresh: bool) -> tuple[int, str]:
    """Run ``tests`` in a forked child, its output captured; its exit code, or -9 if killed.

    ``fresh`` keeps the child's compiled modules apart from the copy's: a mutated module and
    its original can share a size and an mtime second, and a cached ``.pyc`` of one would
    then be run for the other.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryDirectory() as pycache:
        pid = os.fork()
        if pid == 0:  # the child: never returns
            _child(out, pycache if fresh else None, tests)
        deadline = time.monotonic() + HARD_TIMEOUT_S
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                code = -9
                break
            time.sleep(0.01)
        out.seek(0)
        return code, out.read().decode(errors="replace")


def _child(out: IO[bytes], pycache: str | None, tests: tuple[str, ...]) -> None:
    code = 3
    try:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        if pycache is not None:
            sys.pycache_prefix = pycache
        import pytest

        code = int(pytest.main([*PYTEST, *tests]))
    except BaseException:  # anything at all: the parent must get an answer, not a second loop
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class Judges:
    """A judge process per server URL, each on its own copy, lent to one mutant at a time."""

    def __init__(self, workspace: Path, env: dict[str, str], urls: list[str]) -> None:
        self.idle: queue.Queue[subprocess.Popen[str]] = queue.Queue()
        self.all: list[subprocess.Popen[str]] = []
        for n, url in enumerate(urls):
            copy = scratch_copy(workspace / f"judge-{n}")
            judge = subprocess.Popen(
                [sys.executable, "-m", "tests.mutants", "--serve"],
                cwd=copy,
                env={**env, "PYTHONPATH": str(copy), "TEST_REDIS_URL": url},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            self.all.append(judge)
            self.idle.put(judge)

    def run(self, path: str, text: str, tests: tuple[str, ...]) -> tuple[int, str]:
        """The tests' exit code and output with ``path`` replaced by ``text`` ("": none)."""
        judge = self.idle.get()
        try:
            assert judge.stdin is not None and judge.stdout is not None
            judge.stdin.write(json.dumps({"path": path, "text": text, "tests": tests}) + "\n")
            judge.stdin.flush()
            reply = judge.stdout.readline()
            if not reply:
                raise SystemExit(f"a judge exited ({judge.wait()}) while judging {path}")
            answer: dict[str, Any] = json.loads(reply)
            return int(answer["code"]), str(answer["output"])
        finally:
            self.idle.put(judge)

    def close(self) -> None:
        """Ends every judge: its stdin closed, its loop returns."""
        for judge in self.all:
            assert judge.stdin is not None
            judge.stdin.close()
        for judge in self.all:
            judge.wait(timeout=30)


def judge(mutant: Mutant, judges: Judges) -> Verdict:
    """Apply one mutant to a judge's copy and run its tests."""
    started = time.monotonic()
    text = mutant.apply((ROOT / mutant.path).read_text())
    code, output = judges.run(mutant.path, text, mutant.tests)
    if code not in (0, 1, -9):
        raise SystemExit(f"mutant {mutant.name!r}: pytest exited {code}, not a verdict:\n{output}")
    failed = re.search(r"^FAILED (\S+)", output, re.MULTILINE)
    by = failed.group(1) if failed else ("a hang, killed" if code == -9 else "")
    return Verdict(mutant, code != 0, by, time.monotonic() - started, output)


def imports_from(copy: Path) -> str:
    """Where a process started like a judge imports ``journal`` from."""
    env = {**os.environ, "PYTHONPATH": str(copy)}
    probe = [sys.executable, "-c", "import journal; print(journal.__file__)"]
    return subprocess.run(
        probe, cwd=copy, env=env, capture_output=True, text=True, check=True
    ).stdout


def problems_with(mutants: tuple[Mutant, ...], generation: tuple[Mutant, ...]) -> list[str]:
    """Everything that makes the sets unfit to run: stale patterns, unmapped scripts, names."""
    problems = stale(MUTANTS) + unmapped()
    names = [m.name for m in mutants]
    problems += [
        f"{name}: two mutants have this name" for name in set(names) if names.count(name) > 1
    ]
    generated_names = {m.name for m in generation}
    problems += [
        f"{name}: listed as equivalent, but no generated mutant has this name"
        for name in EQUIVALENT
        if name not in generated_names
    ]
    return problems


@contextlib.contextmanager
def valkeys(directory: Path, count: int) -> Iterator[list[str]]:
    """A throwaway Valkey per judge (its ``TEST_REDIS_URL``), all killed after the run.

    One server per judge, not one per mutant: a judge's children run one at a time, each
    test keeps to its own key prefix, and a mutated script is cached under its own SHA, apart
    from the original. Not one for all judges: a test may read the whole server (the
    fixtures' check that nothing was written), and another judge's test would write to it.
    """
    from tests.support import ThrowawayValkeys

    directory.mkdir()
    servers = ThrowawayValkeys(directory)
    try:
        yield [f"unix://{servers.start('--appendonly', 'no')}" for _ in range(count)]
    finally:
        servers.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--list", action="store_true", help="print the mutants, run none")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("names", nargs="*", help="run only mutants whose name contains these")
    options = parser.parse_args(argv)
    if options.serve:
        return serve()
    generation = generated()
    everything = MUTANTS + generation
    problems = problems_with(everything, generation)
    if problems:
        print("the mutants cannot be run as they are; fix these first:", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        return 2
    chosen = tuple(
        m
        for m in everything
        if m.name not in EQUIVALENT
        and (not options.names or any(n in m.name for n in options.names))
    )
    if options.list:
        for mutant in chosen:
            change = f"{mutant.find!r} -> {mutant.replace!r}"
            print(f"{mutant.name}\t{mutant.path}\t{change}")
        for name, why in EQUIVALENT.items():
            print(f"{name}\tequivalent, not run: {why}")
        print(f"{len(chosen)} mutants ({len(MUTANTS)} hand-written, {len(generation)} generated)")
        return 0
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mutants-") as scratch:
        workspace = Path(scratch)
        baseline = scratch_copy(workspace / "baseline")
        where = imports_from(baseline)
        if not where.startswith(str(baseline)):
            print(
                f"a scratch copy imports journal from {where.strip()}, not from itself",
                file=sys.stderr,
            )
            return 2
        with valkeys(workspace / "valkey", options.jobs) as urls:
            env = dict(os.environ)
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            judges = Judges(workspace, env, urls)
            try:
                verdicts = judge_all(chosen, judges)
            finally:
                judges.close()
    if verdicts is None:
        return 2
    survivors = [v for v in verdicts if not v.killed]
    print(
        f"mutants: {len(verdicts) - len(survivors)} killed of {len(verdicts)} "
        f"in {time.monotonic() - started:.0f}s; {len(EQUIVALENT)} equivalents not run"
    )
    for verdict in survivors:
        print(f"\nsurvivor {verdict.mutant.name!r} ({verdict.mutant.path}):", file=sys.stderr)
        print(f"  - {verdict.mutant.find!r}\n  + {verdict.mutant.replace!r}", file=sys.stderr)
    return 1 if survivors else 0


def judge_all(chosen: tuple[Mutant, ...], judges: Judges) -> list[Verdict] | None:
    """Every chosen mutant's verdict, once the unmutated tests pass; None when they do not.

    The unmutated tests run as each mutant will run them, file by file in the same order in
    one process: a test that fails only after another file ran first (state one leaves
    behind) would otherwise count as a kill of every mutant judged in that order.
    """
    orders = list(dict.fromkeys(m.tests for m in chosen))
    with ThreadPoolExecutor(max_workers=len(judges.all)) as pool:
        runs = pool.map(lambda tests: (tests, *judges.run("", "", tests)), orders)
        for tests, code, output in runs:
            if code != 0:
                print(
                    f"the unmutated tests fail when run as {' '.join(tests)}; "
                    f"no mutant judged so can be judged:\n{output}",
                    file=sys.stderr,
                )
                return None
    verdicts = []
    with ThreadPoolExecutor(max_workers=len(judges.all)) as pool:
        for verdict in pool.map(lambda m: judge(m, judges), chosen):
            state = f"killed by {verdict.by}" if verdict.killed else "SURVIVED"
            print(f"{verdict.seconds:5.1f}s  {verdict.mutant.name}: {state}", flush=True)
            verdicts.append(verdict)
    return verdicts


if __name__ == "__main__":
    sys.exit(main())
