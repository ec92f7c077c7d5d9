"""The Celery side: the app, its configuration and signal handlers, beat's dispatcher, metrics.

The metrics live here, with the worker that counts and serves them; the console and
``digest metrics`` read the same registries from above.
"""
