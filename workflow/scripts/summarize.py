"""Snakemake entry point: merge runs (requests + telemetry) into one summary parquet."""

import logging

from slmserve.analysis import summarize_runs, write_summary

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO, format="%(asctime)s %(message)s")
summary = summarize_runs(snakemake.input.runs)
write_summary(summary, snakemake.output[0], snakemake.config)
logging.info("%d runs summarized into %s", summary.height, snakemake.output[0])
