"""Snakemake entry point of rule `table1`: maximum batch size per model (paper, Table 1)."""

import logging

from slmserve import capacity, figures
from slmserve.io import atomic_write_text

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO, format="%(asctime)s %(message)s")
p = snakemake.params
inputs = snakemake.input
frame = capacity.table1_frame(list(inputs.whole), list(inputs.budget), p.models, p.budget_gb, p.workload, p.planned)
atomic_write_text(snakemake.output.csv, figures.table1_csv(frame))
atomic_write_text(snakemake.output.md, figures.table1_markdown(frame, capacity.RULE_NOTE.format(**p.workload)))
logging.info("Table 1: %d models", frame.height)
