"""Snakemake entry point of rule `summarize`: one summary row per run of an experiment; planned runs
without a result file (re-plotting an unfinished campaign) are kept as "not measured" rows."""

import logging

from slmserve import analysis, replication

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO, format="%(asctime)s %(message)s")
runs = list(snakemake.input.runs)
have = set(runs)
missing = [p for p in snakemake.params.planned if p not in have]
merge = replication.summarize_runs if snakemake.wildcards.experiment == "replication" else analysis.summarize_runs
summary = analysis.with_not_measured(merge(runs, snakemake.params.models), missing, snakemake.params.models)
analysis.write_summary(summary, snakemake.output[0], snakemake.config)
logging.info("%d runs summarized into %s", len(runs), snakemake.output[0])
for path in missing:
    logging.warning("not measured yet (no result file): %s", path)
