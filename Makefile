# tercel: the two commands are `make serve` and `make test`; everything else hangs off them.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
BASE := $(VENV)/.installed-base
STAMP := $(VENV)/.installed
NATIVE := $(VENV)/.native
SOURCES := $(shell find src/tercel -name '*.py')

.PHONY: serve test check unit unit-pure native bench clean example soak fuzz

# The server alone: what `make serve` needs.
$(BASE): pyproject.toml
	@echo "make: setting up $(VENV) (pip install -e .)"
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@$(BIN)/pip install -q --upgrade pip "setuptools>=77"
	@TERCEL_NATIVE=0 $(BIN)/pip install -q -e . "mypy>=1.20"
	@touch $(BASE)

# The hot path compiled by mypyc from the same sources (setup.py lists the modules): about 45 s
# of CPU (mypyc, then one large C file), 1.5-2.5 minutes of wall time on a busy 2-core machine,
# with a progress line every 15 s; redone whenever a source changes. TERCEL_NATIVE=0 (or a failed build) leaves
# pure Python, which works the same, slower (docs/architecture.md, "Native modules"). The build
# may reuse unchanged objects from build/ with their old times: the touch marks them as current.
$(NATIVE): $(BASE) setup.py $(SOURCES)
	@find src -name '*.so' -delete
	@if [ "$${TERCEL_NATIVE:-1}" = 1 ]; then \
		echo "make: compiling the request path with mypyc (1.5-2.5 min; TERCEL_NATIVE=0 skips it)"; \
		TERCEL_NATIVE=1 $(BIN)/python setup.py -q build_ext --inplace >/dev/null \
		&& find src -name '*.so' -exec touch {} + \
		|| { echo "make: the mypyc build failed; tercel runs as pure Python" >&2; \
		     find src -name '*.so' -delete; }; \
	fi
	@touch $(NATIVE)

native: $(NATIVE)

# Everything the suite needs: test tools, pyspark + pyarrow, a Java runtime for Spark, and a
# headless Chromium with its WebDriver for the dashboard's browser test.
$(STAMP): $(BASE)
	TERCEL_NATIVE=0 $(BIN)/pip install -q -e '.[test,spark]'
	command -v java >/dev/null || { apt-get update && apt-get install -y openjdk-17-jre-headless; }
	{ command -v chromium && command -v chromedriver; } >/dev/null \
		|| { apt-get update && apt-get install -y chromium chromium-driver; }
	touch $(STAMP)

# Options for `tercel serve` in ARGS, e.g. make serve ARGS="--beanstalk-port 11300"; the server
# logs a "ready:" line with its addresses, the dashboard's URL and a first command to try.
ARGS ?=
serve: $(NATIVE)
	@$(BIN)/tercel serve --data-dir ./tercel-data $(ARGS)

check: $(STAMP)
	$(BIN)/ruff check setup.py src tests bench examples
	$(BIN)/ruff format --check setup.py src tests bench examples
	$(BIN)/mypy
	$(BIN)/lint-imports

unit: $(STAMP) $(NATIVE)
	$(BIN)/pytest

# The same tests (Spark aside) over a copy of the sources without the compiled modules.
unit-pure: $(STAMP)
	rm -rf build/pure && mkdir -p build/pure && cp -r src/tercel build/pure/
	find build/pure -name '*.so' -delete
	PYTHONPATH=build/pure $(BIN)/pytest -q -p no:cacheprovider --ignore=tests/spark

test: check unit unit-pure

bench: $(STAMP) $(NATIVE)
	bash bench/run

# Reliability runs, bounded, not part of `make test` (docs/reliability.md): kill -9 under load
# with every item accounted for (then again out of descriptors: --emfile, half as long);
# random and mutated requests against a real server.
SOAK_SECONDS ?= 120
FUZZ_SECONDS ?= 120
soak: $(STAMP) $(NATIVE)
	$(BIN)/python bench/soak.py --seconds $(SOAK_SECONDS)
	$(BIN)/python bench/soak.py --emfile --seconds $$(( $(SOAK_SECONDS) / 2 ))

fuzz: $(STAMP) $(NATIVE)
	TERCEL_FUZZ_EXAMPLES=3000 $(BIN)/pytest -q -p no:cacheprovider tests/protocol -k Fuzz
	$(BIN)/python bench/fuzz.py --seconds $(FUZZ_SECONDS)

example: $(STAMP)
	SPARK_LOCAL_IP=127.0.0.1 $(BIN)/python examples/pipeline.py

clean:
	rm -rf $(VENV) tercel-data .pytest_cache .mypy_cache .ruff_cache build
	find src -name '*.so' -delete
