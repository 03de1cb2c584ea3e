# Two entry points for a new user:  `make demo`  and  `make test`.
# Each sets up everything it needs (Java/Maven if missing, the virtualenv, the Kafka jars) first.
PYTHON ?= python3
# `make demo PORT=19092 DATA_DIR=/tmp/kbroker-demo`: the embedded broker the demo starts, when 9092
# or the per-user data dir is taken (KBROKER_BOOTSTRAP=host:port uses a running broker instead).
# Set on make's command line only (`=`, not `?=`): a PORT in the environment is often another tool's.
PORT     = 9092
DATA_DIR =
PARALLEL = -n 3 --dist loadgroup --no-loadscope-reorder --max-worker-restart 0
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The demo's: the package alone (its dependencies, no extras); the tests' STAMP includes it.
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: demo demo-analytics demo-setup lint test test-spark-cluster test-long bench bench-quick prereqs setup clean

# Only what the demo needs: Java and Maven, the package without extras, Kafka's jars.
demo: demo-setup
	$(BIN)/kbroker demo --port $(PORT)$(if $(DATA_DIR), --data-dir $(DATA_DIR))

# The demo, then a sample workload under the Spark analytics job and a worker (docs/analytics.md):
# the worker and analytics extras on top of the demo's set-up.
demo-analytics: demo-setup
	$(BIN)/pip install --quiet -e '.[worker,analytics]'
	$(BIN)/kbroker demo --analytics --port $(PORT)$(if $(DATA_DIR), --data-dir $(DATA_DIR))

demo-setup: $(DEMO_STAMP)
	@scripts/prereqs.sh demo
	$(BIN)/kbroker broker fetch

# The static checks, in seconds once the virtualenv exists (no Java, no Maven, no broker): the
# format and the lint rules ([tool.ruff] in pyproject.toml), the layer contracts, the types.
# .pre-commit-config.yaml runs the same on a commit's files.
# The last step collects the tests (seconds, no broker): a broken import fails here, not 20 minutes in.
lint: $(STAMP)
	$(BIN)/ruff format --check kbroker tests scripts examples
	$(BIN)/ruff check kbroker tests scripts examples
	$(BIN)/lint-imports
	$(BIN)/mypy kbroker
	@out=$$($(BIN)/python -m pytest --collect-only -q 2>&1) || { echo "$$out" | tail -40; exit 1; }; echo "$$out" | grep -E "tests? collected"

# The static checks first (`make lint`, seconds), then the tests against a real broker
# (minutes); Toxiproxy is built once (about a minute) for the network-stall test.
# Three pytest processes, each with its own broker (tests/conftest.py groups and orders the files):
# about 18 minutes on 2 cores, 19 with two processes (their tests wait on Kafka's and Spark's
# timers a third of the time), 33 in one (`make test PARALLEL=`). A process that crashes
# (a test past its time-out) is not replaced: pytest-xdist 3.8's loadgroup scheduling can hand
# the replacement work that never completes and wait for it forever (pytest-xdist #1378; a CI
# run sat 80 minutes so), so the run ends there, failed, with the tracebacks in its output.
test: lint setup
	scripts/toxiproxy.sh >/dev/null  # the fault-injecting proxy of the network-stall test
	$(BIN)/pytest$(if $(PARALLEL), $(PARALLEL))

# The analytics job on a Spark standalone cluster (a master and two workers, pyspark's launcher),
# one of them killed mid-run: about 3 minutes, so not part of `make test` (its marker is
# deselected unless named; tests/conftest.py).
test-spark-cluster: setup
	$(BIN)/pytest -m spark_cluster tests/integration/test_analytics_cluster.py

# The long runs, minutes each, so not in `make test` (CI runs this after it): the Spark cluster
# above; on the three-node Kafka cluster a node killed under load, its transaction coordinator
# killed during commits, and the worker, routing and the analytics job with a node killed;
# routing between two clusters through kills and an outage longer than a lease; the delayed
# store's mover and the transport bridge through a broker restart; the runs marked `long` on
# the embedded broker (the analytics job killed and restarted through a broker restart, the
# activation bench, a reader loop through a broker restart, the dashboard's stale counts, the
# endpoint invariants over four processes, a message outliving the broker's retention, six
# workers sharing monitors, the readers through a network stall, kill -9 of a worker and of a
# competing transport instance, a worker through a broker outage, the embedded broker's stop and
# start: 30 s to 2 minutes each, kept out of `make test` for its 20-minute budget);
# `kbroker bench scale` at
# small sizes; the wheel a user installs, alone in a new virtualenv; and the compose stack under
# podman, its images built from Debian's packages (scripts/prereqs.sh long installs podman).
# About 14 minutes; the compose run takes 2 of them, 3 when it builds its images.
test-long: setup
	@scripts/prereqs.sh long
	$(BIN)/pytest -m "spark_cluster or kafka_cluster or bench_scale or wheel or compose or long" tests/integration/test_analytics_cluster.py \
		tests/integration/test_cluster.py tests/integration/test_routing_clusters.py \
		tests/integration/test_bench_scale.py tests/integration/test_transport_delayed.py \
		tests/integration/test_transport_bridge.py tests/integration/test_wheel.py \
		tests/integration/test_compose_stack.py tests/integration/test_analytics.py \
		tests/integration/test_bench_activation.py tests/integration/test_broker_restart.py \
		tests/integration/test_dashboard.py tests/integration/test_endpoint_invariants.py \
		tests/integration/test_reclaim.py tests/integration/test_worker_spread.py \
		tests/integration/test_network_stall.py tests/integration/test_worker.py \
		tests/integration/test_transport_competing.py tests/integration/test_worker_stays_up.py \
		tests/integration/test_embedded_broker.py tests/integration/test_group_holds.py

bench: setup
	$(BIN)/kbroker bench

# The regression guard, before merging a change on a hot path (docs/benchmarks.md): every scenario
# that fits, small and once; exits 1 when a row falls below its floor.
bench-quick: setup
	$(BIN)/kbroker bench --quick

setup: prereqs $(STAMP)
	$(BIN)/kbroker broker fetch

# Java 17+ and Maven run the embedded Kafka broker; install them from Debian's packages if absent.
prereqs:
	@scripts/prereqs.sh

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "kbroker needs Python 3.11+"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP) $(DEMO_STAMP)

# The tests' set-up already holds the demo's (a newer STAMP): nothing to install then.
$(DEMO_STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "kbroker needs Python 3.11+"'
	@if [ -f $(STAMP) ] && [ $(STAMP) -nt pyproject.toml ]; then touch $(DEMO_STAMP); else \
		$(PYTHON) -m venv $(VENV) && $(BIN)/pip install --quiet --upgrade pip && \
		$(BIN)/pip install --quiet -e . && touch $(DEMO_STAMP); fi

clean:
	rm -rf $(VENV) build *.egg-info

# The docs site (mkdocs.yml): docs/ and the API reference from the docstrings, into site/ (ignored
# by git); `.venv/bin/mkdocs serve` previews it. tests/unit/test_docs.py builds it the same way.
.PHONY: docs
docs: $(STAMP)
	$(BIN)/mkdocs build --strict
