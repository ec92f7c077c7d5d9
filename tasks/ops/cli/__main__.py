"""``python -m tasks.ops.cli``: the ``digest`` command, as its console script runs it."""

from tasks.ops.cli import entry

entry()
