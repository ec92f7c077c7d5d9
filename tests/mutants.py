"""Mutation testing of the protocol: break one guard at a time, and the fast tests must notice.

Each mutant is one text substitution in the Lua scripts or in the lease, heartbeat, record
and store path: a comparison flipped, a holder check removed, a fence not incremented, a
confirmation stamped late, a renewal skipped. Each is applied to a scratch copy of the
project, and the fast tests that cover the protocol run against that copy; every mutant must
make them fail. A pattern that no longer matches the source fails the whole run before any
mutant is tried, so the set cannot go stale silently when the code changes: update the
pattern with the code.

Run it with ``make mutants`` (``python -m tests.mutants [-j JOBS] [NAME ...]``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COPIED = ("journal", "tasks", "tests", "data", "pyproject.toml")

# The fast tests that cover the protocol, the quickest to fail first: a mutant stops at the
# first failing test, and one that survives runs them all.
PROTOCOL_TESTS = (
    "tests/journal/test_protocol.py",
    "tests/journal/test_steps.py",
    "tests/journal/test_effects.py",
    "tests/journal/test_control.py",
    "tests/journal/test_holder.py",
    "tests/journal/test_waits.py",
    "tests/journal/test_sweep.py",
    "tests/journal/test_racers.py",
)
CELERY_TESTS = ("tests/journal/test_durable.py",)
# Waits and signals, interrupted before every command: the exhaustive sweep, on fakeredis.
WAIT_TESTS = (
    "tests/journal/test_wait_schedules.py"
    "::test_one_interruption_before_any_command_keeps_the_invariants_on_fakeredis",
)
# Stop at the first failure and name it; a mutant that hangs a test fails it in 30 s.
PYTEST: tuple[str, ...] = ("-m", "pytest", "-x", "-q", "-rf", "-m", "not slow")
PYTEST += ("-p", "no:cacheprovider")
PYTEST += ("-o", "timeout=30")


@dataclass(frozen=True)
class Mutant:
    """One broken guard: ``find`` replaced by ``replace`` in ``path``."""

    name: str
    path: str
    find: str
    replace: str
    tests: tuple[str, ...] = PROTOCOL_TESTS


def lua(script: str, name: str, find: str, replace: str) -> Mutant:
    return Mutant(f"{script}: {name}", f"journal/lua/{script}.lua", find, replace)


def python(module: str, name: str, find: str, replace: str, **kwargs: tuple[str, ...]) -> Mutant:
    return Mutant(f"{module}: {name}", f"journal/{module}.py", find, replace, **kwargs)


EXPIRED_THEN_HOLDER = "if not holder then\n  return {-1}\nend\nif holder ~= ARGV[1] then"
META_EXPIRED_THEN_HOLDER = "if not holder then\n  return -1\nend\nif holder ~= ARGV[1] then"

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
        EXPIRED_THEN_HOLDER,
        "if holder and holder ~= ARGV[1] then",
    ),
    lua(
        "record",
        "the holder check removed",
        "if holder ~= ARGV[1] then\n  return {-2, holder}\nend\n",
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
        META_EXPIRED_THEN_HOLDER,
        "if holder and holder ~= ARGV[1] then",
    ),
    lua(
        "close",
        "the holder check removed",
        "if holder ~= ARGV[1] then\n  return -2\nend\n",
        "",
    ),
    lua(
        "close",
        "an arrived signal is ignored",
        "redis.call('HEXISTS', KEYS[3], ARGV[2]) == 1",
        "redis.call('HEXISTS', KEYS[3], ARGV[2]) == 2",
    ),
    lua("close", "a field is never deleted", "if #ARGV > 7 + 2 * sets then", "if false then"),
    lua(
        "close", "the lease is kept", "redis.call('DEL', KEYS[1])", "redis.call('EXISTS', KEYS[1])"
    ),
    lua(
        "close",
        "an ended run stays due",
        "redis.call('ZREM', KEYS[5], ARGV[4])",
        "redis.call('ZSCORE', KEYS[5], ARGV[4])",
    ),
    lua(
        "renew",
        "a renewal leaves the run due at the old expiry",
        "redis.call('ZADD', KEYS[3], ARGV[3], ARGV[4])",
        "redis.call('ZSCORE', KEYS[3], ARGV[4])",
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
        "if holder ~= ARGV[1] then\n  return {-2, holder}\nend\n",
        "",
    ),
    lua(
        "effect_claim",
        "claims when nobody holds the lease",
        EXPIRED_THEN_HOLDER,
        "if holder and holder ~= ARGV[1] then",
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
        "effect_confirm",
        "the holder check removed",
        "if holder ~= ARGV[1] then\n  return -2\nend\n",
        "",
    ),
    lua(
        "effect_confirm",
        "another fence's claim is confirmed",
        "if fence ~= ARGV[3] or state ~= 'claimed' then",
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
        "lease",
        "a live holder is taken over",
        "process is not None and process.provably_gone(me)",
        "process is not None",
    ),
    python(
        "holder",
        "a holder in another time namespace is compared",
        "where = (self.host, self.boot, self.pidns, self.timens)",
        "where = (self.host, self.boot, self.pidns, me.timens)",
    ),
    python(
        "holder",
        "an observer whose /proc is not its own proves",
        "        if me.start <= 0:\n            return False",
        "        if me.start < 0:\n            return False",
    ),
    python(
        "lease",
        "the grant is stamped after its reply",
        'asked = time.monotonic()\n        reply = self._acquire(now_ms, me, "", opening)',
        'reply = self._acquire(now_ms, me, "", opening)\n        asked = time.monotonic()',
    ),
    python(
        "lease",
        "ensure never renews synchronously",
        "            if stale:\n                self._renew()",
        "            if stale:\n                pass",
    ),
    python(
        "lease",
        "the staleness comparison flipped",
        "time.monotonic() - self._confirmed_at > self._lease.ttl_ms / 2000",
        "time.monotonic() - self._confirmed_at < self._lease.ttl_ms / 2000",
    ),
    python(
        "lease",
        "ensure ignores a loss the beat found",
        "        if self.lost.is_set():\n            raise LeaseLost",
        "        if False:\n            raise LeaseLost",
    ),
    python(
        "lease",
        "a renewal's confirmation is stamped late",
        "self._confirmed_at = max(self._confirmed_at, asked)",
        "self._confirmed_at = time.monotonic()",
    ),
    python(
        "lease",
        "a failed renewal is not marked lost",
        "                first = not self.lost.is_set()\n                self.lost.set()\n",
        "                first = not self.lost.is_set()\n",
    ),
    python("lease", "the beat skips its renewal", "renewed = self._renew()", "renewed = True"),
    python(
        "lease",
        "a Redis error kills the beat",
        "except Exception:  # a blip must not kill the thread",
        "except ArithmeticError:  #",
    ),
    python(
        "lease",
        "a cancel learnt at a renewal is dropped",
        "        if status is Renewed.CANCEL_PENDING:\n            self.cancelled.set()",
        "        if status is Renewed.CANCEL_PENDING:\n            pass",
    ),
    # -- the record path
    python(
        "steps",
        "a step starts without the boundary check",
        "        self.check_lease()\n        started = millis(self.clock.now())\n        attempt,",
        "        started = millis(self.clock.now())\n        attempt,",
    ),
    python(
        "retry",
        "a retry after a back-off skips the boundary check",
        "clock.sleep(delay)\n            check_lease()",
        "clock.sleep(delay)",
    ),
    python(
        "steps",
        "an expired lease is taken for a record",
        "if status is Recorded.LEASE_EXPIRED:",
        "if False:",
    ),
    python(
        "steps",
        "a fenced record is taken for a record",
        "if status is Recorded.FENCED:",
        "if False:",
    ),
    # -- the store: status writes, parking, Redis lost
    python(
        "runner", "a lost lease at a status write is ignored", "if status < 0:", "if status < -2:"
    ),
    python(
        "runner",
        "a suspension keeps the stall count",
        '"wait": codec.dumps(wait.to_json()),\n            "starts_without_progress": 0,',
        '"wait": codec.dumps(wait.to_json()),',
    ),
    python(
        "backend",
        "reset keeps the stall count",
        '            pipe.hset(keys.meta, "starts_without_progress", 0)\n',
        "",
    ),
    python(
        "runner",
        "Redis lost under a step fails the run",
        "except (redis.ConnectionError, redis.TimeoutError) as down:",
        "except redis.TimeoutError as down:",
    ),
    # -- the Celery integration: retries without a ceiling, capped countdowns, final results
    # The task's own ceiling governs: retry(max_retries=None) means "the task's default".
    python(
        "durable",
        "the task keeps Celery's default ceiling of 3 retries",
        "            max_retries=None,\n            shared=False,",
        "            shared=False,",
        tests=CELERY_TESTS,
    ),
    python(
        "durable",
        "a busy delivery retries at once, while the run is held",
        "min(jitter(busy.remaining_ms / 1000), self.max_countdown)",
        "min(jitter(0.0), self.max_countdown)",
        tests=CELERY_TESTS,
    ),
    python(
        "durable",
        "a busy delivery's countdown is not capped",
        "min(jitter(busy.remaining_ms / 1000), self.max_countdown)",
        "jitter(busy.remaining_ms / 1000)",
        tests=CELERY_TESTS,
    ),
    python(
        "durable",
        "the store back-off does not grow",
        "jitter(2.0**attempt)",
        "jitter(2.0)",
        tests=CELERY_TESTS,
    ),
    python(
        "durable",
        "the store back-off is not capped",
        "min(jitter(2.0**attempt), cap)",
        "jitter(2.0**attempt)",
        tests=CELERY_TESTS,
    ),
    python(
        "durable",
        "the store back-off cap ignores max_countdown",
        "cap = min(self.store_backoff_cap, self.max_countdown)",
        "cap = self.store_backoff_cap",
        tests=CELERY_TESTS,
    ),
    python(
        "durable",
        "a parked run fails the task",
        "except RunParked as parked:",
        "except ArithmeticError as parked:",
        tests=CELERY_TESTS,
    ),
    python(
        "durable",
        "a lost lease fails the task",
        "except LeaseLost as lost:",
        "except ArithmeticError as lost:",
        tests=CELERY_TESTS,
    ),
    python(
        "durable",
        "an invalid run id fails the task",
        "except (InvalidRunId, InvalidArguments) as invalid:",
        "except ArithmeticError as invalid:",
        tests=CELERY_TESTS,
    ),
    python(
        "durable",
        "messages are acked before the task runs",
        '"task_acks_late": True,',
        '"task_acks_late": False,',
        tests=CELERY_TESTS,
    ),
    python(
        "durable",
        "a killed child's message is not requeued",
        '"task_reject_on_worker_lost": True,',
        '"task_reject_on_worker_lost": False,',
        tests=CELERY_TESTS,
    ),
    python(
        "durable",
        "a worker reserves a batch",
        '"worker_prefetch_multiplier": 1,',
        '"worker_prefetch_multiplier": 4,',
        tests=CELERY_TESTS,
    ),
    python(
        "durable",
        "pickle is accepted",
        '"accept_content": ["json"],',
        '"accept_content": ["json", "pickle"],',
        tests=CELERY_TESTS,
    ),
    python(
        "limits",
        "a time limit at 90% of the visibility timeout is let through",
        "return task_time_limit >= redelivery_timeout * REDELIVERY_MARGIN",
        "return task_time_limit > redelivery_timeout * REDELIVERY_MARGIN",
        tests=CELERY_TESTS,
    ),
    python(
        "durable",
        "the task itself drops a killed child's message",
        "reject_on_worker_lost=True,\n",
        "reject_on_worker_lost=False,\n",
        tests=CELERY_TESTS,
    ),
    # -- waits: a signal is never lost, a sleep or a timeout never ends early
    python(
        "store",
        "a signal does not wake the run that waits for it",
        "if waiting_for.signal == name:",
        "if False:",
        tests=WAIT_TESTS,
    ),
    python(
        "steps",
        "a sleep never suspends",
        "if self.clock.now() < wake_at:",
        "if False:",
        tests=WAIT_TESTS,
    ),
    python(
        "steps",
        "a signal wait times out at once",
        "elif deadline is not None and self.clock.now() >= float(deadline):",
        "elif deadline is not None:",
        tests=WAIT_TESTS,
    ),
    # -- a map: every answer durable as soon as it is paid for
    python(
        "steps",
        "map results held back in item order",
        "call = functools.partial(fn, items[index])",
        # The answer waits, unrecorded, until every item before it is reported.
        "call = functools.partial(lambda i: [fn(i), *iter(lambda: order._next >= index or "
        "threading.Event().wait(0.001), True)][0], items[index])",
    ),
)


@dataclass(frozen=True)
class Verdict:
    """What the fast tests made of one mutant."""

    mutant: Mutant
    killed: bool
    by: str
    seconds: float
    output: str


def stale(mutants: tuple[Mutant, ...]) -> list[str]:
    """Mutants whose pattern does not occur exactly once in today's source."""
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


def run_tests(copy: Path, tests: tuple[str, ...]) -> tuple[int, str]:
    """The fast tests against ``copy``, stopping at the first failure."""
    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, *PYTEST, *tests],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


def imports_from(copy: Path) -> str:
    """Where a process started like the test runs imports ``journal`` from."""
    env = {**os.environ, "PYTHONPATH": str(copy)}
    probe = [sys.executable, "-c", "import journal; print(journal.__file__)"]
    return subprocess.run(
        probe, cwd=copy, env=env, capture_output=True, text=True, check=True
    ).stdout


def judge(mutant: Mutant, workspace: Path) -> Verdict:
    """Apply one mutant to its own copy and run its tests."""
    started = time.monotonic()
    copy = scratch_copy(workspace / re.sub(r"\W+", "-", mutant.name))
    target = copy / mutant.path
    source = target.read_text()
    if source.count(mutant.find) != 1:  # the code changed while the run went on
        raise SystemExit(f"mutant {mutant.name!r}: its pattern is gone from {mutant.path}")
    target.write_text(source.replace(mutant.find, mutant.replace))
    code, output = run_tests(copy, mutant.tests)
    if code not in (0, 1):
        raise SystemExit(f"mutant {mutant.name!r}: pytest exited {code}, not a verdict:\n{output}")
    failed = re.search(r"^FAILED (\S+)", output, re.MULTILINE)
    by = failed.group(1) if failed else ""
    return Verdict(mutant, code == 1, by, time.monotonic() - started, output)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("names", nargs="*", help="run only mutants whose name contains these")
    options = parser.parse_args(argv)
    chosen = tuple(
        m for m in MUTANTS if not options.names or any(n in m.name for n in options.names)
    )
    problems = stale(MUTANTS)
    if problems:
        print("stale mutants: the code changed under them; update their patterns:", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        return 2
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
        tests = tuple(sorted({t for m in chosen for t in m.tests}))
        code, output = run_tests(baseline, tests)
        if code != 0:
            print(f"the unmutated tests fail; no mutant can be judged:\n{output}", file=sys.stderr)
            return 2
        verdicts = []
        with ThreadPoolExecutor(max_workers=options.jobs) as pool:
            for verdict in pool.map(lambda m: judge(m, workspace), chosen):
                state = f"killed by {verdict.by}" if verdict.killed else "SURVIVED"
                print(f"{verdict.seconds:5.1f}s  {verdict.mutant.name}: {state}", flush=True)
                verdicts.append(verdict)
    survivors = [v for v in verdicts if not v.killed]
    print(
        f"mutants: {len(verdicts) - len(survivors)} killed of {len(verdicts)} "
        f"in {time.monotonic() - started:.0f}s"
    )
    for verdict in survivors:
        print(f"\nsurvivor {verdict.mutant.name!r} ({verdict.mutant.path}):", file=sys.stderr)
        print(f"  - {verdict.mutant.find!r}\n  + {verdict.mutant.replace!r}", file=sys.stderr)
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
