"""The model API, so "model" means one thing: the client, its prompts, batches, limits and price.

``client`` calls the Messages API (or answers offline) with the ``prompts``, ``batches`` the
Message Batches API; ``ratelimit`` keeps the calls inside the API's limits, ``budget`` inside
a run's dollars, and ``cost`` turns a call's usage into those dollars. Nothing here imports
the job: what the model is shown of an update is a protocol (``prompts.Update``).
"""
