"""Snakemake entry point of rule `calibration_table`: every machine's calibration point (slmserve.calibration)."""

import logging

from slmserve import calibration
from slmserve.io import atomic_write_text

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO, format="%(asctime)s %(message)s")
frame, reps = calibration.load(list(snakemake.input))  # each file read once
atomic_write_text(snakemake.output.csv, frame.write_csv())
atomic_write_text(snakemake.output.md, calibration.to_markdown(frame, reps))
logging.info("calibration: %d points of %d machines", frame.height, frame["machine"].n_unique())
