"""The job: this week's items selected, summarized, composed into one email, sent, marked seen.

``workflow`` reads top to bottom like the run itself; beside it, what the run reads (``items``,
``feeds``), asks the model (``prompts``), claims against other runs (``claims``), and the crash
points the failure tests plant in it (``faults``).
"""
