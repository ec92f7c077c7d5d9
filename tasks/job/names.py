"""The digest workflow's names, for the code that reads or acts on its runs without running one.

Importing the workflow brings its steps, the model client and the mailers; ``digest show``
needs only these strings.
"""

from __future__ import annotations

WORKFLOW = "digest"
"""The workflow's name: runs are ``digest:<run_id>`` in the journal and in listings."""

APPROVAL = "approval"
"""The signal an approval (or a rejection) is sent as: ``digest approve`` and the console."""
