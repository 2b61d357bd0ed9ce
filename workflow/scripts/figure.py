"""Snakemake entry point: draw one figure from a summary parquet (slmserve.figures)."""

import logging

import polars as pl

from slmserve.figures import FIGURES, save

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO, format="%(asctime)s %(message)s")
name = snakemake.rule.removeprefix("figure_")
summary = pl.read_parquet(snakemake.input.summary)
chart, caption = FIGURES[name](summary)
save(chart, caption, snakemake.output[0].removesuffix(".png"))
logging.info("%s: %d rows plotted", name, summary.height)
