"""One dispatch of beat's weekly dispatcher at the campaign's simulated time, in a process.

``python -m tests.chaos.dispatcher NOW [--stall]``: the project's own ``dispatch_due``, with
the campaign's clock instead of the wall clock (the campaign's weeks last seconds), publishing
as beat's ``dispatch_weekly`` does (task id ``digest-<week>``). ``--stall`` freezes the process
(SIGSTOP) right after it claimed a week and before it publishes: the moment a dispatcher that
another one races (or a paused container) holds a claim nobody can prove dead.
"""

from __future__ import annotations

import argparse
import os
import signal
from datetime import datetime

from tasks.runtime import process_runtime
from tasks.worker import dispatch
from tasks.worker.app import digest


def main() -> None:
    """Dispatch what is due at NOW, print the weeks published."""
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.dispatcher")
    parser.add_argument("now", help="the simulated time, ISO 8601 with its offset")
    parser.add_argument("--stall", action="store_true", help="SIGSTOP itself before publishing")
    args = parser.parse_args()
    if args.stall:
        # The module imported the hook by name: replaced there, where dispatch_due calls it.
        dispatch.before_publishing = lambda: os.kill(os.getpid(), signal.SIGSTOP)  # type: ignore[attr-defined]
    runtime = process_runtime()
    config = runtime.config
    published = dispatch.dispatch_due(
        runtime.client,
        runtime.keys,
        datetime.fromisoformat(args.now),
        zone=config.timezone,
        schedule=config.parsed_schedule(),
        catch_up_weeks=config.catch_up_weeks,
        enqueue=lambda run_id: digest.apply_async(args=[run_id], task_id=f"digest-{run_id}"),
    )
    print(" ".join(published), flush=True)


if __name__ == "__main__":
    main()
