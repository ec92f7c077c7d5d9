"""The job: this week's items selected, summarized, composed into one email, sent, marked seen.

``workflow`` reads top to bottom like the run itself; beside it, what the run reads (``items``,
``feeds``), which run holds which item (``claims``), the model calls and batches
(``summarize``), what the run drafts and reports (``report``), which weeks are due
(``weeks``), and the crash points the failure tests plant in it (``faults``).
"""
