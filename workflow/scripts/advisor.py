"""Snakemake entry point of rule `advisor`: the batching advisor's table and figure (slmserve.advisor)."""

import logging

import polars as pl

from slmserve import advisor, capacity
from slmserve.figures import save
from slmserve.io import atomic_write_text

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO, format="%(asctime)s %(message)s")
p, inp, out = snakemake.params, snakemake.input, snakemake.output
settings = advisor.Settings(**p.settings)
whole, budget = capacity.read_probes(list(inp.whole)), capacity.read_probes(list(inp.budget))
summary = pl.read_parquet(inp.summary)
configs = advisor.model_configs(p.models, [*p.planned, *summary["model"].drop_nulls().to_list()])
frame = advisor.advise(summary, configs, whole, budget, settings, p.planned)
atomic_write_text(out.csv, advisor.to_csv(frame))
atomic_write_text(out.md, advisor.to_markdown(frame))
chart, caption = advisor.figure(summary, frame, configs, whole, budget, settings)
save(chart, caption, out.figure[0].removesuffix(".png"))
logging.info("advisor: %d models, chosen batches %s", frame.height, frame.select("model", "chosen_batch").rows())
