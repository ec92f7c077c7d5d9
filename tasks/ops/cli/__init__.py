"""``digest``: run, enqueue, inspect, approve and reject digests from a shell.

``digest run`` executes the same task body a worker runs, in this process, and prints the
tutorial's transcript. The arguments and exit statuses are ``parser``'s, each command is in
``commands``, and what they print about a run is ``render``'s.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TextIO, cast

from journal.errors import (
    ControlRefused,
    InvalidRunId,
    JournalError,
    LeaseBusy,
    ReceiptUnsaved,
    StoreEvicts,
)
from tasks.errors import BadInput, DigestError
from tasks.job.names import WORKFLOW
from tasks.ops.cli.parser import EXIT_BUSY, EXIT_FAILED, EXIT_USAGE, build_parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``digest`` command."""
    args = build_parser().parse_args(argv)  # --help and usage errors end here
    # Imported once the arguments are known: the commands bring the store's client, the
    # runtime and the renderers, the settings their tables; `digest --help` needs none of it.
    from journal import validate_run_id
    from journal.logs import redact, redact_logging
    from tasks.config import Config
    from tasks.job.weeks import iso_week_run_id
    from tasks.ops.cli.commands import COMMANDS

    redact_logging()  # the journal's warnings, printed by logging's last-resort handler
    try:
        config = Config.from_env()
        # Only an omitted id means this week; an empty one is refused like any bad id.
        given = getattr(args, "run_id", None)  # `digest runs` takes no run id
        run_id = iso_week_run_id(datetime.now(config.zone)) if given is None else run_id_of(given)
        validate_run_id(run_id)
        return int(COMMANDS[args.command](config, run_id, args))
    except (BadInput, InvalidRunId, ControlRefused, StoreEvicts) as bad:
        print(f"digest: {printable(redact(str(bad)))}", file=sys.stderr)
        return EXIT_USAGE
    except LeaseBusy as busy:
        print(f"digest: {busy}", file=sys.stderr)
        return EXIT_BUSY
    except ReceiptUnsaved as unsaved:
        run_id = unsaved.run.partition(":")[2]
        print(
            printable(
                f"failed: run {unsaved.run}: its email was delivered, but the store refused to "
                f"record it ({redact(unsaved.cause)}); it will not be sent again: once the "
                f"store takes writes, `digest run {run_id}` asks, and `digest mark-sent {run_id}` "
                "finishes it"
            ),
            file=sys.stderr,
        )
        return EXIT_FAILED
    except (DigestError, JournalError) as failure:
        print(f"failed: {printable(redact(str(failure)))}", file=sys.stderr)
        return EXIT_FAILED


def printable(text: str) -> str:
    """``render.printable``, imported when there is something to print: not for ``--help``."""
    from tasks.ops.cli.render import printable as safe

    return safe(text)


def run_id_of(given: str) -> str:
    """The run id of ``given``, which may be as listings print it (``digest:2026-w42``).

    Raises:
        BadInput: ``given`` names a run of another workflow.
    """
    workflow, colon, run_id = given.rpartition(":")
    if colon and workflow != WORKFLOW:
        raise BadInput(
            f"{given!r} is not a digest run; give its id as `digest runs` prints it "
            f"({WORKFLOW}:2026-w42) or alone (2026-w42)"
        )
    return run_id if colon else given


# What a shell reports of a command ended by a closed pipe (128 + SIGPIPE).
EXIT_READER_GONE = 128 + signal.SIGPIPE


class _Stdout:
    """stdout, ending the process at once and quietly when its reader has gone.

    As SIGPIPE's default action would (`digest show | head`), but for stdout alone: a socket's
    reader going away (a browser leaving a console page mid-answer, an API closing a
    connection) stays an error the code that wrote handles, never the end of the process.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            os._exit(EXIT_READER_GONE)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            os._exit(EXIT_READER_GONE)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def entry() -> None:
    """The ``digest`` console script: a process of its own, so it may own stdout and its exit."""
    sys.stdout = cast(TextIO, _Stdout(sys.stdout))
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
