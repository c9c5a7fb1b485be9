# tercel: the two commands are `make serve` and `make test`; everything else hangs off them.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: serve test check unit bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/tercel serve --data-dir ./tercel-data

check: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

unit: $(STAMP)
	$(BIN)/pytest

test: check unit

bench: $(STAMP)
	bash bench/run

clean:
	rm -rf $(VENV) tercel-data .pytest_cache .mypy_cache .ruff_cache
