"""The Celery side: the app and its configuration, beat's dispatcher, the worker's metrics."""
