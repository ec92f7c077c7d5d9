"""The model API, so "model" means one thing: the client, its batches, its limits and its price.

``client`` calls the Messages API (or answers offline), ``batches`` the Message Batches API;
``ratelimit`` keeps the calls inside the API's limits, ``budget`` inside a run's dollars, and
``cost`` turns a call's usage into those dollars.
"""
