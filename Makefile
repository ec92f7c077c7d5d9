# Two entry points, both from a fresh clone with only Python 3.11+:
#   make run    install the runtime only, then run this week's digest (embedded Valkey, offline)
#   make test   install the runtime and the test tools, then ruff, mypy and every test
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: screenshots bench-console
.PHONY: run test test-fast mutants mutmut coverage lint runtime install bench bench-throughput bench-timers bench-latency bench-limits bench-cost bench-big-week chaos chaos-ci stop clean

# Installing prints nothing when it works (pip and setuptools are chatty even when quiet);
# when it fails, everything it printed, then one line saying so. `make run` needs the runtime
# alone; the test tools (ruff, mypy, pytest, Playwright: most of the venv) come with `install`.
define pip_install
	@log=$$(mktemp) && \
	if { $(1); } >"$$log" 2>&1; \
	then rm -f "$$log"; \
	else cat "$$log" >&2; rm -f "$$log"; \
	     echo "make: installing into $(VENV) failed (the output above says why)" >&2; exit 1; fi
	@touch $@
endef

$(BIN)/digest: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit("Python 3.11+ is required, found " + sys.version.split()[0]) if sys.version_info < (3, 11) else None'
	$(call pip_install,$(PYTHON) -m venv $(VENV) && $(BIN)/python -m pip install -e .)

$(VENV)/.dev-installed: $(BIN)/digest
	$(call pip_install,$(BIN)/python -m pip install -e '.[dev]')

runtime: $(BIN)/digest

install: $(VENV)/.dev-installed

run: runtime
	@$(BIN)/digest run $(RUN)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

# The suite mostly waits on real time (leases, heartbeats, workers starting), so three pytest
# processes share two cores well: about 6 minutes instead of 18. Each file's tests stay in
# one process, so a module's servers (a cluster's six, say) start once.
TEST_JOBS ?= 3
PARALLEL := -n $(TEST_JOBS) --dist loadfile
test: lint
	$(BIN)/pytest -q $(PARALLEL)
	$(BIN)/python -m tests.mutants

# The tests that start no process: the contract suite on both backends, in under a minute.
test-fast: install
	$(BIN)/pytest -q -m "not slow" $(PARALLEL)

# Lines of journal and tasks run by the whole suite, in every process it starts.
coverage: install
	rm -rf .coverage-data && mkdir .coverage-data
	$(BIN)/coverage run -m pytest -q; status=$$?; \
	$(BIN)/coverage combine -q && $(BIN)/coverage report; exit $$status

# Each mutant breaks one guard of the protocol; the fast tests must fail for every one.
mutants: install
	$(BIN)/python -m tests.mutants

# mutmut over the run protocol's modules, judged by the fast journal tests, from
# scratch; then the score of each module (docs/mutation.md). Minutes, not CI: not in make test.
# The tests share one Valkey of this target's own, started here and stopped after. The suite
# mostly waits on real time (leases, heartbeats), so 6 mutants at once use about one core.
MUTMUT_JOBS ?= 6
mutmut: install
	rm -rf mutants
	@state=$$(mktemp -d) && \
	url=$$($(BIN)/python -c 'import sys; from journal.contrib.embedded import embedded_url as u; print(u(sys.argv[1]))' "$$state") && \
	TEST_REDIS_URL=$$url $(BIN)/mutmut run --max-children $(MUTMUT_JOBS); status=$$?; \
	$(BIN)/python -c 'import sys; from journal.contrib.embedded import stop_embedded as s; s(sys.argv[1])' "$$state"; \
	rm -rf "$$state"; $(BIN)/python -m tests.mutmut_score; exit $$status

# The fault campaign (docs/development.md): a real deployment on loopback, a nemesis driven by
# SEED (random if unset, printed first), then the checker of the promise. DURATION in seconds.
chaos: install
	$(BIN)/python -m tests.chaos $(if $(SEED),--seed $(SEED)) $(if $(DURATION),--duration $(DURATION))

# Bounded (under 8 minutes on 2 cores): the regression seeds of tests/chaos/seeds.txt, then a
# few planted bugs that the campaign must catch. Any violation fails it: never retried.
chaos-ci: install
	$(BIN)/python -m tests.chaos.ci

bench: install
	$(BIN)/python -m bench.journal

# Runs per second through Celery: a no-op task, a hand-written fenced journal, journal.integrations.celery.
bench-throughput: install
	$(BIN)/python -m bench.throughput

# A whole digest run against the fake API answering each call after a second.
bench-latency: install
	$(BIN)/python -m bench.latency

# Digests against the fake API's enforced rate limits: pace against the floor, requests refused.
bench-limits: install
	$(BIN)/python -m bench.limits

# The same week synchronously and by Message Batches: cost at published prices, wall time.
bench-cost: install
	$(BIN)/python -m bench.cost

# A week of 5,000 items offline and through the fake API at its rate limit.
bench-big-week: install
	$(BIN)/python -m bench.big_week

# A million runs pending in the due index, two sweepers racing to claim the due ones.
bench-timers: install
	$(BIN)/python -m bench.timers

# The embedded Valkey outlives the commands that use it (that is the point); this stops it.
stop: runtime
	@$(BIN)/python -c 'from journal.contrib.embedded import stop_embedded; stop_embedded(".digest")'

clean: stop
	rm -rf $(VENV) .digest .mypy_cache .ruff_cache .pytest_cache .coverage-data mutants

# The console's runs page over 10,000 runs, every page by its cursor (docs/operations.md).
bench-console: install
	$(BIN)/python -m bench.console_runs

# The console's screenshots in docs/, taken by the browser tests of every page state and of a
# real worker's runs (approval, in flight, sent).
screenshots: install
	DIGEST_SCREENSHOTS=docs $(BIN)/pytest -q tests/tasks/ops/test_console_states_browser.py \
		tests/tasks/ops/test_console_browser.py
