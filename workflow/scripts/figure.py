"""Snakemake entry point of the `figure_<name>` rules: draw one figure of slmserve.layout.FIGURES."""

import logging

import polars as pl

from slmserve.figures import save
from slmserve.layout import FIGURES

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO, format="%(asctime)s %(message)s")
name = snakemake.rule.removeprefix("figure_")
summary = pl.read_parquet(snakemake.input.summary)
chart, caption = FIGURES[name].draw(summary)
save(chart, caption, snakemake.output[0].removesuffix(".png"))
logging.info("%s: %d rows plotted", name, summary.height)
