"""Snakemake entry point of rule `table1`: maximum batch size per model (paper, Table 1)."""

import logging

from slmserve import table1
from slmserve.io import atomic_write_text

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO, format="%(asctime)s %(message)s")
p = snakemake.params
frame = table1.frame(list(snakemake.input.whole), list(snakemake.input.budget), p.models, p.budget_gb, p.workload,
                     p.planned)  # fmt: skip
atomic_write_text(snakemake.output.csv, table1.to_csv(frame))
atomic_write_text(snakemake.output.md, table1.to_markdown(frame, table1.RULE_NOTE.format(**p.workload)))
logging.info("Table 1: %d models", frame.height)
