"""Applications of the journal written against its public face alone.

They import ``journal``, its public modules and nothing of ``tasks``; an import contract in
``pyproject.toml`` keeps them so. If one of them needs a private name, the face lacks it.
"""
