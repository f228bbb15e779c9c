PY ?= .venv/bin/python

.PHONY: setup test lint bench demo
setup:
	python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]'
test:
	$(PY) -m pytest
lint:
	.venv/bin/ruff check fanin tests bench scripts
bench:
	$(PY) bench/pipeline.py --quick
	$(PY) bench/core.py
demo:
	.venv/bin/fanin run --input fanin/examples/triage.jsonl --contracts fanin/examples/contracts.yaml --output out/demo --overwrite
