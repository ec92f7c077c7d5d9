"""``digest``: run, enqueue, inspect, approve and reject digests from a shell.

``digest run`` executes the same task body a worker runs, in this process, and prints the
tutorial's transcript. Exit status: 0 done (sent, nothing-new, already-done, waiting), 1 the
run failed, 2 bad input or usage, 3 the run is leased by another live worker.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from importlib import metadata
from typing import Any, NoReturn

from journal import Record, StepEvent, Wait, validate_run_id
from journal.errors import (
    ControlRefused,
    InvalidRunId,
    JournalError,
    LeaseBusy,
    ReceiptUnsaved,
    RunParked,
    StoreEvicts,
)
from journal.logs import redact, redact_logging
from journal.ops.actions import purge as purge_runs
from journal.ops.actions import retry as retry_run
from journal.ops.views import STATES, Cursor, RunView, inspect_run, list_runs, page_size
from journal.testing.preflight import Verdict, check_runs, unended_runs
from tasks import control
from tasks.claims import MAYBE_SENT, STUCK, Held, holdings
from tasks.config import Config, parse_duration
from tasks.cost import dollars, is_call, usage_of
from tasks.errors import BadInput, DigestError
from tasks.feeds import is_url
from tasks.items import load_items
from tasks.model import OfflineSummarizer
from tasks.prompts import PROMPTS
from tasks.ratelimit import LimitState
from tasks.runtime import Runtime, use_runtime
from tasks.schedule import iso_week_run_id
from tasks.workflow import (
    DigestOptions,
    batch_lines,
    decide_send,
    digest,
    draft_digest,
    email_state,
    preview,
    receipt_line,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_BUSY = 0, 1, 2, 3
RUN_ID_HELP = "the run, as listed (digest:2026-w42) or alone (2026-w42)"
# The version of `digest show --json`'s layout: raised when a field changes meaning or goes.
SHOW_SCHEMA = 1


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"digest: {message} (see digest --help)\n")


def _page_size(text: str) -> int:
    """``--limit``, as argparse reports a bad value."""
    try:
        return page_size(text)
    except ValueError as bad:
        raise argparse.ArgumentTypeError(str(bad)) from None


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="digest", description="The weekly AI digest, durable on Redis.")
    parser.add_argument(
        "--version", action="version", version=f"digest {metadata.version('durable-digest')}"
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="run a digest in this process (resumes where it stopped)")
    run.add_argument("run_id", nargs="?", help=f"{RUN_ID_HELP} (default: this week)")
    run.add_argument("--to", help="recipient (default: DIGEST_TO)")
    run.add_argument("--items", help="items file (default: DIGEST_ITEMS)")
    run.add_argument("--dry-run", action="store_true", help="run every step but send/mark-seen")
    run.add_argument(
        "--approval", action="store_true", help="wait for `digest approve` first (DIGEST_APPROVAL)"
    )
    run.add_argument(
        "--retry",
        action="store_true",
        help="make a failed, parked or retrying run ready to start again, then run it",
    )
    run.add_argument(
        "--batch",
        action="store_true",
        help="a new run asks by Message Batches, at half the price (DIGEST_BATCH); the "
        "command exits while a batch processes, saying when to run it again",
    )

    enqueue = sub.add_parser("enqueue", help="hand a run to the Celery workers")
    enqueue.add_argument("run_id", nargs="?", help=f"{RUN_ID_HELP} (default: this week)")

    show = sub.add_parser("show", help="what a run did: steps, attempts, usage, lease, errors")
    show.add_argument("run_id", nargs="?", help=f"{RUN_ID_HELP} (default: this week)")
    show.add_argument(
        "--json", action="store_true", help=f"typed JSON, schema {SHOW_SCHEMA} (docs/operations.md)"
    )

    runs = sub.add_parser("runs", help="the most recently updated runs, a page at a time")
    runs.add_argument("--status", choices=STATES, help="only runs in this state (default: all)")
    runs.add_argument(
        "--limit", type=_page_size, default=50, metavar="N", help="runs per page (default: 50)"
    )
    runs.add_argument(
        "--before",
        metavar="CURSOR",
        help="the page after the one that ended here (printed after a full page)",
    )

    cancel = sub.add_parser("cancel", help="stop a run before its next step; a waiting one now")
    cancel.add_argument("run_id", help=RUN_ID_HELP)
    cancel.add_argument(
        "--reason", default="", help="kept in the run's meta (default: none, 'cancelled')"
    )
    retry = sub.add_parser("retry", help="hand a failed, parked or retrying run to the workers now")
    retry.add_argument("run_id", help=RUN_ID_HELP)
    release = sub.add_parser("release", help="end a failed run; its items go to the next run")
    release.add_argument("run_id", help=RUN_ID_HELP)
    marked = sub.add_parser(
        "mark-sent", help="an email that may have been sent did arrive: the run finishes"
    )
    marked.add_argument("run_id", help=RUN_ID_HELP)
    resend = sub.add_parser(
        "resend", help="an email that may have been sent did not arrive: send it again"
    )
    resend.add_argument("run_id", help=RUN_ID_HELP)
    console = sub.add_parser("console", help="the web console: runs, steps, actions")
    console.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1 (this machine)")
    console.add_argument("--port", type=int, default=8765, help="default: 8765")
    metrics = sub.add_parser(
        "metrics", help="serve what Redis holds (runs by state, due lag) to Prometheus"
    )
    metrics.add_argument("--host", default="127.0.0.1", help="address (default: %(default)s)")
    metrics.add_argument("--port", type=int, default=9808, help="port (default: %(default)s)")
    fork = sub.add_parser("fork", help="a new run with this one's steps before STEP; runs the rest")
    fork.add_argument("run_id", help=RUN_ID_HELP)
    fork.add_argument(
        "--from",
        dest="step",
        required=True,
        metavar="STEP",
        help="the first step the fork runs again (a key `digest show` lists, e.g. compose)",
    )
    fork.add_argument(
        "--as", dest="new_run_id", metavar="NEW", help="RUN-fork-NAME (default: RUN-forkN)"
    )
    fork.add_argument(
        "--dry-run", action="store_true", help="print its email beside the run's; write nothing"
    )
    export = sub.add_parser("export", help="a run's journal as a JSON fixture, secrets masked")
    export.add_argument("run_id", help=RUN_ID_HELP)
    export.add_argument("-o", "--output", metavar="FILE", help="default: standard output")
    check = sub.add_parser("check-replay", help="would the installed code resume these runs?")
    check.add_argument("runs", nargs="*", metavar="RUN", help="default: every run not ended")

    purge = sub.add_parser(
        "purge", help="remove the keys of ended runs (done, cancelled, failed) older than this"
    )
    purge.add_argument(
        "--older-than",
        required=True,
        metavar="DURATION",
        help="last updated longer ago than this: 30d, 36h, 8w (running, waiting and retrying "
        "runs are never removed)",
    )
    purge.add_argument(
        "--dry-run", action="store_true", help="list what would go, and remove nothing"
    )

    approve = sub.add_parser("approve", help="approve a digest waiting for approval")
    approve.add_argument("run_id", help=RUN_ID_HELP)
    reject = sub.add_parser("reject", help="reject a digest waiting for approval")
    reject.add_argument("run_id", help=RUN_ID_HELP)
    reject.add_argument("--reason", required=True, help="why, kept with the run's outcome")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``digest`` command."""
    args = _parser().parse_args(argv)
    redact_logging()  # the journal's warnings, printed by logging's last-resort handler
    try:
        config = Config.from_env()
        # Only an omitted id means this week; an empty one is refused like any bad id.
        given = getattr(args, "run_id", None)  # `digest runs` takes no run id
        run_id = iso_week_run_id(datetime.now(config.zone)) if given is None else _run_id(given)
        validate_run_id(run_id)
        return int(COMMANDS[args.command](config, run_id, args))
    except (BadInput, InvalidRunId, ControlRefused, StoreEvicts) as bad:
        print(f"digest: {_printable(redact(str(bad)))}", file=sys.stderr)
        return EXIT_USAGE
    except LeaseBusy as busy:
        print(f"digest: {busy}", file=sys.stderr)
        return EXIT_BUSY
    except ReceiptUnsaved as unsaved:
        run_id = unsaved.run.partition(":")[2]
        print(
            _printable(
                f"failed: run {unsaved.run}: its email was delivered, but the store refused to "
                f"record it ({redact(unsaved.cause)}); it will not be sent again: once the "
                f"store takes writes, `digest run {run_id}` asks, and `digest mark-sent {run_id}` "
                "finishes it"
            ),
            file=sys.stderr,
        )
        return EXIT_FAILED
    except (DigestError, JournalError) as failure:
        print(f"failed: {_printable(redact(str(failure)))}", file=sys.stderr)
        return EXIT_FAILED


def _run_id(given: str) -> str:
    """The run id of ``given``, which may be as listings print it (``digest:2026-w42``).

    Raises:
        BadInput: ``given`` names a run of another workflow.
    """
    workflow, colon, run_id = given.rpartition(":")
    if colon and workflow != digest.name:
        raise BadInput(
            f"{given!r} is not a digest run; give its id as `digest runs` prints it "
            f"({digest.name}:2026-w42) or alone (2026-w42)"
        )
    return run_id if colon else given


def _known(runtime: Runtime, run_id: str) -> RunView:
    """The run, which must have started: acting on or showing a run never begun is a typo.

    Raises:
        BadInput: the journal has no such run.
    """
    view = inspect_run(runtime.journal, digest.name, run_id)
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
    runtime = Runtime.build(config, allow_offline=True)
    use_runtime(runtime)  # the workflow's runtime in this process: offline allowed
    journal = runtime.journal
    offline = runtime.summarizer if isinstance(runtime.summarizer, OfflineSummarizer) else None
    if args.retry:  # only a failed run: any other is refused, and nothing is written
        retry_run(journal, digest.name, run_id)
        print(
            f"  reset {digest.name}:{run_id}: its next start is a deliberate retry", file=sys.stderr
        )
    # A dry run is a workflow of its own, in a scratch journal: a worker never runs a preview.
    workflow = preview if args.dry_run else digest
    view = inspect_run(journal, workflow.name, run_id)
    source = args.items or config.items_path
    # Bad input is refused before any write; a URL is fetched once, by `select` itself.
    unstarted = view.step("select") is None and view.status not in ("done", "cancelled")
    if unstarted and not is_url(source):
        load_items(source)
    # What a worker would freeze (the workflow's defaults): the recipient and the gate are
    # read now, at the first start, and a later change of the environment changes nothing.
    if args.batch and offline is not None and unstarted:
        raise BadInput(
            "--batch needs ANTHROPIC_API_KEY: the offline summarizer has no batches (and costs "
            "nothing); set the key, or run without --batch"
        )
    options = DigestOptions(
        to=args.to or config.recipient,
        items=args.items,
        approval=True if args.approval else config.approval,
        # Offline, DIGEST_BATCH has nothing to batch: such a run asks synchronously, for free.
        # Frozen only when true: a run that leaves it out asks synchronously, as ever.
        batch=True if (args.batch or config.batch) and offline is None else None,
    )
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
        return EXIT_OK
    if outcome.status == "already-done":
        earlier = _outcome({"status": "done", "outcome": json.dumps(outcome.result)})
        print(f"already-done: ended earlier ({earlier}); nothing ran in this attempt")
        return EXIT_OK
    if outcome.status == "waiting":
        assert outcome.wait is not None
        if outcome.wait.kind == "decision":
            print(
                _printable(
                    f"waiting: the email may have been sent ({redact(outcome.wait.reason)}); "
                    f"{decide_send(run_id)}"
                )
            )
            return EXIT_OK
        until = _when(outcome.wait.until) if outcome.wait.until else "no time limit"
        if outcome.wait.step.startswith("sleep:look:"):
            seen = inspect_run(journal, workflow.name, run_id)
            shown = batch_lines(seen.steps, seen.wait, seen.effects)
            print(
                _printable(
                    f"waiting: batch {shown[-1] if shown else '?'}; run `digest run {run_id}` "
                    "again then, or let a worker and beat resume it"
                )
            )
            return EXIT_OK
        print(
            f"waiting: {outcome.wait.kind} {outcome.wait.signal or outcome.wait.step} "
            f"(until {until}); `digest approve {run_id}` or `digest reject {run_id} --reason ...`"
            if outcome.wait.signal == "approval"
            else f"waiting: {outcome.wait.kind} at {outcome.wait.step} until {until}; "
            f"run `digest run {run_id}` again then, or let a worker and beat resume it"
        )
        return EXIT_OK
    result: dict[str, Any] = outcome.result
    for skipped in result.get("skipped", []):
        print(f"  skipped  summarize:{skipped['id']} ({_printable(redact(skipped['error']))})")
    if result["status"] == "dry-run":
        email = result["email"]
        text = f"\nTo: {email['to']}\nSubject: {email['subject']}\n\n{email['body']}\n"
        print(_printable(text, newlines=True))
    held = [Held(**entry) for entry in result.get("held", [])]
    items = f"{result['items']} new items" if held else f"{result['items']} items"
    offline_made = result.get("offline_summaries", 0)
    made = (
        f"{offline_made} offline summaries (no model calls)"
        if offline_made
        else f"{result['model_calls']} model calls"
    )
    if result.get("batch_requests"):
        made += f" and {result['batch_requests']} batch requests"
    line = f"{result['status']}: {items}, {made} in this attempt{receipt_line(result)}"
    print(_printable("; ".join([line, *(entry.line() for entry in held)])))
    return EXIT_OK


def cmd_enqueue(config: Config, run_id: str, args: argparse.Namespace) -> int:
    """Hand the run to the workers; a duplicate enqueue is harmless (the lease and journal)."""
    from tasks.celery_app import digest as task

    result = task.delay(run_id)
    print(f"enqueued {digest.name}:{run_id} as task {result.id}; `celery -A tasks worker` runs it")
    return EXIT_OK


def cmd_show(config: Config, run_id: str, args: argparse.Namespace) -> int:
    """Print what the journal knows about a run."""
    runtime = Runtime.build(config, allow_offline=True)
    view = _known(runtime, run_id)
    held = holdings(runtime).get(view.run, 0)
    limits = runtime.limit_states()
    # Masked again here: a journal written before masking, or by other code, may hold a secret.
    if args.json:
        shown = _view_json(view) | {
            "holds": held,
            "model_limits": {s.model: s.to_json() for s in limits},
        }
        print(redact(json.dumps(shown, indent=2, sort_keys=True)))
    else:
        print(_printable(redact(_render(view, held, limits)), newlines=True))
    return EXIT_OK


def cmd_runs(config: Config, run_id: str, args: argparse.Namespace) -> int:
    """List recent runs with their state, newest first."""
    try:
        before = Cursor.parse(args.before) if args.before else None
    except ValueError as bad:
        raise BadInput(f"--before: {bad}; give the cursor a full page ended with") from None
    runtime = Runtime.build(config, allow_offline=True)
    held = holdings(runtime)
    # One row more than the page, to say whether another page follows.
    rows = list_runs(
        runtime.journal, state=args.status, steps=True, limit=args.limit + 1, before=before
    )
    for row in rows[: args.limit]:
        usage = usage_of(record.result for record in row.steps)
        line = (
            f"{row.run:32} {row.state:10} updated {_when(row.updated_ms / 1000)}  "
            f"{usage.calls} calls {dollars(usage.cost_usd)}"
        )
        flags = [_fate(row.meta) or _outcome(row.meta), _holds(held.get(row.run, 0))]
        if row.state not in ("done", "cancelled", "failed"):
            wait = Wait.from_meta(row.run, row.meta["wait"]) if row.meta.get("wait") else None
            flags += [f"batch {line}" for line in batch_lines(row.steps, wait)]
        print(_printable("  ".join([line, *(flag for flag in flags if flag)])))
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


def cmd_cancel(config: Config, run_id: str, args: argparse.Namespace) -> int:
    """Cancel a run: a held one stops before its next step, any other at once."""
    runtime = Runtime.build(config, allow_offline=True)
    print(control.cancel(runtime, run_id, args.reason).line)
    return EXIT_OK


def cmd_release(config: Config, run_id: str, args: argparse.Namespace) -> int:
    """End a failed run for good and hand the items it holds to the next run."""
    runtime = Runtime.build(config, allow_offline=True)
    print(control.release(runtime, run_id).line)
    return EXIT_OK


def cmd_mark_sent(config: Config, run_id: str, args: argparse.Namespace) -> int:
    """Settle a send that may have happened as done; the run finishes its bookkeeping."""
    runtime = Runtime.build(config, allow_offline=True)
    print(control.mark_sent(runtime, run_id).line)
    return EXIT_OK


def cmd_resend(config: Config, run_id: str, args: argparse.Namespace) -> int:
    """Settle a send that may have happened as not done; it is sent again."""
    runtime = Runtime.build(config, allow_offline=True)
    print(control.resend(runtime, run_id).line)
    return EXIT_OK


def cmd_retry(config: Config, run_id: str, args: argparse.Namespace) -> int:
    """Hand a failed run to the workers now."""
    runtime = Runtime.build(config, allow_offline=True)
    print(control.retry(runtime, run_id).line)
    return EXIT_OK


def cmd_fork(config: Config, run_id: str, args: argparse.Namespace) -> int:
    """Fork a run from one of its steps and hand the fork to the workers."""
    runtime = Runtime.build(config, allow_offline=True)
    if args.dry_run:
        return fork_dry_run(runtime, run_id, args.step)
    print(control.fork(runtime, run_id, args.step, args.new_run_id).line)
    return EXIT_OK


def fork_dry_run(runtime: Runtime, run_id: str, step: str) -> int:
    """Print the email a fork from ``step`` would send, as a diff against the run's own."""
    from tasks.fork_preview import email_text, preview_fork

    use_runtime(runtime)  # the fork's steps run with this runtime, in memory
    fork = preview_fork(runtime, run_id, step)
    if fork.original is None:
        fresh = f"(the run composed no email; the fork's:)\n\n{email_text(fork.forked)}"
        print(_printable(redact(fresh), newlines=True))
    else:
        print(_printable(redact(fork.diff() or "(the same email)\n"), newlines=True), end="")
    ran = ", ".join(fork.ran) or "nothing"
    print(
        f"dry run: a fork of {fork.run} from {step} would run {ran} ({fork.model_calls} model "
        "calls made now); nothing was written or sent"
    )
    return EXIT_OK


def cmd_export(config: Config, run_id: str, args: argparse.Namespace) -> int:
    """Write a run's journal as a fixture (``journal.testing.fixture``), to a file or stdout."""
    from journal.testing.fixture import export

    runtime = Runtime.build(config, allow_offline=True)
    document = export(runtime.journal, digest.name, run_id)
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
    verdicts = check_runs(
        runtime.journal, digest, args.runs or unended_runs(runtime.journal, digest.name)
    )
    for verdict in verdicts:
        print(_printable(redact(_verdict_line(verdict))))
    broken = sum(not verdict.clean for verdict in verdicts)
    print(f"{len(verdicts)} runs replayed, {broken} would break")
    return EXIT_FAILED if broken else EXIT_OK


def cmd_purge(config: Config, run_id: str, args: argparse.Namespace) -> int:
    """Remove ended runs older than ``--older-than`` (``DIGEST_RUN_RETENTION``, for beat)."""
    older_than = parse_duration("--older-than", args.older_than)
    runtime = Runtime.build(config, allow_offline=True)
    purged = purge_runs(runtime.journal, older_than, dry_run=args.dry_run)
    verb = "would purge" if args.dry_run else "purged"
    for run in purged:
        print(_printable(f"{verb} {run.run} ({run.status})"))
    runs = f"{len(purged)} run{'' if len(purged) == 1 else 's'}"
    print(f"{verb} {runs}; nothing deleted (--dry-run)" if args.dry_run else f"{verb} {runs}")
    return EXIT_OK


def cmd_approve(config: Config, run_id: str, args: argparse.Namespace) -> int:
    """Approve a digest waiting at its approval gate."""
    return _decide(config, run_id, {"approved": True})


def cmd_reject(config: Config, run_id: str, args: argparse.Namespace) -> int:
    """Reject a digest waiting at its approval gate; it ends without sending."""
    return _decide(config, run_id, {"approved": False, "reason": args.reason})


def _decide(config: Config, run_id: str, decision: dict[str, Any]) -> int:
    runtime = Runtime.build(config, allow_offline=True)
    print(control.decide(runtime, run_id, decision).line)
    return EXIT_OK


def cmd_console(config: Config, run_id: str, args: argparse.Namespace) -> int:
    """Serve the web console until interrupted; the web stack is imported only here."""
    from tasks import console

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

    from tasks import metrics

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


COMMANDS = {
    "metrics": cmd_metrics,
    "console": cmd_console,
    "run": cmd_run,
    "enqueue": cmd_enqueue,
    "show": cmd_show,
    "runs": cmd_runs,
    "approve": cmd_approve,
    "reject": cmd_reject,
    "cancel": cmd_cancel,
    "retry": cmd_retry,
    "release": cmd_release,
    "mark-sent": cmd_mark_sent,
    "resend": cmd_resend,
    "fork": cmd_fork,
    "export": cmd_export,
    "check-replay": cmd_check_replay,
    "purge": cmd_purge,
}


# -- rendering ------------------------------------------------------------------------------


# Every C0 and C1 control character but tab (and newline, where a text may span lines).
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f]")
_CONTROL_BUT_NEWLINE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _printable(text: str, *, newlines: bool = False) -> str:
    r"""Text from the journal, a model or an API error, made safe to print on a terminal.

    It is data, never terminal commands: each control character (ESC, and with it every
    escape sequence; CR; C1's CSI) is shown escaped, as ``\x1b``. Unless ``newlines``, a
    newline is escaped too, so a stored text cannot forge a line of the report.
    """
    pattern = _CONTROL_BUT_NEWLINE if newlines else _CONTROL
    return pattern.sub(lambda found: ascii(found.group())[1:-1], text)


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _preview(value: Any, width: int = 60) -> str:
    text = value.get("text") if isinstance(value, dict) and "text" in value else value
    flat = json.dumps(text, ensure_ascii=False) if not isinstance(text, str) else text
    flat = " ".join(flat.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def _result_text(record: Record) -> str:
    """A step's result in a line: the send step's receipt in words, as ``digest run`` says it.

    Its record's ``sent`` means "delivered by this attempt": false for an email an earlier
    attempt delivered, which would read as "not sent".
    """
    if record.key == "send" and isinstance(record.result, dict) and "id" in record.result:
        return receipt_line({"receipt": record.result}).removeprefix(", ")
    return _preview(record.result)


def _cost(value: Any) -> str:
    if not is_call(value):
        return ""
    cost = value.get("cost_usd")
    return "unpriced" if cost is None else dollars(float(cost))


def _usage(value: Any) -> str:
    if isinstance(value, dict) and "input_tokens" in value:
        return f"{value['input_tokens']}+{value['output_tokens']} tok"
    return ""


def _fate(meta: Mapping[str, str]) -> str:
    """What becomes of a run that failed, or waits on an operator.

    A run that failed for a transient cause: its next retry, or none; one whose email may have
    been sent: the decision it waits for.
    """
    wait = meta.get("wait")
    deciding = wait and Wait.from_meta(meta.get("run_id", "?"), wait).kind == "decision"
    if meta.get("status") == "waiting" and deciding:
        return "(its email may have been sent: digest mark-sent or digest resend decides)"
    failures = meta.get("failures", "?")
    if meta.get("status") == "retrying":
        return (
            f"(next retry {_when_ms(meta, 'retry_at')}, gives up after "
            f"{_when_ms(meta, 'retry_until')}; transient failures so far: {failures})"
        )
    if meta.get("status") == "failed" and "gave_up_at" in meta:
        return (
            f"for good (gave up {_when_ms(meta, 'gave_up_at')}; transient failures: {failures}; "
            "not retried again)"
        )
    return ""


def _outcome(meta: Mapping[str, str]) -> str:
    """A finished run's outcome in words: ``sent: 8 items, email sent (...)``, ``rejected``."""
    if meta.get("status") != "done" or "outcome" not in meta:
        return ""
    result = json.loads(meta["outcome"])
    if not isinstance(result, dict) or "status" not in result:
        return ""
    if result["status"] == "sent":
        return f"sent: {result['items']} items{receipt_line(result)}"
    reason = result.get("reason")
    return f"{result['status']} ({reason})" if reason else str(result["status"])


def _when_ms(meta: Mapping[str, str], name: str) -> str:
    raw = meta.get(name, "")
    return _when(int(raw) / 1000) if raw.isdigit() else f"unknown ({name}={raw!r})"


def _render(view: RunView, held: int = 0, limits: Sequence[LimitState] = ()) -> str:
    meta = view.meta
    fate = _fate(meta)  # the next retry, or that it gave up
    outcome = _outcome(meta)
    status = f"{view.status}: {outcome}" if outcome else f"{view.status} {fate}".rstrip()
    lines = [f"run      {view.run}", f"status   {status}"]
    if held:
        ways = ": digest retry sends them, digest release hands them on"
        stuck = view.status in STUCK and view.effects.get("send") not in MAYBE_SENT
        lines.append(f"holds    {held} items{ways if stuck else ''}")
    if meta.get("cancel"):
        lines.append(
            f"cancel   {meta['cancel']} (asked {_when(int(meta['cancel_requested_at']) / 1000)})"
        )
    if meta.get("forked_from"):
        lines.append(f"forked   from {meta['forked_from']} at {meta.get('forked_at_step', '?')}")
    if meta.get("parked"):
        lines.append("parked   yes: starts kept dying; `digest run RUN --retry` resets it")
    if view.lease_holder:
        expires = f"{(view.lease_ttl_ms or 0) / 1000:.1f}s"
        lines.append(f"lease    fence {view.lease_holder.split(':')[0]}, expires in {expires}")
    else:
        lines.append("lease    free")
    lines.append(
        f"starts   {meta.get('starts', '0')} (deliveries {meta.get('deliveries', '0')}, "
        f"fence {meta.get('fence', '0')})"
    )
    lines.append(f"email    {email_state(view)}")
    if meta.get("last_error"):
        lines.append(f"error    {_printable(meta['last_error'])}")
    if view.wait is not None and view.wait.kind == "decision":
        lines.append(f"waiting  for a decision on {view.wait.step}: mark-sent or resend")
    elif view.wait is not None:
        until = _when(view.wait.until) if view.wait.until else "no limit"
        lines.append(
            f"waiting  {view.wait.kind} {view.wait.signal or view.wait.step} until {until}"
        )
    shown = batch_lines(view.steps, view.wait, view.effects)
    lines.extend(f"{'batch' if n == 0 else '':8} {line}" for n, line in enumerate(shown))
    usage = usage_of(record.result for record in view.steps)
    lines.append(
        f"cache    hit ratio {usage.cache_hit_ratio:.2f} ({usage.cache_read_tokens} prompt "
        f"tokens read from the cache, {usage.cache_write_tokens} written to it)"
    )
    # Not the run's own: every process on the API key shares them (tasks.ratelimit).
    lines.extend(f"{'limits' if n == 0 else '':8} {state.line()}" for n, state in enumerate(limits))
    lines.append("")
    lines.append(f"{'step':22} {'finished':23} {'try':>3} {'usage':>13} {'cost':>9}  result")
    for record in view.steps:
        lines.append(
            f"{record.key:22} {_when(record.finished_at / 1000):23} {record.attempt:>3} "
            f"{_usage(record.result):>13} {_cost(record.result):>9}  {_result_text(record)}"
        )
    lines += _prompt_lines(view)
    unpriced = f" ({usage.unpriced} calls unpriced)" if usage.unpriced else ""
    offline = f" ({usage.offline} offline summaries)" if usage.offline else ""
    batched = f" ({usage.batched} by batch, at half the price)" if usage.batched else ""
    lines.append(
        f"\n{len(view.steps)} steps, {usage.calls} model calls{batched}{offline}, "
        f"{usage.input_tokens} input + {usage.output_tokens} output tokens, "
        f"{dollars(usage.cost_usd)}{unpriced}"
    )

    draft = view.step("draft")
    if view.wait is not None and view.wait.signal == "approval" and draft is not None:
        email = draft.result
        lines.append(
            f"\nawaiting approval (draft {draft_digest(email)}):\n"
            f"To: {email['to']}\nSubject: {email['subject']}\n"
        )
        lines.append(email["body"])
    return "\n".join(lines)


def _prompt_lines(view: RunView) -> list[str]:
    """The model steps that ran under another version of their prompt than the code's now."""
    other: dict[str, list[str]] = {}
    for record in view.steps:
        version = record.result.get("prompt") if is_call(record.result) else None
        if isinstance(version, str) and PROMPTS.get(version.split("@")[0]) != version:
            other.setdefault(version, []).append(record.key)
    return [
        f"prompt   {', '.join(keys)} ran under {version}; the code now has "
        f"{PROMPTS.get(version.split('@')[0], 'no such prompt')}"
        for version, keys in other.items()
    ]


def _verdict_line(verdict: Verdict) -> str:
    """One run's verdict: clean and where it stops, or where and how it would break."""
    kept = [f"{gate}=0" for gate, answer in verdict.gates.items() if answer == 0]
    gates = f"; kept on the old path by version gate {', '.join(kept)}" if kept else ""
    head = f"{verdict.run:28} {verdict.state:9}"
    if verdict.drift is not None:
        drift = verdict.drift
        return (
            f"{head} DRIFTS at step {drift.position}: the journal recorded {drift.expected!r}, "
            f"the code asks for {drift.found!r}; gate the change with run.version(KEY, N) "
            f"(this run would get 0 and keep the old path){gates}"
        )
    if verdict.error is not None:
        return f"{head} BREAKS on its recorded steps: {verdict.error}{gates}"
    return f"{head} replays cleanly, stops {verdict.stopped}{gates}"


def _view_json(view: RunView) -> dict[str, Any]:
    """``digest show --json``: every value typed (numbers, ISO 8601 times, nested objects).

    The layout is versioned (``schema``); docs/operations.md describes it.
    """
    # The wait is given once, below, with its time in ISO 8601 like every other.
    meta = {name: _typed(name, value) for name, value in view.meta.items() if name != "wait"}
    return {
        "schema": SHOW_SCHEMA,
        "run": view.run,
        "status": view.status,
        "state": view.state,
        "outcome": meta.pop("outcome", None),  # the run's result, once it ended
        "meta": meta,
        "lease": {"holder": view.lease_holder, "ttl_ms": view.lease_ttl_ms},
        "wait": _wait_json(view),
        "signals": view.signals,
        "steps": [
            {
                "key": r.key,
                "kind": r.kind,
                "seq": r.seq,
                "attempt": r.attempt,
                "fence": r.fence,
                "started_at": _iso(r.started_at),
                "finished_at": _iso(r.finished_at),
                "result": r.result,
                "text": _result_text(r),
            }
            for r in view.steps
        ],
    }


def _iso(ms: float) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _typed(name: str, value: str) -> Any:
    """A meta field as JSON: times in ISO 8601, counts as numbers, stored JSON as objects.

    Times are the fields stored as milliseconds since the epoch (``*_at``, ``*_until``);
    stored JSON is the outcome, the arguments and the wait; anything else stays text.
    """
    if value.isdigit():
        return _iso(int(value)) if name.endswith(("_at", "_until")) else int(value)
    if value[:1] in "{[":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _wait_json(view: RunView) -> dict[str, Any] | None:
    if view.wait is None:
        return None
    wait = view.wait.to_json()
    if isinstance(wait.get("until"), int | float):
        wait["until"] = datetime.fromtimestamp(wait["until"], UTC).isoformat()
    return wait


def entry() -> None:
    """The ``digest`` console script: a process of its own, so it may own SIGPIPE and its exit."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `digest show | head` ends quietly
    try:
        code = main()
    except SystemExit as stop:  # argparse's --help and usage errors, already printed
        if stop.code is not None and not isinstance(stop.code, int):
            raise
        code = stop.code or 0
    # Tearing the interpreter down (hundreds of modules) took 0.1-0.5 s after the last line
    # and does nothing this process needs: the store connection is closed, the server is
    # another process. Flush what is buffered and leave.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
