# The worker and beat image: this checkout installed as a package, run by an unprivileged user.
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
# Only what the package needs: copying the whole context would bring .venv and .git along.
COPY pyproject.toml README.md ./
COPY journal ./journal
COPY tasks ./tasks
RUN pip install .
COPY data ./data

# The state directory holds the file outbox and beat's schedule file. A named volume mounted
# here starts with this directory's owner, so the unprivileged user can write to it.
RUN useradd --create-home --uid 10001 digest && mkdir /state && chown digest /state
ENV DIGEST_STATE_DIR=/state
USER digest
