"""Snakemake entry point of rule `summarize`: one summary row per run of an experiment."""

import logging

from slmserve import analysis, replication

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO, format="%(asctime)s %(message)s")
merge = replication.summarize_runs if snakemake.wildcards.experiment == "replication" else analysis.summarize_runs
summary = merge(list(snakemake.input.runs), snakemake.params.models)
analysis.write_summary(summary, snakemake.output[0], snakemake.config)
logging.info("%d runs summarized into %s", summary.height, snakemake.output[0])
