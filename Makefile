# The two commands of the README: `make run` and `make test`. Both set everything up from a fresh clone.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: install run replay test test-busy test-fast bench bench-quick clean

install: $(STAMP)

$(STAMP): pyproject.toml scripts/build_horovod.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test,train]'
	scripts/build_horovod.sh $(BIN)/python
	rm -f $(VENV)/.installed-* && touch $@

# The main job: a neural architecture search trained elastically on the embedded local cluster.
run: install
	$(BIN)/pilotfill run workflows/nas_campaign.py

# What a site admin runs first: replay a week of Summit's idle nodes (bundled excerpt).
replay: install
	$(BIN)/pilotfill replay --plot runs/replay-summit-64.png

# Every tier: unit, local and site (tests/conftest.py), in three pytest-xdist workers: the site tests (a real Slurm,
# OpenPBS, tmux: one batch system at a time) all in one of them, first; the other tiers spread over the rest.
test: install
	$(BIN)/python -m pytest -q -n 3 --dist loadgroup

# The whole suite beside two busy loops, as on a site's busy login node (no test may need an idle machine).
test-busy: install
	scripts/beside_busy_loops.sh 2 -- $(BIN)/python -m pytest -q -n 3 --dist loadgroup

# The in-process tests a change to the allocator or the controller's decisions needs first (under a minute).
test-fast: install
	$(BIN)/python -m pytest -q --tier unit -m "not slow"

# Every benchmark, what each printed written to docs/benchmarks.md with the commit, machine and date (an hour or more).
bench: install
	$(BIN)/python benchmarks/report.py

bench-quick: install
	$(BIN)/python benchmarks/report.py --quick

clean:
	rm -rf $(VENV) runs .pytest_cache
