"""One campaign: start the deployment, play the seed's schedule, go quiet, check the promise.

The schedule (``tests.chaos.plan``) is played in time order by one loop; anything that takes
a while (a worker's restart, an operator's command) runs on a small thread pool so the loop
keeps time. Every fault and action is appended to ``timeline.jsonl`` as it happens, with its
outcome. After the last fault the campaign goes quiet: every process resumed or restarted,
every fake back to normal, one more week dispatched to take what the last weeks let go; then
the checker judges what the mailbox, the fake API and Redis hold.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import itertools
import json
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import redis

from journal.ops.views import inspect_run
from tasks.config import Config
from tasks.runtime import Runtime
from tests.chaos.checker import FaultWindow, Observation, Violation, check
from tests.chaos.observe import WORKFLOW, Monitor, item_title, observe
from tests.chaos.plan import Event, Power, make_plan
from tests.chaos.stack import Stack, faketime_available, hidden_workers_available
from tests.fakes.anthropic_server import CREDIT_TOO_LOW

# The simulated calendar: week 0 is dispatched at 08:01 on this Monday (ISO week 2031-w02).
FIRST_MONDAY = datetime(2031, 1, 6, 8, 1, tzinfo=UTC)
# How long the probe-kill fault holds the API waiting for the first call to arrive.
PROBE_WAIT_S = 4.0
# How long the slow item's call must be the only one in flight before the kill under it: the
# other items' answers are then older than the checker's margin for recording them, so a map
# that had not recorded them would pay for them again with no fault to explain it.
SLOW_ALONE_S = 1.5
# How long a batch fault waits for the batch it aims at (created, or cancelled at its deadline).
BATCH_WAIT_S = 12.0
# A batch created while the deadline fault runs processes this long: far past the deployment's
# DIGEST_BATCH_DEADLINE, so the run cancels it and asks its items synchronously.
SLOW_BATCH_S = 60.0
# What a pool child prints as it dies at a CRASH point (tasks/faults.py).
CRASH_LINE = b"simulated crash at "
# How many weeks a CRASH point stays armed on worker b (batch-results-kill).
ARMED_WEEKS = 3
# How often the loop looks again at something it waits for (a held send, a slow call).
POLL_S = 0.1
# How often the operator of a focus with questions looks for runs that failed ambiguous.
ASK_EVERY_S = 0.25
# How long a sender is frozen inside its send: past its lease (DIGEST_LEASE_TTL=2) and the
# SMTP timeout (3 s), so another worker takes the run over meanwhile.
FREEZE_S = 5.0
# Faults whose window can catch a model call in flight (the paid-calls check).
HITS_CALLS = frozenset(
    {
        "kill-child",
        "stop-child",
        "kill-worker",
        "stop-worker",
        "kill-valkey",
        "api-hold",
        "api-credit",
        "clock-skew",
        "operator-cancel",
        "probe-kill",
        "freeze-sender",
        "batch-results-crash",
    }
)
SETTLED = frozenset({"done", "cancelled", "failed"})
# How long the quiet period waits for a week that was reached but never started: a published
# week starts within seconds on idle workers; one still new after this was never published.
NEW_WEEK_GRACE_S = 20.0


def week_id(index: int) -> str:
    """The run id of the campaign's week ``index``."""
    year, week, _ = (FIRST_MONDAY + timedelta(weeks=index)).isocalendar()
    return f"{year}-w{week:02d}"


class Timeline:
    """The campaign's log of faults and actions, one JSON object a line, flushed as written."""

    def __init__(self, path: Path, started: float) -> None:
        self.path = path
        self.started = started
        self.entries: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._file = path.open("w")

    def add(self, kind: str, window: float | None = None, **detail: Any) -> dict[str, Any]:
        """Record one entry now; ``window`` (seconds) marks a fault that can catch calls."""
        now = time.time()
        entry: dict[str, Any] = {"t": round(now - self.started, 3), "at": now, "kind": kind}
        entry.update(detail)
        if window is not None:
            entry["until"] = now + window
        with self._lock:
            self.entries.append(entry)
            self._file.write(json.dumps(entry, default=str) + "\n")
            self._file.flush()
        return entry

    def around(self, moment: float, seconds: float = 6.0) -> list[dict[str, Any]]:
        """The entries within ``seconds`` of ``moment``."""
        with self._lock:
            return [e for e in self.entries if abs(e["at"] - moment) <= seconds]

    def faults(self) -> list[FaultWindow]:
        """The entries that can catch a model call in flight, as windows.

        The kills of one burst (every pool child at once, under one fault) are one fault: each
        thing in flight then is asked again once, whichever child asked it.
        """
        windows: dict[Any, FaultWindow] = {}
        with self._lock:
            for index, e in enumerate(self.entries):
                if e["kind"] not in HITS_CALLS:
                    continue
                window = FaultWindow(
                    e["kind"],
                    e.get("since", e["at"]),
                    e.get("until", e["at"]),
                    str(e.get("target", "")),
                )
                burst = e.get("burst")
                key = ("burst", burst) if burst is not None else index
                if key in windows:
                    first = windows[key]
                    window = FaultWindow(
                        first.kind,
                        min(first.started, window.started),
                        max(first.ended, window.ended),
                        "every child",
                    )
                windows[key] = window
        return list(windows.values())

    def close(self) -> None:
        """Close the file."""
        self._file.close()


class Campaign:
    """One seed's campaign in ``directory`` (``.chaos/seed-N``).

    Args:
        seed: draws the whole schedule.
        duration: seconds of faults and weeks; the quiet period comes after.
        settle_timeout: the longest the quiet period waits for runs to end (a bound, not a
            sleep: it ends as soon as every run has ended or waits for a person).
        env: settings of the deployment under test that override the campaign's own.
    """

    def __init__(
        self,
        seed: int,
        duration: float,
        directory: Path,
        power: Power | None = None,
        settle_timeout: float = 90.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.seed = seed
        self.duration = duration
        self.directory = directory
        self.power = power or Power()
        self.settle_timeout = settle_timeout
        self.plan = make_plan(seed, duration, self.power)
        self.stack = Stack(directory, env_overrides={**self.power.env, **(env or {})})
        self.items: list[str] = []
        self.week_items: list[str] = []
        self.weeks: list[str] = []
        self.resent: set[str] = set()
        self.starts: Counter[str] = Counter()
        self.dispatchers: list[tuple[subprocess.Popen[str], str]] = []
        self._later: list[tuple[float, int, str, Callable[[], None]]] = []
        self._order = itertools.count()
        self._pool = ThreadPoolExecutor(max_workers=6, thread_name_prefix="chaos")
        self._pending: list[Future[None]] = []
        self._valkey_lock = threading.Lock()
        self.started = time.time()
        self.quiet = False
        self.published: set[str] = set()
        self._slow_titles: set[str] = set()
        self._bursts = itertools.count(1)
        self._asked: set[str] = set()
        self.timeline: Timeline | None = None
        self.runtime: Runtime | None = None
        self.monitor: Monitor | None = None

    # --- the whole campaign

    def run(self) -> tuple[Observation, list[Violation]]:
        """Play the schedule, go quiet, observe and check; every process is killed after."""
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory.parent / ".gitignore").write_text("*\n")  # results, never committed
        (self.directory / "schedule.json").write_text(
            json.dumps([event.to_json() for event in self.plan], indent=1)
        )
        try:
            self.stack.start()
            self.started = time.time()
            self.timeline = Timeline(self.directory / "timeline.jsonl", self.started)
            for name in ("a", "b"):
                self._start_worker(name)
            self.runtime = Runtime.build(Config.from_env(self.stack.env), allow_offline=True)
            self.monitor = Monitor(self.runtime)
            self.monitor.start()
            # The schedule starts once the deployment is up: counted from before the workers'
            # start (seconds on a loaded machine), its first weeks were overdue together, and
            # two first dispatches at once send only the later week, as a first deployment
            # does by design, which the campaign took for a lost week.
            self.started = self.log.started = time.time()
            self._play()
            self._go_quiet()
            observation = self._observe()
            violations = check(observation)
            return observation, violations
        finally:
            # Each step on its own: a failure in one must not leave a process running.
            if self.monitor is not None:
                with contextlib.suppress(Exception):
                    self.monitor.stop()
            self._pool.shutdown(wait=False, cancel_futures=True)
            self.stack.close()
            if self.timeline is not None:
                self.timeline.close()

    @property
    def log(self) -> Timeline:
        assert self.timeline is not None
        return self.timeline

    def _play(self) -> None:
        if self.power.ask_failed_ambiguous:
            self._later_at(ASK_EVERY_S, "ask about failed ambiguous runs", self._ask_about_failed)
        for event in self.plan:
            self._wait_until(self.started + event.at)
            self._dispatch_event(event)
        self._wait_until(self.started + self.duration)

    def _wait_until(self, moment: float) -> None:
        """Sleep until ``moment``, running each follow-up (a resume, a release) when it is due.

        Never earlier: a follow-up's time is its fault's length (a freeze, a hold).
        """
        while (left := moment - time.time()) > 0:
            self._run_due(until=time.time())
            time.sleep(min(left, 0.05))
        self._run_due(until=time.time())

    def _later_at(self, delay: float, what: str, action: Callable[[], None]) -> None:
        heapq.heappush(self._later, (time.time() + delay, next(self._order), what, action))

    def _run_due(self, until: float) -> None:
        self._reap_dispatchers()
        while self._later and self._later[0][0] <= until:
            _, _, what, action = heapq.heappop(self._later)
            self._safely(what, action)

    def _safely(self, what: str, action: Callable[[], None]) -> None:
        try:
            action()
        except Exception as error:  # a fault that could not be applied is logged, not fatal
            self.log.add("campaign-error", action=what, error=f"{type(error).__name__}: {error}")

    def _background(self, what: str, action: Callable[[], None]) -> None:
        self._pending.append(self._pool.submit(self._safely, what, action))

    def _dispatch_event(self, event: Event) -> None:
        handler = getattr(self, "_on_" + event.kind.replace("-", "_"))
        self._safely(event.kind, lambda: handler(**event.params))

    # --- workload

    def _on_week(
        self, index: int, new_items: int, second_dispatcher: bool, dispatcher_fault: str | None
    ) -> None:
        added = [f"c{len(self.items) + n:04d}" for n in range(new_items)]
        self.items.extend(added)
        self.week_items = added
        self._write_items()
        self.weeks.append(week_id(index))
        self.log.add("week", week=week_id(index), new_items=added)
        now = (FIRST_MONDAY + timedelta(weeks=index)).isoformat()
        self._dispatcher(now, dispatcher_fault)
        if second_dispatcher:
            self._dispatcher(now, None, second=True)

    def _write_items(self) -> None:
        path = self.stack.items_path
        entries = [
            {"id": item, "title": item_title(item), "body": f"What changed in {item}. More."}
            for item in self.items
        ]
        scratch = path.with_suffix(".tmp")
        scratch.write_text(json.dumps(entries))
        os.replace(scratch, path)  # a select never reads half a file

    def _dispatcher(self, now: str, fault: str | None, second: bool = False) -> None:
        args = ["-m", "tests.chaos.dispatcher", now]
        env = {"CRASH": "dispatch:before-publish"} if fault == "crash" else None
        if fault == "stall":
            args.append("--stall")
        process = self.stack.helper(*args, env=env)
        self.dispatchers.append((process, now))
        self.log.add("dispatcher", now=now, fault=fault, second=second, pid=process.pid)
        if fault == "stall":
            # Frozen holding its claim past the next week's dispatch, then gone for good: only a
            # dispatch after it can publish the week.
            stall = self.power.week_seconds * 1.3
            self._later_at(stall, "kill stalled dispatcher", lambda: self._kill_group(process))

    def _reap_dispatchers(self) -> None:
        for process, now in list(self.dispatchers):
            if process.poll() is None:
                continue
            self.dispatchers.remove((process, now))
            out, err = process.communicate(timeout=5)
            if process.returncode == 0:
                self.published.update(out.split())
            last = (err.strip().splitlines() or [""])[-1] if process.returncode else ""
            self.log.add(
                "dispatched",
                now=now,
                pid=process.pid,
                exit=process.returncode,
                published=out.split(),
                error=last,
            )

    # --- faults

    def _worker_pid(self, worker: str, child: int) -> int | None:
        children = self.stack.workers[worker].children()
        return children[child % len(children)] if children else None

    def _on_kill_child(self, worker: str, child: int) -> None:
        pid = self._worker_pid(worker, child)
        if pid is None:
            self.log.add("skipped", fault="kill-child", why=f"worker {worker} has no children")
            return
        os.kill(pid, signal.SIGKILL)
        self.log.add("kill-child", target=f"{worker}/{pid}")

    def _on_stop_child(self, worker: str, child: int, seconds: float) -> None:
        pid = self._worker_pid(worker, child)
        if pid is None:
            self.log.add("skipped", fault="stop-child", why=f"worker {worker} has no children")
            return
        os.kill(pid, signal.SIGSTOP)
        self.log.add("stop-child", window=seconds, target=f"{worker}/{pid}", seconds=seconds)
        self._later_at(seconds, "resume child", lambda: self._signal(pid, signal.SIGCONT))

    def _signal(self, pid: int, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)

    def _kill_group(self, process: subprocess.Popen[Any]) -> None:
        if process.poll() is not None:
            return  # reaped: its pid may be another process's by now
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)

    def _on_kill_worker(self, worker: str, down: float) -> None:
        self._kill_group(self.stack.workers[worker].process)
        self.log.add("kill-worker", target=worker, down=down)
        self._later_at(
            down,
            "restart worker",
            lambda: self._background("restart worker", lambda: self._start_worker(worker)),
        )

    def _on_stop_worker(self, worker: str, seconds: float) -> None:
        group = self.stack.workers[worker].process.pid
        os.killpg(group, signal.SIGSTOP)
        self.log.add("stop-worker", window=seconds, target=worker, seconds=seconds)
        self._later_at(seconds, "resume worker", lambda: self._resume_group(group))

    def _resume_group(self, group: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGCONT)

    def _start_worker(
        self, name: str, clock_offset: str | None = None, mode: dict[str, str] | None = None
    ) -> None:
        if mode is None:
            modes = self.power.modes
            mode = modes[(self.starts[name] + 2 * (name == "b")) % len(modes)]
            self.starts[name] += 1
        # Worker b, where it can be, is another user's behind a hidepid /proc: a's processes
        # look absent to it while they live.
        hidden = name == "b" and hidden_workers_available()
        self.stack.start_worker(name, clock_offset=clock_offset, env=mode, hidden=hidden)
        self.log.add(
            "worker-start", target=name, mode=mode, clock_offset=clock_offset, hidden=hidden
        )

    def _on_kill_beat(self, down: float) -> None:
        if self.stack.beat is not None:
            self._kill_group(self.stack.beat)
        self.log.add("kill-beat", down=down)
        self._later_at(down, "restart beat", self._restart_beat)

    def _restart_beat(self) -> None:
        self.stack.start_beat()
        self.log.add("beat-start")

    def _on_kill_valkey(self, down: float) -> None:
        if not self._valkey_up():
            # Its restart is already due: a second one would start a second server on the same
            # socket and AOF, the first still serving the clients that reached it.
            self.log.add("skipped", fault="kill-valkey", why="valkey is already down")
            return
        self.stack.valkey.kill()
        self.log.add("kill-valkey", window=down, down=down)
        self._later_at(
            down, "restart valkey", lambda: self._background("restart valkey", self._restart_valkey)
        )

    def _valkey_up(self) -> bool:
        process = self.stack.valkey.process
        return process is not None and process.poll() is None

    def _restart_valkey(self) -> None:
        with self._valkey_lock:  # one server at a time, whichever thread restarts it
            if self._valkey_up():
                return
            self.stack.valkey.start()
        self.log.add("valkey-start")

    def _on_smtp_hold(self, phase: str, seconds: float) -> None:
        reached, release = self.stack.inbox.hold(phase)
        self.log.add("smtp-hold", phase=phase, seconds=seconds)
        self._later_at(seconds, "release smtp", release.set)
        self._when(reached, seconds, "a send held at " + phase, lambda: self._at_held_send(phase))

    def _when(
        self, event: threading.Event, within: float, what: str, act: Callable[[], None]
    ) -> None:
        """Run ``act`` from the loop as soon as ``event`` is set, if it is within ``within``."""
        deadline = time.time() + within

        def poll() -> None:
            if event.is_set():
                act()
            elif time.time() < deadline:
                self._later_at(POLL_S, what, poll)

        self._later_at(POLL_S, what, poll)

    def _at_held_send(self, phase: str) -> None:
        """A send is held: deliver its run again, an operator cancels it, and its sender is
        frozen before the marker."""
        sending = self._sending()
        self._duplicate_senders()
        for run_id in sending:  # refused (exit 2) while its email may be out
            self._background("operator cancel", functools.partial(self._cancel_sending, run_id))
        if phase != "DATA":  # before the marker: frozen there, the sender must not send late
            self._freeze_senders()

    def _sending(self) -> list[str]:
        """The runs whose send is claimed now."""
        assert self.monitor is not None and self.runtime is not None
        return [
            run_id
            for run_id in self.monitor.run_ids()
            if self.runtime.journal.effect_states(self.runtime.journal.keys(WORKFLOW, run_id)).get(
                "send"
            )
            in ("claimed", "confirmed")
        ]

    def _cancel_sending(self, run_id: str) -> None:
        self._command("cancel", run_id, aimed=True, why="its send is held")

    def _freeze_senders(self) -> None:
        """SIGSTOP each process holding a send claim past its lease, then let it go on."""
        assert self.monitor is not None and self.runtime is not None
        for run_id in self.monitor.run_ids():
            keys = self.runtime.journal.keys(WORKFLOW, run_id)
            if self.runtime.journal.effect_states(keys).get("send") not in ("claimed", "confirmed"):
                continue
            raw = self.runtime.client.hget(keys.effects, "send:process")
            pid = int(json.loads(raw)["pid"]) if raw else 0
            if not any(pid in worker.children() for worker in self.stack.workers.values()):
                continue  # not a pool process of ours (a CLI run, or gone and its pid reused)
            self._signal(pid, signal.SIGSTOP)
            self.log.add("freeze-sender", window=FREEZE_S, target=f"{run_id}/{pid}")
            thaw = functools.partial(self._signal, pid, signal.SIGCONT)
            self._later_at(FREEZE_S, "thaw the sender", thaw)

    def _duplicate_senders(self) -> None:
        """Deliver again every run whose send is under way: the worst moment for a duplicate."""
        assert self.monitor is not None and self.runtime is not None
        for run_id in self.monitor.run_ids():
            keys = self.runtime.journal.keys(WORKFLOW, run_id)
            if self.runtime.journal.effect_states(keys).get("send") in ("claimed", "confirmed"):
                self._deliver_twice(run_id)

    def _on_smtp_slow(self, per_reply: float, seconds: float) -> None:
        self.stack.inbox.slow = per_reply
        self.log.add("smtp-slow", per_reply=per_reply, seconds=seconds)
        self._later_at(seconds, "smtp fast", lambda: setattr(self.stack.inbox, "slow", 0.0))

    def _on_smtp_drop(self) -> None:
        self.stack.inbox.drop_after_marker = True
        self.log.add("smtp-drop")

    def _on_api_latency(self, delay: float, seconds: float) -> None:
        self.stack.api.delay = delay
        self.log.add("api-latency", delay=delay, seconds=seconds)
        self._later_at(seconds, "api fast", lambda: setattr(self.stack.api, "delay", 0.0))

    def _on_api_429(self, times: int) -> None:
        self.stack.api.fail_next(429, times=times, headers={"retry-after": "1"})
        self.log.add("api-429", times=times)

    def _on_api_529(self, times: int) -> None:
        self.stack.api.fail_next(529, times=times)
        self.log.add("api-529", times=times)

    def _on_api_500(self, times: int) -> None:
        self.stack.api.fail_next(500, times=times)
        self.log.add("api-500", times=times)

    def _on_api_hold(self, seconds: float) -> None:
        self.stack.api.hold()
        self.log.add("api-hold", window=seconds, seconds=seconds)
        self._later_at(seconds, "api release", self.stack.api.release)

    def _on_api_outage(self, seconds: float) -> None:
        """The model API down for every call (529) for longer than a week, then back."""
        self.stack.api.fail_always(529)
        self.log.add("api-outage", window=seconds, seconds=seconds)
        self._later_at(seconds, "api back", self.stack.api.clear_faults)

    def _on_api_credit(self, seconds: float) -> None:
        self.stack.api.fail_always(400, message=CREDIT_TOO_LOW)
        self.log.add("api-credit", window=seconds, seconds=seconds)
        self._later_at(seconds, "api credit back", self.stack.api.clear_faults)

    def _on_api_slow_item(self, pick: float, seconds: float) -> None:
        """One item of the week just dispatched answers slowly; the rest are answered.

        Not its last item: the items after the slow one are the ones a map that records in
        item order would hold back. Once its call is in flight and the others have had time
        to answer, every pool child is killed: only what was recorded survives.
        """
        if len(self.week_items) < 2:
            self.log.add("skipped", fault="api-slow-item", why="the week has under 2 items")
            return
        item = self.week_items[int(pick * (len(self.week_items) - 1))]
        title = f'"{item_title(item)}"'
        self.stack.api.delay_when(title, seconds)
        self.log.add("api-slow-item", item=item, seconds=seconds)
        self._later_at(seconds * 3, "api item fast", functools.partial(self._fast_again, title))
        deadline = time.time() + seconds * 2
        alone_since: list[float] = []
        self._slow_titles.add(title)

        def watch() -> None:
            if self.quiet or time.time() > deadline:
                self.log.add("skipped", fault="api-slow-item", why=f"no call of {item} in time")
                return
            if not self._slow_call_started(title):
                self._later_at(POLL_S, "watch the slow call", watch)
                return
            if not self.stack.api.in_flight(title):
                self.log.add("skipped", fault="api-slow-item", why="answered before the kill")
                return
            others = [
                text
                for text in self.stack.api.in_flight_texts()
                if not any(slow in text for slow in self._slow_titles)
            ]
            if others:
                alone_since.clear()  # the other items' calls are still being answered
            elif not alone_since:
                alone_since.append(time.time())
            elif time.time() - alone_since[0] >= SLOW_ALONE_S:
                self._kill_every_child("api-slow-item")
                return
            self._later_at(POLL_S, "watch the slow call", watch)

        self._later_at(POLL_S, "watch the slow call", watch)

    def _fast_again(self, title: str) -> None:
        self.stack.api.stop_delaying(title)
        self._slow_titles.discard(title)

    def _slow_call_started(self, title: str) -> bool:
        return any(title in request.text for request in self.stack.api.requests)

    def _on_probe_kill(self) -> None:
        """The limiter's learned limits lapse (an idle hour), and the probing call's worker dies.

        Until a call teaches the limits, one call at a time may ask (the probe): the call that
        holds it is kept open at the API, and once it has arrived every pool child is killed
        under it (the API is let go after ``PROBE_WAIT_S`` if no call comes).
        """
        client = self.stack.valkey.client()
        try:
            lapsed = [key for key in client.scan_iter(match="*:limits") if b"model-api" in key]
            self.stack.api.hold()
            if lapsed:
                client.delete(*lapsed)
        finally:
            client.close()
        self.log.add("probe-kill", window=PROBE_WAIT_S, lapsed=len(lapsed))
        deadline = time.time() + PROBE_WAIT_S

        def watch() -> None:
            if self.stack.api.in_flight("<update"):
                self._kill_every_child("probe-kill")
                self.stack.api.release()
            elif time.time() < deadline:
                self._later_at(POLL_S, "watch for the probe", watch)
            else:
                self.stack.api.release()

        self._later_at(POLL_S, "watch for the probe", watch)

    def _kill_every_child(self, why: str) -> None:
        burst = next(self._bursts)
        for name, worker in self.stack.workers.items():
            for pid in worker.children():
                self._signal(pid, signal.SIGKILL)
                self.log.add("kill-child", target=f"{name}/{pid}", why=why, burst=burst)

    # --- batches

    def _on_batch_create_kill(self) -> None:
        """A batch reaches the API and its answer never reaches the run: every child dies.

        The API creates the next batch and holds its answer; once it exists, every pool child
        is killed, then the answer is let go (to nobody). The run's next holder must find the
        batch it made, not pay for a second one.
        """
        before = len(self.stack.api.batches)
        self.stack.api.hold_batch_creates()
        self.log.add("batch-create-kill", batches=before)
        deadline = time.time() + BATCH_WAIT_S

        def watch() -> None:
            if len(self.stack.api.batches) > before:
                self._kill_every_child("batch-create-kill")
                self.stack.api.release_batch_creates()
            elif time.time() < deadline and not self.quiet:
                self._later_at(POLL_S, "watch for a batch", watch)
            else:
                self.stack.api.release_batch_creates()
                self.log.add("skipped", fault="batch-create-kill", why="no batch was created")

        self._later_at(POLL_S, "watch for a batch", watch)

    def _on_batch_results_kill(self, pick: float) -> None:
        """A batch run dies between two of its results: after one item's, before the next's.

        Both workers are started again in batch mode with ``CRASH=after:summarize:<item>``, an
        item of the next week that is not its last: the pool child that records that item's
        result ends right after it, the later ones unrecorded. The next holder records them
        from the same batch's results, paying for nothing again. Armed for ``ARMED_WEEKS``
        weeks, then each worker is started again without it.
        """
        upcoming = [e for e in self.plan if e.kind == "week" and e.at > time.time() - self.started]
        count = int(upcoming[0].params["new_items"]) if upcoming else 0
        if count < 2:
            self.log.add("skipped", fault="batch-results-kill", why="no next week of 2 items")
            return
        item = f"c{len(self.items) + int(pick * (count - 1)):04d}"
        point = f"after:summarize:{item}"
        self.log.add("batch-results-kill", point=point)
        armed_for = ARMED_WEEKS * self.power.week_seconds
        for name in sorted(self.stack.workers):
            arm = functools.partial(self._arm_crash, name, point, armed_for)
            self._background(f"arm a crash on {name}", arm)

    def _arm_crash(self, name: str, point: str, seconds: float) -> None:
        """Worker ``name`` with ``CRASH=point`` for ``seconds``; its crash logged as seen."""
        self._kill_group(self.stack.workers[name].process)
        self.log.add("kill-worker", target=name, why=f"armed with {point}")
        self._start_worker(name, mode={"DIGEST_BATCH": "1", "CRASH": point})
        worker = self.stack.workers[name]
        offset = worker.log.stat().st_size
        until = time.time() + seconds
        last = time.time()
        while time.time() < until and not self.quiet and self.stack.workers[name] is worker:
            with worker.log.open("rb") as log:
                log.seek(offset)
                said = log.read()
            if CRASH_LINE + point.encode() in said:
                # It died between the last look and this one: that is the fault's window.
                self.log.add(
                    "batch-results-crash", window=0.0, since=last, target=name, point=point
                )
                break
            last = time.time()
            time.sleep(POLL_S)
        current = self.stack.workers[name] is worker
        self._kill_group(worker.process)  # never left running armed, replaced or not
        self.log.add("kill-worker", target=name, why=f"disarmed of {point}")
        if current:
            self._start_worker(name)

    def _on_batch_deadline_kill(self) -> None:
        """A batch outlives its deadline and the run dies asking its items synchronously.

        The next batch created processes far longer than DIGEST_BATCH_DEADLINE; once the run
        has cancelled it at its deadline, the API holds the synchronous calls that follow,
        and every pool child is killed under the first one.
        """
        api = self.stack.api
        before = len(api.batches)
        self.log.add("batch-deadline-kill", slow=SLOW_BATCH_S)
        deadline = time.time() + BATCH_WAIT_S * 2
        slowed: list[str] = []
        held: list[float] = []

        def done(why: str | None) -> None:
            if held:  # the API held the calls meanwhile: a fault of its own
                api.release()
                self.log.add("api-hold", window=0.0, since=held[0], why="batch-deadline-kill")
            if why is not None:
                self.log.add("skipped", fault="batch-deadline-kill", why=why)

        def watch() -> None:
            if self.quiet or time.time() > deadline:
                done("no batch reached its deadline and fell back")
                return
            batches = api.batches
            if not slowed:
                if len(batches) > before:
                    batches[before].processing = SLOW_BATCH_S
                    slowed.append(batches[before].id)
            elif not held:
                if any(b.id == slowed[0] and b.cancel_at is not None for b in batches):
                    api.hold()
                    held.append(time.time())
            elif api.in_flight("<update"):
                self._kill_every_child("batch-deadline-kill")
                done(None)
                return
            self._later_at(POLL_S, "watch the deadline", watch)

        self._later_at(POLL_S, "watch the deadline", watch)

    def _on_duplicate(self, pick: float) -> None:
        """Deliver a run twice: one a worker runs now where there is one (the worst moment)."""
        if not self.weeks:
            self.log.add("skipped", fault="duplicate", why="no week yet")
            return
        try:
            running = [
                week for week in self.weeks[-4:] if self._status(week) in ("running", "retrying")
            ]
        except (redis.RedisError, OSError):
            running = []  # Valkey is down (a fault): any published week will do
        # Only a week some dispatcher published can be delivered twice: delivering one never
        # published would start its run, and hide a dispatcher that lost the week.
        pool = running or [week for week in self.weeks if week in self.published]
        if not pool:
            self.log.add("skipped", fault="duplicate", why="no week published yet")
            return
        self._deliver_twice(pool[int(pick * len(pool))])

    def _deliver_twice(self, run_id: str) -> None:
        code = "import sys\nfrom tasks import digest\nfor _ in range(2): digest.delay(sys.argv[1])"
        self.stack.helper("-c", code, run_id)
        self.log.add("duplicate", target=run_id)

    def _on_clock_skew(self, offset: float) -> None:
        if not faketime_available():
            self.log.add("skipped", fault="clock-skew", why="faketime is not on PATH")
            return
        self._kill_group(self.stack.workers["b"].process)
        self.log.add("clock-skew", target="b", offset=offset)
        self._background(
            "restart skewed worker", lambda: self._start_worker("b", clock_offset=f"{offset:+}")
        )

    # --- operators

    def _on_operator(self, verb: str, pick: float) -> None:
        self._background(f"operator {verb}", lambda: self._operate(verb, pick))

    def _operate(self, verb: str, pick: float) -> None:
        candidates = self._candidates(verb)
        pool = candidates or list(self.weeks)
        if not pool:
            self.log.add("skipped", fault=f"operator {verb}", why="no run yet")
            return
        run_id = pool[int(pick * len(pool))]
        if verb == "mark-sent" and not self._in_mailbox(run_id):
            verb = "resend"  # the operator checked the mailbox: it did not arrive
        self._command(verb, run_id, aimed=bool(candidates))

    def _ask_about_failed(self) -> None:
        """Aim the focus's verbs at each run that has failed with its send ambiguous, once."""
        assert self.runtime is not None and self.monitor is not None
        if self.quiet:
            return
        journal = self.runtime.journal
        for run_id in self.monitor.run_ids():
            keys = journal.keys(WORKFLOW, run_id)
            if run_id in self._asked or journal.effect_states(keys).get("send") != "ambiguous":
                continue
            if journal.meta(keys).get("status") != "failed":
                continue
            self._asked.add(run_id)
            for verb in self.power.ask_failed_ambiguous:
                why = "it failed with its send ambiguous"
                command = functools.partial(self._command, verb, run_id, True, why)
                self._background(f"operator {verb}", command)
        self._later_at(ASK_EVERY_S, "ask about failed ambiguous runs", self._ask_about_failed)

    def _command(self, verb: str, run_id: str, aimed: bool, why: str | None = None) -> None:
        """One operator command, logged before and after with what it said."""
        args = {"fork": ["--from", "compose"], "reject": ["--reason", "chaos operator"]}
        detail = {"why": why} if why else {}
        entry = self.log.add(
            "operator-cancel" if verb == "cancel" else "operator",
            window=2.0 if verb == "cancel" else None,
            verb=verb,
            target=run_id,
            aimed=aimed,
            **detail,
        )
        done = self.stack.deployment.cli(verb, run_id, *args.get(verb, []), timeout=60)
        said = (done.stdout.strip() or done.stderr.strip()).splitlines()
        if verb == "resend" and done.returncode == 0:
            self.resent.add(run_id)
        self.log.add(
            "operator-done",
            verb=verb,
            target=run_id,
            exit=done.returncode,
            said=said[-1][:300] if said else "",
            started=entry["t"],
        )

    def _in_mailbox(self, run_id: str) -> bool:
        return any(f"({run_id})" in str(m["Subject"]) for m in self.stack.messages())

    def _candidates(self, verb: str) -> list[str]:
        """The runs a real operator would aim ``verb`` at now, by what the journal shows."""
        assert self.runtime is not None and self.monitor is not None
        chosen = []
        for run_id in self.monitor.run_ids():
            view = inspect_run(self.runtime.journal, WORKFLOW, run_id)
            status, send = view.status, view.effects.get("send", "")
            approval = view.wait is not None and view.wait.signal == "approval"
            wanted = {
                "approve": approval and status == "waiting",
                "reject": approval and status == "waiting",
                "resend": send == "ambiguous",
                "mark-sent": send == "ambiguous",
                "retry": status in ("failed", "retrying"),
                "release": status in ("failed", "retrying") or send == "ambiguous",
                "cancel": status in ("running", "waiting", "retrying", "failed"),
                "fork": status == "done" and send == "done" and "-fork" not in run_id,
            }[verb]
            if wanted:
                chosen.append(run_id)
        return chosen

    # --- quiet, then the final look

    def _go_quiet(self) -> None:
        self.quiet = True
        self.log.add("quiet", why="faults stopped: every process resumed, every fake normal")
        for future in self._pending:
            with contextlib.suppress(Exception):
                future.result(timeout=90)
        while self._later:
            _, _, what, action = heapq.heappop(self._later)
            self._safely(what, action)
        for future in self._pending:
            with contextlib.suppress(Exception):
                future.result(timeout=90)
        self.stack.resume_everything()
        self.stack.api.batch_processing_time = 1.0
        self._revive()
        self._settle()
        index = len(self.weeks)
        self._on_week(index, 0, False, None)
        self._settle()
        deadline = time.time() + 30
        while self.dispatchers and time.time() < deadline:
            self._reap_dispatchers()
            time.sleep(0.1)

    def _revive(self) -> None:
        """Start whatever the faults left dead: Valkey, either worker, beat."""
        if not self._valkey_up():
            self._restart_valkey()
        for name, worker in list(self.stack.workers.items()):
            if worker.process.poll() is not None:
                self._start_worker(name)
        if self.stack.beat is None or self.stack.beat.poll() is not None:
            self._restart_beat()

    def _settle(self) -> None:
        """Wait (bounded) until every run has ended, failed, or waits for a person."""
        assert self.runtime is not None and self.monitor is not None
        deadline = time.time() + self.settle_timeout
        grace = time.time() + NEW_WEEK_GRACE_S
        calm = 0
        while time.time() < deadline:
            self._reap_dispatchers()
            try:
                busy = [run_id for run_id in self.monitor.run_ids() if not self._settled(run_id)]
                if time.time() < grace:  # a published week starts within seconds
                    busy += [week for week in self.weeks if self._status(week) == "new"]
            except Exception as error:
                busy = [f"store: {error}"]
            calm = calm + 1 if not busy and not self.dispatchers else 0
            if calm >= 3:
                self.log.add("settled")
                return
            time.sleep(0.5)
        self.log.add("settle-timeout", busy=busy)

    def _status(self, run_id: str) -> str:
        assert self.runtime is not None
        return inspect_run(self.runtime.journal, WORKFLOW, run_id).status

    def _settled(self, run_id: str) -> bool:
        assert self.runtime is not None
        view = inspect_run(self.runtime.journal, WORKFLOW, run_id)
        if view.status in SETTLED:
            return True
        person = view.wait is not None and view.wait.signal == "approval"
        return view.status == "waiting" and (person or view.effects.get("send") == "ambiguous")

    def _observe(self) -> Observation:
        assert self.runtime is not None and self.monitor is not None
        listing = self.stack.deployment.cli("runs", "--limit", "500", timeout=60)
        listed = {
            line.split()[0].partition(":")[2]
            for line in listing.stdout.splitlines()
            if line.startswith(f"{WORKFLOW}:")
        }
        self.monitor.stop()
        self.monitor.sample()
        observation = observe(
            self.stack,
            self.runtime,
            self.monitor,
            items=list(self.items),
            weeks=list(self.weeks),
            listed=listed,
            faults=self.log.faults(),
            resent=set(self.resent),
            copies_allowed=self.stack.env.get("DIGEST_AMBIGUOUS_SEND") == "resend",
        )
        (self.directory / "observation.json").write_text(
            json.dumps(observation.to_json(), indent=1, default=str)
        )
        return observation
