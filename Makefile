# Shale: `make demo` runs the main pipeline on embedded defaults; `make test` runs lint, types and every test.
# Both install what they need: a virtual environment in .venv, jars and binaries in .cache (git-ignored).

PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | sha1sum | cut -c1-12)
export SHALE_CACHE_DIR ?= $(CURDIR)/.cache
# The integration tests wait on real services far more than they compute: two workers, each test file whole on one
# (its module fixtures and its services with it), the longest files first (tests/conftest.py).
INTEGRATION_WORKERS ?= -n 2 --dist loadfile --no-loadscope-reorder
# The unit tests wait too (threads, sockets, subprocesses): two workers take 2:47 where one takes 4:53 (2026-12-03).
UNIT_WORKERS ?= -n 2

.PHONY: demo demo-env demo-deps bench-deps spark-classes test checks unit integration lint typecheck bench env deps venv browser fuse clean

# The demo needs the virtual environment, the Kafka broker's jars, Spark's Kafka connector, Apicurio Registry (its
# Avro topic) and DuckDB's environment (it reads the typed Iceberg table), nothing more: its bucket is a folder
# (file://), so no MinIO, no promtool, no `go install` and no Chromium. They are fetched side by side, beside the
# virtual environment.
demo: demo-env
	$(BIN)/shale demo

demo-env:
	@$(MAKE) --no-print-directory -j2 venv demo-deps

demo-deps:
	$(PY) src/shale/dev/fetch.py kafka spark apicurio duckdb

# Lint, types and the unit tests need only the virtual environment: they run while the services are fetched (the
# Go builds of MinIO and promtool take minutes on a cold machine), then the integration tests.
test:
	@$(MAKE) --no-print-directory -j3 checks deps browser fuse spark-classes
	$(BIN)/pytest $(INTEGRATION_WORKERS) tests/integration

checks: venv
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy
	$(BIN)/pytest $(UNIT_WORKERS) tests/unit

unit: venv
	$(BIN)/pytest $(UNIT_WORKERS) tests/unit

integration: env spark-classes
	$(BIN)/pytest $(INTEGRATION_WORKERS) tests/integration

lint: venv
	$(BIN)/ruff check src tests bench

typecheck: venv
	$(BIN)/mypy

bench: env bench-deps
	$(BIN)/python -m bench

# A class data sharing archive of the classes a Spark driver loads, in .cache: each Spark driver the integration
# tests start maps them instead of loading them from the jars (a session and its first job: 9.4 s -> 6.0 s).
spark-classes: venv
	$(BIN)/python -m shale.dev.spark_classes

# Only benchmarks need these: Spark's spark-avro jar (bench/typed_ingest.py, from_avro) and a Kafka Connect worker with
# the Apache Iceberg sink (bench/peers.py).
bench-deps:
	$(PY) src/shale/dev/fetch.py spark-avro iceberg-kafka-connect

# The virtual environment, the services and the browser are independent: fetch them side by side.
env:
	@$(MAKE) --no-print-directory -j3 venv deps browser fuse

venv: $(STAMP)

# uv installs the pinned set with parallel downloads: cold, 41 s where pip took 141 s on a quiet machine, and the
# same packages (2026-12-04); on a fresh machine's first `make test` this runs beside the Go builds.
$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -c constraints.txt uv
	$(BIN)/uv pip install -q --python $(BIN)/python -c constraints.txt -e '.[dev]'
	@rm -f $(VENV)/.installed-*
	@touch $@

# Kafka and Spark-connector jars from Maven Central, MinIO and promtool built with go install; each fetched once,
# all side by side.
deps:
	$(PY) src/shale/dev/fetch.py all

# Headless Chromium for the status page's browser test (Debian's package).
browser:
	@command -v chromium >/dev/null 2>&1 || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq --no-install-recommends chromium >/dev/null) || \
		(echo "could not install Debian's chromium package (needed by the status page test)" >&2; exit 1)

# libfuse 2 for the metastore power-loss test's filesystem (fusepy loads it; Debian's package).
fuse:
	@ldconfig -p | grep -q 'libfuse\.so\.2' || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq --no-install-recommends libfuse2 >/dev/null) || \
		(echo "could not install Debian's libfuse2 package (needed by the power-loss test)" >&2; exit 1)

clean:
	rm -rf $(VENV) .shale .pytest_cache .mypy_cache .ruff_cache test-output
