"""``python -m examples.records``: the batch's command line."""

import sys

from examples.records.cli import main

sys.exit(main())
