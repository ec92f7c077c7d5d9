"""The ``digest`` command's arguments, and the exit statuses every command answers with.

Exit status: 0 done (sent, nothing-new, already-done, waiting), 1 the run failed, 2 bad input
or usage, 3 the run is leased by another live worker.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import TYPE_CHECKING, Any, NoReturn

from journal.ops.views import STATES, page_size

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_BUSY = 0, 1, 2, 3

RUN_ID_HELP = "the run, as listed (digest:2026-w42) or alone (2026-w42)"


# The version of `digest show --json`'s layout: raised when a field changes meaning or goes.
SHOW_SCHEMA = 1


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"digest: {message} (see digest --help)\n")


class _Version(argparse.Action):
    """``--version``, the installed package's, looked up only when asked for.

    Finding a package's metadata reads every installed distribution's: milliseconds that
    every other command would pay for nothing.
    """

    def __init__(self, option_strings: Sequence[str], dest: str) -> None:
        super().__init__(
            option_strings,
            argparse.SUPPRESS,
            nargs=0,
            default=argparse.SUPPRESS,
            help="show program's version number and exit",
        )

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        sys.stdout.write(f"digest {metadata.version('durable-digest')}\n")
        parser.exit()


if TYPE_CHECKING:
    # What add_subparsers returns: argparse names it privately, and only for type checkers.
    Subparsers = argparse._SubParsersAction[_Parser]


def _page_size(text: str) -> int:
    """``--limit``, as argparse reports a bad value."""
    try:
        return page_size(text)
    except ValueError as bad:
        raise argparse.ArgumentTypeError(str(bad)) from None


def build_parser() -> argparse.ArgumentParser:
    """The ``digest`` command's parser: its subcommands in the order ``--help`` lists them."""
    parser = _Parser(prog="digest", description="The weekly AI digest, durable on Redis.")
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_running(sub)
    _add_reading(sub)
    _add_acting(sub)
    _add_serving(sub)
    _add_records(sub)
    _add_deciding(sub)
    return parser


def _add_running(sub: Subparsers) -> None:
    """``run`` here, ``enqueue`` to the workers."""
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


def _add_reading(sub: Subparsers) -> None:
    """``show`` one run, list the ``runs``."""
    show = sub.add_parser("show", help="what a run did: steps, attempts, usage, lease, errors")
    show.add_argument("run_id", nargs="?", help=f"{RUN_ID_HELP} (default: this week)")
    show.add_argument(
        "--json", action="store_true", help=f"typed JSON, schema {SHOW_SCHEMA} (docs/operations.md)"
    )
    show.add_argument(
        "--all", action="store_true", help="every step (a long run lists its first and last 20)"
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


def _add_acting(sub: Subparsers) -> None:
    """The operator's actions on one run: cancel, retry, release, mark-sent, resend."""
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


def _add_serving(sub: Subparsers) -> None:
    """The servers: the web ``console`` and the store's ``metrics``."""
    console = sub.add_parser("console", help="the web console: runs, steps, actions")
    console.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1 (this machine)")
    console.add_argument("--port", type=int, default=8765, help="default: 8765")
    metrics = sub.add_parser(
        "metrics", help="serve what Redis holds (runs by state, due lag) to Prometheus"
    )
    metrics.add_argument("--host", default="127.0.0.1", help="address (default: %(default)s)")
    metrics.add_argument("--port", type=int, default=9808, help="port (default: %(default)s)")


def _add_records(sub: Subparsers) -> None:
    """What reads or rewrites a run's record: fork, export, check-replay, purge."""
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


def _add_deciding(sub: Subparsers) -> None:
    """The approval gate's two answers."""
    approve = sub.add_parser("approve", help="approve a digest waiting for approval")
    approve.add_argument("run_id", help=RUN_ID_HELP)
    reject = sub.add_parser("reject", help="reject a digest waiting for approval")
    reject.add_argument("run_id", help=RUN_ID_HELP)
    reject.add_argument("--reason", required=True, help="why, kept with the run's outcome")
