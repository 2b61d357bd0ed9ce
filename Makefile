# make demo : set up .venv (engine chosen for this machine) and run the smoke reproduction end to end
# make test : set up .venv and run the unit and integration tests (integration: the real vLLM engine)
# make replot: rebuild figures and tables from results/ without running any measurement

SHELL := /bin/bash
VENV  ?= .venv
PY    := $(VENV)/bin/python
SMK   := $(VENV)/bin/snakemake
CORES ?= 2

# Re-plot: REPLOT_ARGS="--configfile config/smoke.yaml" to re-plot the smoke results instead.
REPLOT_ARGS ?=

.PHONY: setup demo test lint dryrun replot report clean-smoke

setup:
	@envs/setup.sh

demo: setup
	$(SMK) demo --configfile config/smoke.yaml --cores $(CORES) --resources gpu=1
	@echo "demo: Figure 1 in smoke/paper_figures/, results in smoke/results/"

test: setup
	$(VENV)/bin/ruff check .
	$(PY) -m pytest $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check src tests workflow
	$(SMK) --lint

dryrun: setup
	$(SMK) all -n --cores 4 --resources gpu=4

replot: setup
	$(SMK) all --cores $(CORES) --config replot=True $(REPLOT_ARGS)
	$(SMK) all --cores $(CORES) --config replot=True $(REPLOT_ARGS) --report report.html
	@echo "replot: figures and tables rebuilt from the results, report in report.html; no measurement ran"

report: replot

clean-smoke:
	rm -rf smoke logs/smoke
