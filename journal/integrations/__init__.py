"""Integrations with the frameworks that deliver runs."""
