# make demo : set up .venv (engine chosen for this machine) and run the smoke reproduction end to end
# make test : set up .venv and run the unit and integration tests (integration: the real vLLM engine)
# make replot: rebuild figures and tables from results/ without running any measurement

SHELL := /bin/bash
VENV  ?= .venv
PY    := $(VENV)/bin/python
SMK   := $(VENV)/bin/snakemake
CORES ?= 2

# Re-plot every profile whose measured results are in the checkout (the paper's in results/, the quick
# profile's in results/quick/; probes count only where the profile draws Table 1: a100-36gb reuses Table 1's);
# REPLOT_CONFIGS=config/smoke.yaml for the smoke results instead. REPLOT_ARGS: more Snakemake options.
# Reports: report.html (paper), report-<profile>.html (the others).
REPLOT_CONFIGS ?= config/config.yaml config/quick.yaml config/quick-opt1.3b.yaml config/quick-opt1.3b-rerun.yaml config/quick-tp.yaml config/tp2.yaml config/a100-36gb.yaml config/h200.yaml config/h200-36gb.yaml
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
	@set -e; n=0; for cfg in $(REPLOT_CONFIGS); do \
	  read -r out prof t1 <<<"$$($(PY) -c 'import sys, yaml; c = yaml.safe_load(open(sys.argv[1])); t1 = ((c.get("experiments") or {}).get("table1") or {}).get("models", [1]); print(c.get("outdir", "results"), c.get("profile", "paper"), int(bool(t1)))' $$cfg)"; \
	  caps=; [ "$$t1" = 1 ] && caps="$$out/capacity/*.json"; \
	  if ! ls -d $$caps $$out/runs $$out/points $$out/replication 2>/dev/null | grep -q .; then \
	    echo "replot: $$cfg: no results in $$out/, skipped"; continue; fi; \
	  report=report.html; [ "$$prof" = paper ] || report=report-$$prof.html; \
	  $(SMK) all --cores $(CORES) --configfile $$cfg --config replot=True --forceall $(REPLOT_ARGS); \
	  $(SMK) all --cores $(CORES) --configfile $$cfg --config replot=True $(REPLOT_ARGS) --report $$report; \
	  echo "replot: $$cfg: figures and tables rebuilt from $$out/, report in $$report; no measurement ran"; n=$$((n+1)); \
	done; [ $$n -gt 0 ] || { echo "replot: no results of $(REPLOT_CONFIGS) in this checkout" >&2; exit 1; }

report: replot

clean-smoke:
	rm -rf smoke logs/smoke
