# tercel: the two commands are `make serve` and `make test`; everything else hangs off them.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
BASE := $(VENV)/.installed-base
STAMP := $(VENV)/.installed

.PHONY: serve test check unit bench clean example

# The server alone: what `make serve` needs.
$(BASE): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $(BASE)

# Everything the suite needs: test tools, pyspark + pyarrow, and a Java runtime for Spark.
$(STAMP): $(BASE)
	$(BIN)/pip install -q -e '.[test,spark]'
	command -v java >/dev/null || { apt-get update && apt-get install -y openjdk-17-jre-headless; }
	touch $(STAMP)

serve: $(BASE)
	$(BIN)/tercel serve --data-dir ./tercel-data

check: $(STAMP)
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples
	$(BIN)/mypy
	$(BIN)/lint-imports

unit: $(STAMP)
	$(BIN)/pytest

test: check unit

bench: $(STAMP)
	bash bench/run

example: $(STAMP)
	SPARK_LOCAL_IP=127.0.0.1 $(BIN)/python examples/pipeline.py

clean:
	rm -rf $(VENV) tercel-data .pytest_cache .mypy_cache .ruff_cache
