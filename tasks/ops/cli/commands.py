"""Each ``digest`` command: run, enqueue, inspect, act on and serve digests from a shell.

Each takes the settings, the run id (this week's when none is given) and its arguments, and
answers an exit status (``tasks.ops.cli.parser``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from journal import Wait, validate_run_id
from journal.batch import is_batch_look
from journal.errors import (
    RunParked,
)
from journal.logs import redact
from journal.ops.views import Cursor, Prefetch, RunView, inspect_run, list_runs
from tasks.config import Config
from tasks.config.variables import parse_duration
from tasks.errors import BadInput
from tasks.job.claims import holdings
from tasks.job.names import APPROVAL, WORKFLOW
from tasks.job.report import answered_by, batch_lines, decide_send, utc
from tasks.llm.cost import dollars, usage_of
from tasks.ops.cli.parser import EXIT_FAILED, EXIT_OK
from tasks.ops.cli.render import (
    fate,
    outcome_line,
    printable,
    render_view,
    result_lines,
    verdict_line,
    view_json,
)
from tasks.runtime import Runtime, Store, keyspace, use_runtime

if TYPE_CHECKING:  # running a digest's: what reads or acts on runs imports none of it
    from journal import Journal, StepEvent
    from tasks.job.workflow import DigestOptions
    from tasks.llm.client import OfflineSummarizer


def _known(store: Store, run_id: str) -> RunView:
    """The run, which must have started: acting on or showing a run never begun is a typo.

    Raises:
        BadInput: the journal has no such run.
    """
    view = inspect_run(store.journal, WORKFLOW, run_id)
    if not view.meta:
        raise BadInput(
            f"no run {view.run} in the journal: it never started; `digest runs` lists the "
            f"runs, `digest run {run_id}` starts it"
        )
    return view


def _step_printer(offline: OfflineSummarizer | None) -> Callable[[StepEvent], None]:
    """Print each step as the tutorial does (the workflow fires its crash point after).

    Offline, the note says so once, before the first step that made a summary: steps are
    reported in order, so it lands on the same line at any concurrency.
    """
    noted = offline is None

    def print_step(event: StepEvent) -> None:
        nonlocal noted
        if not noted and not event.replayed and offline is not None and offline.used:
            print("  (no ANTHROPIC_API_KEY: using the offline summarizer)", file=sys.stderr)
            noted = True
        print(f"{'  replayed' if event.replayed else '  ran     '} {event.key}", flush=True)

    return print_step


def cmd_run(config: Config, run_id: str, args: argparse.Namespace) -> int:
    """Run (or resume) one digest here, printing each step as it runs or replays."""
    # Imported here: the workflow, its steps and the model's client are running's alone.
    from journal.ops.actions import retry as retry_run
    from tasks.job.workflow import digest, preview
    from tasks.llm.client import OfflineSummarizer

    # A dry run is a workflow of its own, in a scratch journal: a worker never runs a preview.
    workflow = preview if args.dry_run else digest
    # Read with the start-up checks; a retry writes first, so its run is read after.
    prefetch = None if args.retry else Prefetch(keyspace(config).run(workflow.name, run_id))
    runtime = Runtime.build(config, allow_offline=True, prefetch=prefetch)
    use_runtime(runtime)  # the workflow's runtime in this process: offline allowed
    journal = runtime.journal
    offline = runtime.summarizer if isinstance(runtime.summarizer, OfflineSummarizer) else None
    if args.retry:  # only a failed run: any other is refused, and nothing is written
        retry_run(journal, WORKFLOW, run_id)
        print(f"  reset {WORKFLOW}:{run_id}: its next start is a deliberate retry", file=sys.stderr)
    view = inspect_run(journal, workflow.name, run_id, prefetched=prefetch)
    options = _run_options(config, args, view, offline)
    try:
        outcome = workflow.start(run_id, options, on_step=_step_printer(offline))
    except RunParked as parked:
        print(f"failed: {parked}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        if args.dry_run:
            journal.delete(preview.name, run_id)
    if outcome.status == "cancelled":
        print(f"cancelled: {outcome.run} was cancelled; nothing more runs or is sent")
    elif outcome.status == "already-done":
        earlier = outcome_line({"status": "done", "outcome": json.dumps(outcome.result)})
        print(f"already-done: ended earlier ({earlier}); nothing ran in this attempt")
    elif outcome.status == "waiting":
        assert outcome.wait is not None
        print(_waiting_line(journal, workflow.name, run_id, outcome.wait))
    else:
        print(result_lines(outcome.result))
    return EXIT_OK


def _run_options(
    config: Config, args: argparse.Namespace, view: RunView, offline: OfflineSummarizer | None
) -> DigestOptions:
    """What ``digest run`` gives the run, its input checked first.

    Bad input is refused before any write; a URL is fetched once, by ``select`` itself. What a
    worker would freeze (the workflow's defaults), the recipient and the gate, is read now, at
    the first start, and a later change of the environment changes nothing.

    Raises:
        BadInput: the items cannot be read, or ``--batch`` has no API key to batch with.
    """
    from tasks.job.feeds import is_url
    from tasks.job.items import load_items
    from tasks.job.workflow import DigestOptions

    source = args.items or config.items_path
    unstarted = view.step("select") is None and view.status not in ("done", "cancelled")
    if unstarted and not is_url(source):
        load_items(source)
    if args.batch and offline is not None and unstarted:
        raise BadInput(
            "--batch needs ANTHROPIC_API_KEY: the offline summarizer has no batches (and costs "
            "nothing); set the key, or run without --batch"
        )
    return DigestOptions(
        to=args.to or config.recipient,
        items=args.items,
        approval=True if args.approval else config.approval,
        # Offline, DIGEST_BATCH has nothing to batch: such a run asks synchronously, for free.
        # Frozen only when true: a run that leaves it out asks synchronously, as ever.
        batch=True if (args.batch or config.batch) and offline is None else None,
    )


def _waiting_line(journal: Journal, workflow: str, run_id: str, wait: Wait) -> str:
    """What a run that stopped to wait waits for, and the way on."""
    if wait.kind == "decision":
        return printable(
            f"waiting: the email may have been sent ({redact(wait.reason)}); {decide_send(run_id)}"
        )
    until = utc(wait.until) if wait.until else "no time limit"
    if is_batch_look(wait.step):
        seen = inspect_run(journal, workflow, run_id)
        shown = batch_lines(seen.steps, seen.wait, seen.effects)
        return printable(
            f"waiting: batch {shown[-1] if shown else '?'}; run `digest run {run_id}` "
            "again then, or let a worker and beat resume it"
        )
    if wait.signal == APPROVAL:
        return (
            f"waiting: {wait.kind} {wait.signal or wait.step} (until {until}); "
            f"`digest approve {run_id}` or `digest reject {run_id} --reason ...`"
        )
    return (
        f"waiting: {wait.kind} at {wait.step} until {until}; "
        f"run `digest run {run_id}` again then, or let a worker and beat resume it"
    )


def cmd_enqueue(config: Config, run_id: str, args: argparse.Namespace) -> int:
    """Hand the run to the workers; a duplicate enqueue is harmless (the lease and journal)."""
    from tasks.worker.app import digest as task

    result = task.delay(run_id)
    print(f"enqueued {WORKFLOW}:{run_id} as task {result.id}; `celery -A tasks worker` runs it")
    return EXIT_OK


def cmd_show(config: Config, run_id: str, args: argparse.Namespace) -> int:
    """Print what the journal knows about a run."""
    store = Store.open(config)
    view = _known(store, run_id)
    held = holdings(store).get(view.run, 0)
    limits = store.limit_states()
    # Masked again here: a journal written before masking, or by other code, may hold a secret.
    if args.json:
        shown = view_json(view) | {
            "holds": held,
            "model_limits": {s.model: s.to_json() for s in limits},
        }
        print(redact(json.dumps(shown, indent=2, sort_keys=True)))
    else:
        text = render_view(view, held, limits, every_step=args.all)
        print(printable(redact(text), newlines=True))
    return EXIT_OK


def cmd_runs(config: Config, run_id: str, args: argparse.Namespace) -> int:
    """List recent runs with their state, newest first."""
    try:
        before = Cursor.parse(args.before) if args.before else None
    except ValueError as bad:
        raise BadInput(f"--before: {bad}; give the cursor a full page ended with") from None
    store = Store.open(config)
    held = holdings(store)
    # One row more than the page, to say whether another page follows.
    rows = list_runs(
        store.journal, state=args.status, steps=True, limit=args.limit + 1, before=before
    )
    for row in rows[: args.limit]:
        usage = usage_of(record.result for record in row.steps)
        line = (
            f"{row.run:32} {row.state:10} updated {utc(row.updated_ms / 1000)}  "
            f"{usage.calls} calls {dollars(usage.cost_usd)}"
        )
        flags = [
            fate(row.meta) or outcome_line(row.meta),
            answered_by(row.steps),
            _holds(held.get(row.run, 0)),
        ]
        if row.state not in ("done", "cancelled", "failed"):
            wait = Wait.from_meta(row.run, row.meta["wait"]) if row.meta.get("wait") else None
            flags += [f"batch {line}" for line in batch_lines(row.steps, wait)]
        print(printable("  ".join([line, *(flag for flag in flags if flag)])))
    if len(rows) > args.limit:
        status = f" --status {args.status}" if args.status else ""
        print(
            f"more runs: digest runs{status} --limit {args.limit} "
            f"--before {rows[args.limit - 1].cursor}",
            file=sys.stderr,
        )
    return EXIT_OK


def _holds(count: int) -> str:
    """A run's claims, flagged in `digest runs`: items no other run will send meanwhile."""
    return f"holds {count} items" if count else ""


def cmd_act(config: Config, run_id: str, args: argparse.Namespace) -> int:
    """Take the operator action ``args.command`` names on the run and print its answer.

    The action itself (``tasks.ops.actions``) refuses what it must, as the console's does.
    Imported here: the actions bring the journal's controls and the model's batches, which
    reading a run never needs.
    """
    from tasks.ops import actions

    runtime = Runtime.build(config, allow_offline=True)
    act: dict[str, Callable[[], actions.Answer]] = {
        "approve": lambda: actions.decide(runtime, run_id, {"approved": True}),
        "reject": lambda: actions.decide(
            runtime, run_id, {"approved": False, "reason": args.reason}
        ),
        "cancel": lambda: actions.cancel(runtime, run_id, args.reason),
        "retry": lambda: actions.retry(runtime, run_id),
        "release": lambda: actions.release(runtime, run_id),
        "mark-sent": lambda: actions.mark_sent(runtime, run_id),
        "resend": lambda: actions.resend(runtime, run_id),
    }
    print(act[args.command]().line)
    return EXIT_OK


def cmd_fork(config: Config, run_id: str, args: argparse.Namespace) -> int:
    """Fork a run from one of its steps and hand the fork to the workers."""
    from tasks.ops import actions

    runtime = Runtime.build(config, allow_offline=True)
    if args.dry_run:
        return fork_dry_run(runtime, run_id, args.step)
    print(actions.fork(runtime, run_id, args.step, args.new_run_id).line)
    return EXIT_OK


def fork_dry_run(runtime: Runtime, run_id: str, step: str) -> int:
    """Print the email a fork from ``step`` would send, as a diff against the run's own."""
    from tasks.ops.fork_preview import email_text, preview_fork

    use_runtime(runtime)  # the fork's steps run with this runtime, in memory
    fork = preview_fork(runtime, run_id, step)
    if fork.original is None:
        fresh = f"(the run composed no email; the fork's:)\n\n{email_text(fork.forked)}"
        print(printable(redact(fresh), newlines=True))
    else:
        print(printable(redact(fork.diff() or "(the same email)\n"), newlines=True), end="")
    ran = ", ".join(fork.ran) or "nothing"
    print(
        f"dry run: a fork of {fork.run} from {step} would run {ran} ({fork.model_calls} model "
        f"calls made now, {dollars(fork.cost_usd)}); nothing was written, sent or charged"
    )
    return EXIT_OK


def cmd_export(config: Config, run_id: str, args: argparse.Namespace) -> int:
    """Write a run's journal as a fixture (``journal.testing.fixture``), to a file or stdout."""
    from journal.testing.fixture import export

    runtime = Runtime.build(config, allow_offline=True)
    document = export(runtime.journal, WORKFLOW, run_id)
    if args.output is None:
        sys.stdout.write(document.dumps())
        return EXIT_OK
    try:
        document.write(args.output)
    except OSError as exc:
        raise BadInput(f"cannot write {args.output}: {exc.strerror}; choose another -o") from None
    print(f"exported {document.run}: {len(document.steps)} steps to {args.output}")
    return EXIT_OK


def cmd_check_replay(config: Config, run_id: str, args: argparse.Namespace) -> int:
    """Replay runs that have not ended against the installed code; exit 1 if any would break."""
    for given in args.runs:  # refused before anything is read
        validate_run_id(given)
    runtime = Runtime.build(config, allow_offline=True)
    use_runtime(runtime)  # the workflow's runtime: its replayed steps never call it
    # Imported here: the replay machinery is for this command alone.
    from journal.testing.preflight import check_runs, unended_runs
    from tasks.job.workflow import digest

    verdicts = check_runs(
        runtime.journal, digest, args.runs or unended_runs(runtime.journal, WORKFLOW)
    )
    for verdict in verdicts:
        print(printable(redact(verdict_line(verdict))))
    broken = sum(not verdict.clean for verdict in verdicts)
    print(f"{len(verdicts)} runs replayed, {broken} would break")
    return EXIT_FAILED if broken else EXIT_OK


def cmd_purge(config: Config, run_id: str, args: argparse.Namespace) -> int:
    """Remove ended runs older than ``--older-than`` (``DIGEST_RUN_RETENTION``, for beat)."""
    from journal.ops.actions import purge as purge_runs

    older_than = parse_duration("--older-than", args.older_than)
    runtime = Runtime.build(config, allow_offline=True)
    purged = purge_runs(runtime.journal, older_than, dry_run=args.dry_run)
    verb = "would purge" if args.dry_run else "purged"
    for run in purged:
        print(printable(f"{verb} {run.run} ({run.status})"))
    runs = f"{len(purged)} run{'' if len(purged) == 1 else 's'}"
    print(f"{verb} {runs}; nothing deleted (--dry-run)" if args.dry_run else f"{verb} {runs}")
    return EXIT_OK


def cmd_console(config: Config, run_id: str, args: argparse.Namespace) -> int:
    """Serve the web console until interrupted; the web stack is imported only here."""
    from tasks.ops import console

    token = console.check_binding(args.host)
    names = console.Names.bound(args.host, args.port, os.environ.get("DIGEST_CONSOLE_ORIGIN"))
    runtime = Runtime.build(config, allow_offline=True)
    console.serve(runtime, args.host, args.port, names, token)
    return EXIT_OK


def cmd_metrics(config: Config, run_id: str, args: argparse.Namespace) -> int:
    """Export the gauges read from Redis, once for the deployment, until interrupted.

    Workers export their own counters; these gauges are the store's, so one process serves
    them (this, or the console's ``/metrics``) rather than every worker repeating them.
    """
    from prometheus_client import start_http_server

    from tasks.worker import metrics

    runtime = Runtime.build(config, allow_offline=True)
    try:
        server, thread = start_http_server(
            args.port,
            addr=args.host,
            registry=metrics.store_registry(
                lambda: runtime.journal, config.max_cost_usd, runtime.limit_states
            ),
        )
    except OSError as busy:
        where = f"{args.host}:{args.port}"
        raise BadInput(f"cannot serve metrics on {where}: {busy.strerror}; use --port") from None
    print(f"metrics on http://{args.host}:{args.port}/metrics (Ctrl-C stops)", flush=True)
    try:
        thread.join()
    except KeyboardInterrupt:
        server.shutdown()
    return EXIT_OK


Command = Callable[[Config, str, argparse.Namespace], int]

COMMANDS: dict[str, Command] = {
    "metrics": cmd_metrics,
    "console": cmd_console,
    "run": cmd_run,
    "enqueue": cmd_enqueue,
    "show": cmd_show,
    "runs": cmd_runs,
    "approve": cmd_act,
    "reject": cmd_act,
    "cancel": cmd_act,
    "retry": cmd_act,
    "release": cmd_act,
    "mark-sent": cmd_act,
    "resend": cmd_act,
    "fork": cmd_fork,
    "export": cmd_export,
    "check-replay": cmd_check_replay,
    "purge": cmd_purge,
}
